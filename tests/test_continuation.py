"""A run that outlives its job (stapo.core.leave, stapo.train.continuation) and its two kinds of checkpoints
(stapo.train.rundir: resume checkpoints rotated after their manifest, evaluation snapshots).

Fast: the signals are recorded (a second SIGTERM is fatal); the callback leaves only at a rollout boundary and not at
max_steps, and follows the other ranks; rotation keeps the newest complete checkpoint(s) and never an incomplete one's
predecessor; a snapshot holds the weights in the evaluation's dtype. Slow: `stapo train` sent SIGUSR1 right after its
first optimiser step, with no periodic checkpoint due, saves one at its next rollout boundary, leaves with exit
status 75 and the marker, and the rerun finishes with the weights of an uninterrupted run (max |dtheta| = 0).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from safetensors.torch import load_file
from transformers import TrainerControl

from stapo.core import leave, manifest
from stapo.train import rundir
from stapo.train.continuation import LeaveAtRolloutBoundary

REPO = Path(__file__).resolve().parents[1]
LAUNCHER = REPO / "tests" / "helpers" / "fixed_rollouts.py"


@pytest.fixture
def recorded():
    leave.record()
    yield
    leave.restore()


def test_leave_signals_are_recorded_and_a_second_sigterm_is_fatal(recorded):
    assert leave.received() is None
    os.kill(os.getpid(), signal.SIGUSR1)
    assert leave.received() == "SIGUSR1"
    os.kill(os.getpid(), signal.SIGTERM)
    assert leave.received() == "SIGTERM"  # the job is being stopped: SIGTERM wins
    code = ("import os, signal, time; from stapo.core import leave; leave.record(); "
            "os.kill(os.getpid(), signal.SIGTERM); print(leave.received(), flush=True); "
            "os.kill(os.getpid(), signal.SIGTERM); time.sleep(5); print('survived')")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert res.stdout.split() == ["SIGTERM"] and res.returncode == -signal.SIGTERM


def _step(callback, step, max_steps=6):
    control = TrainerControl()
    callback.on_step_end(None, SimpleNamespace(global_step=step, max_steps=max_steps), control)
    return control


def test_the_callback_leaves_at_the_next_rollout_boundary_only(recorded):
    callback = LeaveAtRolloutBoundary(steps_per_rollout=2)
    assert not _step(callback, 2).should_save  # no signal: nothing
    os.kill(os.getpid(), signal.SIGUSR1)
    assert not _step(callback, 3).should_training_stop  # inside a rollout step (k = 2)
    control = _step(callback, 4)
    assert control.should_save and control.should_training_stop and callback.left_at == 4
    assert callback.received == "SIGUSR1"
    last = LeaveAtRolloutBoundary(steps_per_rollout=2)
    assert not _step(last, 6, max_steps=6).should_save  # at max_steps: it finishes instead (final/ follows)


def test_the_callback_follows_another_rank_and_asks_every_boundary(recorded):
    asked = []
    callback = LeaveAtRolloutBoundary(steps_per_rollout=1, reduce_max=lambda v: asked.append(v) or 1)
    control = _step(callback, 1)  # no signal here, one on another rank
    assert asked == [0] and control.should_save and callback.received == "a leave signal (another rank)"


def _checkpoint(out: Path, step: int, complete: bool = True) -> Path:
    path = out / f"checkpoint-{step}"
    path.mkdir(parents=True)
    (path / "trainer_state.json").write_text("{}")
    if complete:
        manifest.write_manifest(path, rundir.COMPLETE, step)
    return path


def test_rotation_keeps_the_newest_complete_checkpoints(tmp_path):
    for step in (2, 4, 6):
        _checkpoint(tmp_path, step)
    _checkpoint(tmp_path, 8, complete=False)  # being written
    assert [p.name for p in rundir.rotate_checkpoints(tmp_path, 1)] == ["checkpoint-2", "checkpoint-4"]
    assert [n for n, _ in rundir.checkpoints(tmp_path)] == [6, 8]  # the newest complete one and the one in progress
    assert rundir.rotate_checkpoints(tmp_path, 1) == []
    _checkpoint(tmp_path, 10)
    assert [p.name for p in rundir.rotate_checkpoints(tmp_path, 2)] == []  # 6 and 10 are the newest two complete
    assert [p.name for p in rundir.rotate_checkpoints(tmp_path, 1)] == ["checkpoint-6", "checkpoint-8"]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_snapshot_holds_the_weights_in_the_evaluation_dtype(tmp_path, dtype):
    from accelerate import Accelerator
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from stapo.models import resolve_model

    path = resolve_model("bundled:tiny-qwen3")
    model, tokenizer = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    trainer = SimpleNamespace(accelerator=Accelerator(cpu=True), model=model, processing_class=tokenizer)
    snap = rundir.write_snapshot(trainer, tmp_path, 8, dtype)
    assert snap == tmp_path / "snapshot-8" and not list(tmp_path.glob(".snapshot-*"))
    assert manifest.problems(snap, manifest.SNAPSHOT_COMPLETE) == []
    weights = load_file(str(snap / "model.safetensors"))
    assert {t.dtype for t in weights.values()} == {dtype}
    assert json.loads((snap / "config.json").read_text())["dtype"] == str(dtype).removeprefix("torch.")
    for key, value in model.state_dict().items():
        if key in weights:
            assert torch.equal(weights[key], value.to(dtype)), key
    assert not list(snap.glob("optimizer*")) and (snap / "tokenizer_config.json").exists()


# ------------------------------------------------------------------------------------------------------- slow


def _recipe(tmp: Path) -> Path:
    recipe = yaml.safe_load((REPO / "configs" / "tiny.yaml").read_text())
    recipe["models"] = {"tiny-qwen3": {"spec": "bundled:tiny-qwen3", "gpus": 0}}
    recipe["workflow"]["models"] = ["tiny-qwen3"]
    # 4 prompts x 4 completions per rollout step, 2 optimiser steps of 2 prompts each (k = 2); no periodic checkpoint
    recipe["train"].update(dataset={"name": "synthetic-arith", "n": 32, "difficulty": 1, "seed": 0}, reward="coin",
                           max_steps=3, save_steps=100, learning_rate=1e-3, warmup_steps=0, prompts_per_generation=4,
                           num_generations=4, prompts_per_step=2, per_device_train_batch_size=2,
                           max_completion_length=8, diagnostics_every=0, worked_example=None, snapshot_steps=[1])
    path = tmp / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def _command(recipe: Path, out: Path) -> list[str]:
    return [sys.executable, str(LAUNCHER), "train", "--recipe", str(recipe), "--model", "tiny-qwen3", "--method",
            "stapo", "--out", str(out)]


def _env() -> dict:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1",
            "PYTHONPATH": os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH"))))}


@pytest.mark.slow
def test_sigusr1_after_the_first_step_leaves_with_a_checkpoint_and_the_rerun_equals_an_uninterrupted_run(tmp_path):
    recipe, out, straight = _recipe(tmp_path), tmp_path / "left", tmp_path / "straight"
    res = subprocess.run(_command(recipe, straight), env=_env(), capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    job = subprocess.Popen(_command(recipe, out), env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics, deadline = out / "metrics.jsonl", time.monotonic() + 300
    while not (metrics.exists() and metrics.read_text().strip()):  # the first optimiser step is logged
        assert job.poll() is None and time.monotonic() < deadline, job.communicate()[1][-3000:]
        time.sleep(0.05)
    job.send_signal(signal.SIGUSR1)
    _, stderr = job.communicate(timeout=300)
    said = [line for line in stderr.splitlines() if line.startswith("stapo train:")]
    print(f"\nSIGUSR1 after step 1: exit {job.returncode}; {said}")
    assert job.returncode == 75 and len(said) == 1 and "left at step 2 of 6 (SIGUSR1)" in said[0], stderr[-3000:]
    assert [n for n, _ in rundir.checkpoints(out)] == [2] and not rundir.problems(out / "checkpoint-2")
    assert json.loads((out / "stapo.continue").read_text()) == {"step": 2, "signal": "SIGUSR1"}
    assert not (out / "final").exists() and [n for n, _ in rundir.snapshots(out)] == [2]
    res = subprocess.run(_command(recipe, out), env=_env(), capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    resumed, uninterrupted = (load_file(str(d / "final" / "model.safetensors")) for d in (out, straight))
    first = load_file(str(straight / "snapshot-2" / "model.safetensors"))
    delta = max(float((resumed[k].double() - uninterrupted[k].double()).abs().max()) for k in resumed)
    moved = max(float((uninterrupted[k].double() - first[k].double()).abs().max()) for k in first)
    print(f"resumed vs uninterrupted: max |dtheta| = {delta:.3g}; the weights move {moved:.3g} after step 2")
    assert delta == 0.0 and moved > 1e-5
    assert [n for n, _ in rundir.checkpoints(straight)] == [6]  # save_total_limit 1: only the newest resume state
    assert load_file(str(out / "snapshot-2" / "model.safetensors")).keys() == first.keys()
