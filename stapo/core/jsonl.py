"""Every JSON-lines file of the project is read here, under one policy.

The policy (:func:`read_jsonl`, :func:`jsonl_records`), for every ``.jsonl`` the project reads (training
logs, per-sample scores, datasets, benchmark files):
    * lines end at ``\\n`` (or ``\\r\\n``); a blank line is skipped;
    * the file is read under a size cap (stapo.core.bounded: a device or FIFO is refused), each line under
      ``limits.MAX_LINE_BYTES`` and nested at most ``limits.MAX_DEPTH`` deep, checked before it is parsed;
    * every other line must be UTF-8 text holding one JSON object, else :class:`JsonlError` naming ``file:line``
      and why (invalid JSON, not UTF-8, not an object, too long, too deep, an integer of 100,000 digits);
    * except the torn tail of a log: with ``appended=True`` (a file written line by line as it grows:
      metrics.jsonl, diagnostics.jsonl, silenced_examples.jsonl) a last line without its newline that does not
      parse is a writer killed mid-line (or one still writing it): it is skipped, with a warning naming
      ``file:line``. A file written whole (atomically: per-sample scores, datasets, benchmarks) cannot be torn by a
      kill, so there the same line is damage, and an error.
Callers add their own checks of each row (a ``step``, a dataset's ``problem`` and ``answer``) and, where they need
their own exception type or words, re-raise a JsonlError with its ``where`` (``file:line``) and ``reason``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import NamedTuple

from stapo.core import bounded, limits
from stapo.core.errors import UserError

__all__ = ["JsonlError", "JsonlRecord", "jsonl_records", "read_jsonl"]

log = logging.getLogger(__name__)


class JsonlError(UserError, ValueError):
    """A line of a JSON-lines file that breaks the policy (module docstring): ``where`` = ``file:line``,
    ``reason`` = why, ``text`` = the line (as far as it decodes). A UserError (one line from the CLI) and a
    ValueError (what the readers raised before there was one policy)."""

    def __init__(self, where: str, reason: str, text: str = ""):
        super().__init__(f"{where}: {reason}")
        self.where, self.reason, self.text = where, reason, text


class JsonlRecord(NamedTuple):
    """One JSON object of a JSON-lines file: its 1-based line number, its text (as written) and its value."""

    line: int
    text: str
    row: dict


def jsonl_records(path: str | Path, *, appended: bool = False, data: bytes | None = None,
                  cap: int | None = None) -> list[JsonlRecord]:
    """Every JSON object of ``path`` with its line number and text, under the one policy (module docstring).

    ``appended``: the file is a log written line by line (its torn last line is skipped, with a warning);
    ``data``: the file's bytes where the caller has read them already (stapo.eval.scoring checks their digest first);
    ``cap``: the most bytes read (default: limits.MAX_LOG_BYTES for a log, else limits.MAX_DATA_BYTES).
    """
    if data is None:
        cap = cap or (limits.MAX_LOG_BYTES if appended else limits.MAX_DATA_BYTES)
        data = bounded.read_bytes(path, cap, "a log" if appended else "a JSON-lines file")
    lines = data.splitlines()
    torn_tail = bool(lines) and not data.endswith((b"\n", b"\r"))
    out = []
    for n, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        text, row, reason = _parse_line(raw)
        if reason is None:
            out.append(JsonlRecord(n, text, row))
        elif appended and torn_tail and n == len(lines) and not reason.startswith("not a JSON object"):
            log.warning("%s:%d: discarding a torn last line (%d chars: %r)", path, n, len(text), text[:80])
        else:
            raise JsonlError(f"{path}:{n}", reason, text)
    return out


def _parse_line(raw: bytes) -> tuple[str, object, str | None]:
    """(text, value, None) or (text, None, why the line is refused)."""
    if len(raw) > limits.MAX_LINE_BYTES:
        return raw[:80].decode("utf-8", errors="replace"), None, (f"a line of {len(raw):,} bytes; at most "
                                                                   f"{limits.MAX_LINE_BYTES:,} (stapo.core.limits)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        return raw.decode("utf-8", errors="replace"), None, f"not UTF-8 text (byte {err.start}: {err.reason})"
    try:
        row = bounded.parse_json(text, "")
    except bounded.BadFile as err:
        return text, None, str(err).removeprefix(": ")
    return text, row, None if isinstance(row, dict) else f"not a JSON object (a {type(row).__name__})"


def read_jsonl(path: str | Path, *, appended: bool = False, data: bytes | None = None,
               cap: int | None = None) -> list[dict]:
    """The JSON objects of ``path``, in file order (:func:`jsonl_records`; the policy: module docstring)."""
    return [r.row for r in jsonl_records(path, appended=appended, data=data, cap=cap)]
