"""Every JSON-lines file of the project is read here, under one policy.

The policy (:func:`read_jsonl`, :func:`jsonl_records`), for every ``.jsonl`` the project reads (training
logs, per-sample scores, datasets, benchmark files):
    * lines end at ``\\n`` (or ``\\r\\n``); a blank line is skipped;
    * every other line must be UTF-8 text holding one JSON object, else :class:`JsonlError` naming ``file:line``
      and why (invalid JSON, not UTF-8, not an object);
    * except the torn tail of a log: with ``appended=True`` (a file written line by line as it grows:
      metrics.jsonl, diagnostics.jsonl, silenced_examples.jsonl) a last line without its newline that does not
      parse is a writer killed mid-line (or one still writing it): it is skipped, with a warning naming
      ``file:line``. A file written whole (atomically: per-sample scores, datasets, benchmarks) cannot be torn by a
      kill, so there the same line is damage, and an error.
Callers add their own checks of each row (a ``step``, a dataset's ``problem`` and ``answer``) and, where they need
their own exception type or words, re-raise a JsonlError with its ``where`` (``file:line``) and ``reason``.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import NamedTuple

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


def jsonl_records(path: str | Path, *, appended: bool = False, data: bytes | None = None) -> list[JsonlRecord]:
    """Every JSON object of ``path`` with its line number and text, under the one policy (module docstring).

    ``appended``: the file is a log written line by line (its torn last line is skipped, with a warning);
    ``data``: the file's bytes where the caller has read them already (stapo.eval.scoring checks their digest first).
    """
    data = Path(path).read_bytes() if data is None else data
    lines = data.splitlines()
    torn_tail = bool(lines) and not data.endswith((b"\n", b"\r"))
    out = []
    for n, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            text = raw.decode("utf-8")
            row = json.loads(text)
            reason = None if isinstance(row, dict) else f"not a JSON object (a {type(row).__name__})"
        except UnicodeDecodeError as err:
            text, reason = raw.decode("utf-8", errors="replace"), f"not UTF-8 text (byte {err.start}: {err.reason})"
        except json.JSONDecodeError as err:
            reason = f"invalid JSON ({err.msg})"
        if reason is None:
            out.append(JsonlRecord(n, text, row))
        elif appended and torn_tail and n == len(lines) and not reason.startswith("not a JSON object"):
            log.warning("%s:%d: discarding a torn last line (%d chars: %r)", path, n, len(text), text[:80])
        else:
            raise JsonlError(f"{path}:{n}", reason, text)
    return out


def read_jsonl(path: str | Path, *, appended: bool = False, data: bytes | None = None) -> list[dict]:
    """The JSON objects of ``path``, in file order (:func:`jsonl_records`; the policy: module docstring)."""
    return [r.row for r in jsonl_records(path, appended=appended, data=data)]
