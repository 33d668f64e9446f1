"""A workflow job dies with the Snakemake process that started it.

A ``stapo train`` started by Snakemake runs under ``bash -c``; when the driver is killed (``kill -9``, an OOM kill,
a lost terminal) nothing signals that shell or its child, so the training went on orphaned: the rerun then refused
("run directory ... is in use by PID ...") and its log redirection had already truncated the orphan's log.

The workflow (workflow/rules/common.smk) exports ``STAPO_DRIVER=<pid>:<start time>:<host>`` of the Snakemake process
that runs the jobs (the local driver, or the SLURM job step, which parses the Snakefile again and so exports its own).
A process on another host (the other nodes of a multi-node job, started by srun, which SLURM itself stops with the
job) does not watch: that PID is not its to see.
:func:`watch` starts a daemon thread that polls that process; once it is gone (or its PID was reused: the start
time differs) the job terminates its own descendants and itself with SIGKILL. Checkpoints and outputs are written
atomically, so nothing half-written is left; the run lock goes with the process.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path

__all__ = ["ENV", "identity", "watch", "alive"]

ENV = "STAPO_DRIVER"
POLL_S = 1.0


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/<pid>/stat field 22); None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]  # after the command name, which may hold spaces


def identity(pid: int | None = None) -> str:
    """``<pid>:<start time>:<host>`` of a process on this host (default this one): what ``STAPO_DRIVER`` holds."""
    pid = os.getpid() if pid is None else pid
    return f"{pid}:{_start_time(pid)}:{socket.gethostname()}"


def alive(driver: str) -> bool:
    """Whether the process ``driver`` (``<pid>:<start time>[:<host>]``, on this host) still runs (a reused PID does
    not count)."""
    pid, start = driver.split(":")[:2]
    return _start_time(int(pid)) == start


def _descendants(pid: int) -> list[int]:
    """The PIDs below ``pid`` (children first level by level), from /proc."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            parents.setdefault(ppid, []).append(int(entry.name))
    out, level = [], [pid]
    while level:
        level = [c for p in level for c in parents.get(p, [])]
        out += level
    return out


def _stop(driver: str) -> None:
    print(f"stapo: the Snakemake process that started this job ({driver}) is gone: stopping", file=sys.stderr,
          flush=True)
    # SIGKILL, not SIGTERM: a trainer answers SIGTERM by finishing its rollout step (stapo.train.continuation),
    # which nobody waits for here; checkpoints and outputs are written atomically, the lock goes with the process.
    for pid in _descendants(os.getpid()):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    os.kill(os.getpid(), signal.SIGKILL)


def watch() -> threading.Thread | None:
    """Start the watchdog if ``STAPO_DRIVER`` names a driver (a job of the workflow); None otherwise. A malformed
    value, a driver on another host (a multi-node job's other nodes) or a driver already gone at start is ignored
    (a job run by hand with a stale environment)."""
    driver = os.environ.get(ENV, "")
    parts = driver.split(":")
    if len(parts) < 2 or not parts[0].isdigit() or parts[2:3] not in ([], [socket.gethostname()]) or not alive(driver):
        return None

    def poll():
        while alive(driver):
            time.sleep(POLL_S)
        _stop(driver)

    thread = threading.Thread(target=poll, name="stapo-driver-watch", daemon=True)
    thread.start()
    return thread
