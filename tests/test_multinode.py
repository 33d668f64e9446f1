"""Multi-node training without a cluster: the exact launch lines of stapo.core.launch, run on one host.

Two "machines" are two `accelerate launch --num_machines 2` processes (machine ranks 0 and 1, one rank each) that
meet at 127.0.0.1 (torchrun's static rendezvous, gloo on CPU). They are started by the multi-node launcher line the
workflow renders, with two stand-ins on PATH for what only a cluster has: ``srun`` (one task per "node", each with
its SLURM_NODEID, all killed when one fails: --kill-on-bad-exit) and ``scontrol show hostnames`` (127.0.0.1). The
line's ``-m stapo.cli`` is swapped for tests/helpers/fixed_rollouts.py, which registers the coin reward (a random
model earns no real one, and without advantages nothing trains). The 2 × 1 run must reach the weights of one
machine with two processes, and a run whose machine 1 is killed must resume to the same weights.
"""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
import yaml
from safetensors.torch import load_file

from stapo.core import launch

from stapo.train import rundir
from stapo.models import resolve_model

REPO = Path(__file__).resolve().parents[1]
HELPER = REPO / "tests" / "helpers" / "fixed_rollouts.py"
BIN = Path(sys.executable).parent

FAKE_SRUN = """#!{python}
# srun --nodes=N ... CMD: N local tasks of CMD, task i with SLURM_NODEID=i; one failing kills the others' whole
# process trees (slurmstepd kills a step's cgroup: torchrun's workers, in their own sessions, included)
import os, signal, subprocess, sys, time
import psutil

def kill_tree(pid, sig):
    try:
        procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for proc in procs:
        try:
            proc.send_signal(sig)
        except psutil.NoSuchProcess:
            pass

args, nodes = sys.argv[1:], 1
while args and args[0].startswith("--"):
    if args[0].startswith("--nodes="):
        nodes = int(args[0].split("=", 1)[1])
    args.pop(0)
tasks = [subprocess.Popen(args, env={{**os.environ, "SLURM_NODEID": str(i)}}, start_new_session=True)
         for i in range(nodes)]
for i, task in enumerate(tasks):
    open(os.path.join(os.environ["FAKE_SRUN_DIR"], f"node{{i}}.pid"), "w").write(str(task.pid))
rc, killed = 0, None
while any(t.poll() is None for t in tasks):
    failed = [t.returncode for t in tasks if t.returncode not in (None, 0)]
    if failed and not rc:
        rc, killed = (failed[0] if failed[0] > 0 else 128 - failed[0]), time.monotonic()
    if killed is not None:  # SIGTERM, then SIGKILL after 10 s (slurm.conf's KillWait)
        sig = signal.SIGTERM if time.monotonic() - killed < 10 else signal.SIGKILL
        for t in tasks:
            if t.poll() is None:
                kill_tree(t.pid, sig)
    time.sleep(0.2)
sys.exit(rc or max(t.returncode if t.returncode >= 0 else 128 - t.returncode for t in tasks))
"""


def _recipe(tmp: Path) -> Path:
    recipe = yaml.safe_load((REPO / "configs" / "tiny.yaml").read_text())
    recipe["models"] = {"tiny-qwen3": {"spec": "bundled:tiny-qwen3", "gpus": 0}}
    recipe["workflow"]["models"] = ["tiny-qwen3"]
    recipe["train"].update(dataset={"name": "synthetic-arith", "n": 16, "difficulty": 1, "seed": 0}, reward="coin",
                           max_steps=3, save_steps=1, learning_rate=1e-3, warmup_steps=0, prompts_per_generation=2,
                           num_generations=4, prompts_per_step=2, per_device_train_batch_size=2,
                           max_completion_length=8, diagnostics_every=0, worked_example=None)
    path = tmp / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def _cpu_engine(tmp: Path) -> Path:
    """configs/accelerate/ddp.yaml with fp32 (CPU ranks: no bf16 autocast), as the line names a config file."""
    engine = yaml.safe_load((REPO / "configs" / "accelerate" / "ddp.yaml").read_text())
    engine["mixed_precision"] = "no"
    path = tmp / "ddp-cpu.yaml"
    path.write_text(yaml.safe_dump(engine))
    return path


def _free_job_id() -> int:
    """A SLURM_JOB_ID whose port (launch.PORT_BASE + id mod 20000) is free on 127.0.0.1."""
    for job in range(os.getpid() % 20000, os.getpid() % 20000 + 20000):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", launch.PORT_BASE + job % 20000))
                return job
            except OSError:
                continue
    raise RuntimeError("no free port")


def _command(tmp: Path, recipe: Path, out: Path, nodes: int, gpus: int) -> tuple[str, dict]:
    """The workflow's shell line for a job of nodes × gpus (stapo.core.launch), and its environment on this host."""
    line = launch.train_launcher(gpus, nodes, str(_cpu_engine(tmp)))
    line = line.replace("-m stapo.cli", shlex.quote(str(HELPER)))
    line += (f" train --recipe {shlex.quote(str(recipe))} --model tiny-qwen3 --method stapo"
             f" --out {shlex.quote(str(out))}")
    fake = tmp / "fake-slurm"
    fake.mkdir(exist_ok=True)
    (fake / "srun").write_text(FAKE_SRUN.format(python=sys.executable))
    (fake / "scontrol").write_text("#!/bin/sh\necho 127.0.0.1\n")  # `scontrol show hostnames`: the first node
    for exe in ("srun", "scontrol"):
        (fake / exe).chmod(0o755)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "PATH": f"{fake}{os.pathsep}{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "FAKE_SRUN_DIR": str(fake),
           "SLURM_JOB_ID": str(_free_job_id()), "SLURM_JOB_NODELIST": "node[1-2]"}
    return line, env


def _run(tmp: Path, recipe: Path, out: Path, nodes: int, gpus: int) -> dict[str, torch.Tensor]:
    line, env = _command(tmp, recipe, out, nodes, gpus)
    res = subprocess.run(["bash", "-c", line], env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, line + "\n" + res.stdout[-3000:] + res.stderr[-3000:]
    assert yaml.safe_load((out / "config.yaml").read_text())["trl"]["num_processes"] == nodes * gpus
    return load_file(str(out / "final" / "model.safetensors"))


def max_abs_difference(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


@pytest.mark.slow
def test_two_machines_train_to_the_weights_of_one_machine(tmp_path):
    recipe = _recipe(tmp_path)
    one_machine = _run(tmp_path, recipe, tmp_path / "1x2", nodes=1, gpus=2)
    two_machines = _run(tmp_path, recipe, tmp_path / "2x1", nodes=2, gpus=1)
    delta = max_abs_difference(one_machine, two_machines)
    print(f"\n2 machines x 1 process vs 1 machine x 2 processes: max |dtheta| = {delta:.3g} "
          f"over {len(one_machine)} tensors")
    assert delta <= 1e-6
    init = load_file(str(Path(resolve_model("bundled:tiny-qwen3")) / "model.safetensors"))
    moved = max_abs_difference(two_machines, init)
    assert moved > 1e-4, moved  # training moved the weights: not two untouched models compared


@pytest.mark.slow
def test_a_run_whose_machine_dies_resumes(tmp_path):
    """Machine 1 (its launcher and its rank) is killed after checkpoint-1; srun ends machine 0; the same command
    again resumes from the newest intact checkpoint and finishes, to the weights of an uninterrupted run (max |dtheta|
    = 0: the test double's completions are keyed by the rollout step, so a resumed process draws what the
    uninterrupted one did)."""
    recipe = _recipe(tmp_path)
    straight = _run(tmp_path, recipe, tmp_path / "straight", nodes=2, gpus=1)
    out = tmp_path / "killed"
    line, env = _command(tmp_path, recipe, out, nodes=2, gpus=1)
    hold = {**env, "STAPO_TEST_HOLD_AFTER_SAVE": "1"}  # the run waits after checkpoint-1: machine 1 is alive to kill
    job = subprocess.Popen(["bash", "-c", line], env=hold, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 600
    while rundir.latest_complete_checkpoint(out) is None:
        assert job.poll() is None and time.monotonic() < deadline, "the run ended before checkpoint-1"
        time.sleep(0.5)
    machine1 = psutil.Process(int((tmp_path / "fake-slurm" / "node1.pid").read_text()))
    for proc in [machine1, *machine1.children(recursive=True)]:  # machine 1 dies: its launcher and its rank
        proc.kill()
    assert job.wait(timeout=120) != 0 and not (out / "final").exists()
    killed_at = rundir.checkpoint_step(rundir.latest_complete_checkpoint(out))
    resumed = _run(tmp_path, recipe, out, nodes=2, gpus=1)
    steps = [int(line.split('"step": ')[1].split(",")[0]) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert killed_at < 3 and steps[-1] == 3 and set(steps) == {1, 2, 3}, (killed_at, steps)
    delta = max_abs_difference(straight, resumed)
    print(f"\nmachine 1 killed after checkpoint-{killed_at}, resumed to step 3: max |dtheta| vs uninterrupted = "
          f"{delta:.3g}")
    assert delta == 0.0, f"resumed weights differ from the uninterrupted run's: max |dtheta| = {delta}"
