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


# ----------------------------------------------------------------------- no write through a symbolic link


def _outside(tmp_path):
    """A canary file outside the directory written, and its content."""
    canary = tmp_path / "outside" / "v"
    canary.parent.mkdir()
    canary.write_text("keep\n")
    return canary


@pytest.mark.parametrize("writer", ["atomic_write", "append_line", "lock"])
def test_a_planted_link_is_refused_in_one_line_naming_it(tmp_path, writer):
    from stapo.core.atomic import UnsafeTarget, append_line
    from stapo.core.lock import hold

    canary, run = _outside(tmp_path), tmp_path / "run"
    run.mkdir()
    target = run / "metrics.jsonl"
    target.symlink_to(canary)
    write = {"atomic_write": lambda: atomic_write(target, "x", inside=run),
             "append_line": lambda: append_line(target, "{}", inside=run),
             "lock": lambda: hold(target, "run").__enter__()}[writer]
    with pytest.raises(UnsafeTarget, match="symbolic link") as err:
        write()
    assert str(target) in str(err.value) and "\n" not in str(err.value)
    assert canary.read_text() == "keep\n" and target.is_symlink()


def test_a_linked_directory_is_refused_when_it_leads_out(tmp_path):
    from stapo.core.atomic import UnsafeTarget

    canary, run = _outside(tmp_path), tmp_path / "run"
    run.mkdir()
    (run / "figures").symlink_to(canary.parent)
    with pytest.raises(UnsafeTarget, match="leads out of"):
        atomic_write(run / "figures" / "v", "x", inside=run)
    assert canary.read_text() == "keep\n" and sorted(p.name for p in canary.parent.iterdir()) == ["v"]
    atomic_write(run / "sub" / "ok.txt", "y", inside=run)  # a real subdirectory is inside


def test_append_refuses_a_link_planted_after_the_check(tmp_path, monkeypatch):
    """The kernel refuses it too (O_NOFOLLOW): guard's check and the open are not atomic."""
    from stapo.core import atomic

    canary, log = _outside(tmp_path), tmp_path / "log.jsonl"
    monkeypatch.setattr(atomic, "guard", lambda path, inside=None: log.symlink_to(canary) or log)
    with pytest.raises(atomic.UnsafeTarget):
        atomic.append_line(log, "{}")
    assert canary.read_text() == "keep\n"


def test_in_use_names_a_live_holder_and_nothing_else(tmp_path):
    import subprocess
    import sys

    from stapo.core.lock import in_use

    lock = tmp_path / "stapo.lock"
    assert in_use(lock) is None  # no file: nobody
    proc = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom stapo.core.lock import hold\n"
                             f"with hold({str(lock)!r}, 'x'):\n    print('held', flush=True)\n    time.sleep(60)\n"],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        assert f"PID {proc.pid}" in in_use(lock)
    finally:
        proc.kill()
        proc.wait()
    assert in_use(lock) is None  # the file stays, the lock went with its holder
