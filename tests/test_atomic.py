"""stapo.core.atomic: outputs get the permissions an ordinary open() would give (not mkstemp's private 0600)."""

from __future__ import annotations

import os
import stat

import pytest

from stapo.core.atomic import atomic_dir, atomic_write


@pytest.mark.parametrize("umask, file_mode, dir_mode", [(0o022, 0o644, 0o755), (0o077, 0o600, 0o700)])
def test_outputs_follow_the_umask(tmp_path, umask, file_mode, dir_mode):
    old = os.umask(umask)
    try:
        path = atomic_write(tmp_path / "a.txt", "x")
        with atomic_dir(tmp_path / "d") as tmp:
            (tmp / "f").write_text("y")
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == file_mode
    assert stat.S_IMODE((tmp_path / "d").stat().st_mode) == dir_mode
    assert path.read_text() == "x" and (tmp_path / "d" / "f").read_text() == "y"
