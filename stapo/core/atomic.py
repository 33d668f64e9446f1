"""Atomic outputs: a killed job leaves either the old file or the new one, never half of one.

Every file the harness writes goes through here (temporary file in the same directory + fsync + rename).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

__all__ = ["atomic_write", "atomic_write_json", "atomic_dir", "append_line", "check_creatable_dir"]


def _umask() -> int:
    """The process umask; read from /proc where possible (setting it to read it races with other threads)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _normal_mode(path: Path, directory: bool = False) -> None:
    """mkstemp/mkdtemp create 0600/0700 (private temporaries); the final output gets what open() would give."""
    os.chmod(path, (0o777 if directory else 0o666) & ~_umask())


def atomic_write(path: str | os.PathLike, data: str | bytes) -> Path:
    """Write ``data`` to ``path`` atomically (parents created)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        binary = isinstance(data, bytes)
        with os.fdopen(fd, "wb" if binary else "w", **({} if binary else {"encoding": "utf-8"})) as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        _normal_mode(Path(tmp))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_write_json(path: str | os.PathLike, obj, **kw) -> Path:
    text = json.dumps(obj, indent=kw.pop("indent", 2), sort_keys=kw.pop("sort_keys", False), **kw)
    return atomic_write(path, text + "\n")


def append_line(path: str | os.PathLike, line: str) -> None:
    """Append one line to a log (JSON lines) and fsync it: a kill loses at most the line being written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


@contextmanager
def atomic_dir(path: str | os.PathLike):
    """Yield a temporary sibling directory; on success it replaces ``path`` (which must not be half-written)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        yield tmp
        _normal_mode(tmp, directory=True)
        if path.exists():
            shutil.rmtree(path)
        os.replace(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def check_creatable_dir(path: str | os.PathLike) -> None:
    """OSError (one line naming the culprit) unless ``path`` is, or can be created as, a writable directory.
    Creates nothing."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise NotADirectoryError(f"{path} exists and is not a directory")
    parent = path
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise NotADirectoryError(f"cannot create {path}: {parent} is a file, not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise PermissionError(f"cannot create or write {path}: {parent} is not writable")
