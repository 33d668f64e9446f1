"""One writer per output: an OS lock on a file beside what a command writes (a run directory, an evaluation).

``hold(path)`` takes ``flock(LOCK_EX | LOCK_NB)`` on ``path`` (created if needed) and writes the holder's PID, host
and start time into it (never through a symbolic link: stapo.core.atomic). The kernel releases the lock when the
holding process exits, however it exits (``kill -9`` included), so a lock is never stale: the file may stay behind,
but only a living process can hold it. A second process refuses at once with one line naming the holder
(:class:`Busy`). The file is never deleted (a process waiting to delete it would race one that has just opened it)
and never renamed while held.

``hold`` is re-entrant within a process (the ``stapo`` CLI takes a run's lock before the trainer loads, and
``stapo.train.trainer.train`` takes it again when called as a library). On NFS, Linux emulates flock with POSIX locks,
which still exclude across hosts.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from contextlib import contextmanager
from pathlib import Path

from stapo.core import bounded
from stapo.core.atomic import open_new_or_existing
from stapo.core.errors import UserError

__all__ = ["Busy", "hold", "holder", "in_use", "run_lock", "output_lock", "RUN_LOCK"]

RUN_LOCK = "stapo.lock"  # DIR/stapo.lock: the lock of a run directory (stapo train)

_HELD: dict[Path, int] = {}  # lock files this process holds -> nesting depth


class Busy(UserError):
    """Another living process holds the lock; the message names it (PID, host, since when) and the lock file."""


def holder(path: str | os.PathLike) -> dict:
    """What the lock file says about its holder ({} when unreadable or not yet written)."""
    try:
        info = json.loads(bounded.read_text(path, 4096, "a lock file") or "{}")
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


def in_use(path: str | os.PathLike) -> str | None:
    """Who holds the lock ``path`` now ("PID 12 on host (since ...)"), or None when no living process does (or there
    is no lock file). Creates nothing; a reader (stapo report) asks it before it trusts what a writer writes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        info = holder(path)
        return (f"PID {info.get('pid', '?')} on {info.get('host', '?')} (since {info.get('since', '?')})"
                if info else "another process")
    finally:
        os.close(fd)
    return None


@contextmanager
def hold(path: str | os.PathLike, what: str):
    """Hold the lock ``path`` while the block runs; :class:`Busy` at once if another process holds it.

    ``what`` names the thing guarded in the refusal ("run directory runs/m/stapo").
    """
    path = Path(path).absolute()
    if path in _HELD:  # this process holds it already
        _HELD[path] += 1
        try:
            yield path
        finally:
            _HELD[path] -= 1
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = open_new_or_existing(path, os.O_RDWR)  # never through a planted symbolic link
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            info = holder(path)
            who = (f"PID {info.get('pid', '?')} on {info.get('host', '?')} (since {info.get('since', '?')})"
                   if info else "another process")
            raise Busy(f"{what} is in use by {who}: one writer at a time; wait for it to finish or stop it "
                       f"(lock {path})") from None
        stamp = {"pid": os.getpid(), "host": socket.gethostname(),
                 "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(stamp) + "\n").encode(), 0)
        _HELD[path] = 1
        try:
            yield path
        finally:
            del _HELD[path]
    finally:
        os.close(fd)  # releases the lock


def run_lock(out: str | os.PathLike):
    """The lock of the run directory ``out`` (``out/stapo.lock``): one ``stapo train`` at a time (rank 0 takes it)."""
    return hold(Path(out) / RUN_LOCK, f"run directory {out}")


def output_lock(out: str | os.PathLike):
    """The lock of an evaluation output ``FILE.jsonl`` (``FILE.jsonl.lock``, beside its cache and summary)."""
    out = Path(out)
    return hold(out.with_name(out.name + ".lock"), f"evaluation output {out}")
