"""Results built once per test run and read by many tests (the ``shared_dir`` fixture of tests/conftest.py)."""

from __future__ import annotations

import shutil
from pathlib import Path


def build_once(shared_dir: Path, name: str, build) -> Path:
    """``build(path)`` once per test run, by whichever worker asks first; the others wait for it and reuse the
    result. Readers must not change what they get."""
    from filelock import FileLock

    target = shared_dir / name
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(f"{target}.lock"):
        if not (target.parent / f"{name}.built").exists():
            shutil.rmtree(target, ignore_errors=True)  # a build interrupted earlier in this run
            build(target)
            (target.parent / f"{name}.built").touch()
    return target
