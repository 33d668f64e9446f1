"""Bounded readers: every file the harness reads (studies, summaries, manifests, logs, per-sample files, benchmark
and training data) is read here, under a size cap from stapo.core.limits, and parsed only after its nesting depth
is checked.

    * :func:`read_bytes` opens without blocking and refuses anything but a regular file (a FIFO would block the
      reader forever, /dev/zero would fill its memory), then reads at most ``cap + 1`` bytes: a larger file is
      refused in one line naming it, the cap and why the cap is what it is;
    * :func:`check_depth` counts the nesting of JSON (or YAML flow) brackets before a parser sees them: json and
      PyYAML recurse once per level, and a 2 KB ``x: [[[...]]]`` once ended in a 3,000-line RecursionError;
    * :func:`load_json` and :func:`load_yaml` read, check and parse; YAML also refuses a key given twice in one
      mapping (PyYAML keeps the last silently) and block nesting deeper than the cap (counted from its events).

Errors are :class:`BadFile` (a UserError: one line from the CLI; a ValueError for readers that caught those).
A missing file stays FileNotFoundError, for callers that say what a missing file means.
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path

import yaml

from stapo.core import limits
from stapo.core.errors import UserError

__all__ = ["BadFile", "read_bytes", "read_text", "check_depth", "load_json", "parse_json", "load_yaml",
           "parse_yaml"]

_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"))
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.S)  # a JSON string (its brackets are not nesting)
_BRACKET = re.compile(r"[\[\]{}]")


class BadFile(UserError, ValueError):
    """A file a reader refuses (not a regular file, over its size cap, nested too deep, not UTF-8, duplicate key);
    the message is one line naming it."""


def _cap_text(cap: int) -> str:
    return f"{cap:,} bytes" if cap < 1024**2 else f"{cap / 1024**2:,.0f} MiB"


def read_bytes(path: str | os.PathLike, cap: int, what: str = "the file") -> bytes:
    """The bytes of the regular file ``path``, at most ``cap`` of them (:class:`BadFile` beyond, naming ``what``)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except IsADirectoryError:
        raise BadFile(f"{path}: is a directory, not a file ({what})") from None
    info = os.fstat(fd)
    kind = next((name for test, name in _KINDS if test(info.st_mode)), None)
    if kind or info.st_size > cap:  # a regular file's size is known before a byte is read
        os.close(fd)
        raise BadFile(f"{path}: is {kind}, not a regular file ({what})" if kind else _too_large(path, cap, what))
    os.set_blocking(fd, True)
    with os.fdopen(fd, "rb", buffering=0) as f:
        data = f.read(cap + 1) if cap < (1 << 62) else f.read()
    if len(data) > cap:  # it grew since
        raise BadFile(_too_large(path, cap, what))
    return data


def _too_large(path, cap: int, what: str) -> str:
    return f"{path}: larger than {_cap_text(cap)}, the cap on {what} (stapo.core.limits)"


def read_text(path: str | os.PathLike, cap: int, what: str = "the file") -> str:
    """:func:`read_bytes` decoded as UTF-8 (:class:`BadFile` naming the byte that is not)."""
    data = read_bytes(path, cap, what)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise BadFile(f"{path}: not UTF-8 text (byte {err.start}: {err.reason})") from None


def check_depth(text: str | bytes, where: str, depth: int | None = None) -> None:
    """:class:`BadFile` naming ``where`` if the brackets of ``text`` (JSON, or YAML flow style) nest deeper than
    ``depth`` (default limits.MAX_DEPTH). Costs a count of two characters unless the text has that many brackets."""
    cap = limits.MAX_DEPTH if depth is None else depth
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    if text.count("[") + text.count("{") <= cap:
        return
    level = 0
    for m in _BRACKET.finditer(_STRING.sub("", text)):
        level += 1 if m.group() in "[{" else -1
        if level > cap:
            raise BadFile(f"{where}: nested more than {cap} levels deep (stapo.core.limits.MAX_DEPTH)")


def parse_json(text: str | bytes, where: str):
    """``json.loads(text)`` after :func:`check_depth`; :class:`BadFile` naming ``where`` for anything it refuses
    (invalid JSON, an integer of more than MAX_DIGITS digits)."""
    check_depth(text, where)
    try:
        return json.loads(text)
    except RecursionError:
        raise BadFile(f"{where}: nested too deep to parse") from None
    except ValueError as err:  # JSONDecodeError, and int('9' * 10**5)'s digit limit
        why = err.msg if isinstance(err, json.JSONDecodeError) else str(err).split(";")[0][:160]
        raise BadFile(f"{where}: invalid JSON ({why})") from None


def load_json(path: str | os.PathLike, cap: int | None = None, what: str = "a JSON file"):
    """The JSON value of ``path`` (at most ``cap`` bytes, default limits.MAX_JSON_BYTES)."""
    return parse_json(read_text(path, limits.MAX_JSON_BYTES if cap is None else cap, what), str(path))


class _Loader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (merge keys ``<<`` may still override)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = (key_node.tag, key_node.value)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key_node.value!r} (a mapping "
                                                        "holds each key once)", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


_OPEN = (yaml.SequenceStartEvent, yaml.MappingStartEvent)
_CLOSE = (yaml.SequenceEndEvent, yaml.MappingEndEvent)


def _yaml_depth(text: str, where: str) -> None:
    """Block and flow nesting from the parser's events (iterative; the composer that follows recurses)."""
    level = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        level += isinstance(event, _OPEN) - isinstance(event, _CLOSE)
        if level > limits.MAX_DEPTH:
            mark = event.start_mark
            raise BadFile(f"{where}:{mark.line + 1}: nested more than {limits.MAX_DEPTH} levels deep "
                          "(stapo.core.limits.MAX_DEPTH)")


def parse_yaml(text: str, where: str):
    """The YAML value of ``text``: nesting checked first, duplicate keys refused; :class:`BadFile` naming
    ``where`` (and line:column) for a syntax error."""
    try:
        _yaml_depth(text, where)
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        at = f"{where}:{mark.line + 1}:{mark.column + 1}" if mark else where
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        syntax = "" if isinstance(err, yaml.constructor.ConstructorError) else "YAML syntax error: "
        raise BadFile(f"{at}: {syntax}{problem}") from None
    except RecursionError:
        raise BadFile(f"{where}: nested too deep to parse") from None


def load_yaml(path: str | os.PathLike, cap: int | None = None, what: str = "a YAML file"):
    """The YAML value of ``path`` (at most ``cap`` bytes, default limits.MAX_YAML_BYTES), via :func:`parse_yaml`."""
    cap = limits.MAX_YAML_BYTES if cap is None else cap
    return parse_yaml(read_text(Path(path), cap, what), str(path))
