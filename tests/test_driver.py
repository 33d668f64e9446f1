"""stapo.core.driver: a workflow job stops when the Snakemake process that started it is gone (here a stand-in parent
process; tests/test_workflow.py kills a real Snakemake driver during a training job)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from stapo.core import driver

CHILD = """
import sys, time
from stapo.core import driver
assert driver.watch() is not None
import subprocess
grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(grandchild.pid, flush=True)
time.sleep(600)
"""
PARENT = """
import os, subprocess, sys
from stapo.core import driver
env = {**os.environ, driver.ENV: driver.identity()}
child = subprocess.Popen([sys.executable, "-c", sys.argv[1]], env=env, stdout=subprocess.PIPE, text=True)
print(child.pid, child.stdout.readline().strip(), flush=True)
child.wait()
"""


def _gone(pid: int, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":  # exited, not yet reaped by init
                    return True
        except (ProcessLookupError, FileNotFoundError):
            return True
        time.sleep(0.2)
    return False


def test_a_job_and_its_children_stop_when_the_driver_is_killed():
    parent = subprocess.Popen([sys.executable, "-c", PARENT, CHILD], stdout=subprocess.PIPE, text=True)
    child, grandchild = map(int, parent.stdout.readline().split())
    assert not _gone(child, 2.0)  # the driver is alive: the job runs on
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    assert _gone(child, 10.0) and _gone(grandchild, 10.0)


def test_identity_tells_a_reused_pid_from_the_driver():
    me = driver.identity()
    assert driver.alive(me)
    pid, start, host = me.split(":")
    assert not driver.alive(f"{pid}:{int(start) + 1}:{host}")  # same PID, another start time: another process
    os.environ.pop(driver.ENV, None)
    assert driver.watch() is None  # not a workflow job: nothing to watch


def test_a_node_of_a_multi_node_job_does_not_watch_another_hosts_driver(monkeypatch):
    """srun hands the job step's STAPO_DRIVER to every node: only the driver's own host can see that PID."""
    pid, start, host = driver.identity().split(":")
    monkeypatch.setenv(driver.ENV, f"{pid}:{start}:{host}")
    thread = driver.watch()
    assert thread is not None and thread.is_alive()  # this host's live driver: watched (daemon thread)
    monkeypatch.setenv(driver.ENV, f"{pid}:{start}:not-{host}")
    assert driver.watch() is None
