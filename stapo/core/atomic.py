"""Atomic outputs: a killed job leaves either the old file or the new one, never half of one; and no output is
written through a symbolic link or outside the directory it belongs to.

Every file the harness writes goes through here (temporary file in the same directory + fsync + rename; a log line
appended with ``O_NOFOLLOW``). :func:`guard` refuses, in one line naming it (:class:`UnsafeTarget`), a target that
is a symbolic link (planted in a group-writable run directory, it would redirect the write to any file the job can
write) and, given ``inside``, a target whose real directory is not inside ``inside``'s (a linked parent directory).
Temporary files are created with ``O_EXCL`` (mkstemp) and renamed over the target: a rename replaces a link planted
after the check, it never writes through one.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

from stapo.core.errors import UserError

__all__ = ["UnsafeTarget", "guard", "atomic_write", "atomic_write_json", "atomic_dir", "append_line",
           "open_new_or_existing", "refuse_links", "check_creatable_dir"]


class UnsafeTarget(UserError):
    """An output path that is a symbolic link or leads out of its directory; the message names it."""


def guard(path: str | os.PathLike, inside: str | os.PathLike | None = None) -> Path:
    """``path``, unless it is a symbolic link or (``inside`` given) its directory, resolved, is not ``inside`` or
    below it, resolved: :class:`UnsafeTarget` naming it. The parent must exist."""
    path = Path(path)
    if path.is_symlink():
        raise UnsafeTarget(f"{path} is a symbolic link (to {os.readlink(path)}); refusing to write through it: "
                           "remove it")
    if inside is not None:
        root, real = Path(inside).resolve(), path.parent.resolve()
        if real != root and root not in real.parents:
            raise UnsafeTarget(f"{path} leads out of {inside} (its directory is really {real}); refusing to write "
                               "there: a directory on the way is a symbolic link")
    return path


def refuse_links(paths) -> None:
    """:class:`UnsafeTarget` naming the first of ``paths`` that is a symbolic link: what a command is about to
    write, checked before it starts (a training run's files before the model loads)."""
    for path in paths:
        guard(path)


def open_new_or_existing(path: str | os.PathLike, flags: int, inside: str | os.PathLike | None = None) -> int:
    """``os.open(path, flags | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0o666)`` after :func:`guard`; a link planted
    between the two is refused by the kernel (ELOOP), also as :class:`UnsafeTarget`."""
    path = guard(path, inside)
    try:
        return os.open(path, flags | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise UnsafeTarget(f"{path} is a symbolic link; refusing to write through it: remove it") from None
        raise


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


def atomic_write(path: str | os.PathLike, data: str | bytes, inside: str | os.PathLike | None = None) -> Path:
    """Write ``data`` to ``path`` atomically (parents created; :func:`guard` with ``inside`` first)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    guard(path, inside)
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


def atomic_write_json(path: str | os.PathLike, obj, inside: str | os.PathLike | None = None, **kw) -> Path:
    text = json.dumps(obj, indent=kw.pop("indent", 2), sort_keys=kw.pop("sort_keys", False), **kw)
    return atomic_write(path, text + "\n", inside)


def append_line(path: str | os.PathLike, line: str, inside: str | os.PathLike | None = None) -> None:
    """Append one line to a log (JSON lines) and fsync it: a kill loses at most the line being written. Never
    through a symbolic link (:func:`open_new_or_existing`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = open_new_or_existing(path, os.O_WRONLY | os.O_APPEND, inside)
    with os.fdopen(fd, "a", encoding="utf-8") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


@contextmanager
def atomic_dir(path: str | os.PathLike):
    """Yield a temporary sibling directory; on success it replaces ``path`` (which must not be half-written)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    guard(path)
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
