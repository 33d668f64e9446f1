"""Multi-process proof on CPU: `stapo train` under `accelerate launch --num_processes 2` (gloo) gives the same
per-step metrics and final weights as one process with the same global batch, for the token-mean methods with
the mini-batch threshold scope — the exact kept-token normaliser and the step-wide thresholds across ranks.

Generation is the one test double (tests/helpers/fixed_rollouts.py): completions keyed by their global index, so
both runs train on the same samples; everything else is the real trainer. With the micro-batch scope the two runs
differ (the thresholds then depend on how the batch is split), which shows the comparison can fail.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

REPO = Path(__file__).resolve().parents[1]
LAUNCHER = REPO / "tests" / "helpers" / "fixed_rollouts.py"
BIN = Path(sys.executable).parent
METRICS = ("loss", "reward_mean", "grad_norm", "entropy_mean", "candidate_fraction", "silenced_fraction",
           "kept_fraction", "ratio_mean")


def _recipe(tmp: Path, method_overrides: dict, name: str = "recipe", **train) -> Path:
    recipe = yaml.safe_load((REPO / "configs" / "tiny.yaml").read_text())
    recipe["models"] = {"tiny-qwen3": {"spec": "bundled:tiny-qwen3", "gpus": 0}}
    recipe["workflow"]["models"] = ["tiny-qwen3"]  # the study must name only models it defines
    for key, extra in method_overrides.items():
        recipe["methods"][key] = {**recipe["methods"][key], **extra}
    # global batch: 2 prompts × 4 completions per optimiser step, micro-batches of 2 completions —
    # 4 micro-batches on one process, 2 on each of two
    recipe["train"].update(dataset={"name": "synthetic-arith", "n": 16, "difficulty": 1, "seed": 0}, reward="coin",
                           max_steps=2, save_steps=2, learning_rate=1e-3, warmup_steps=0, prompts_per_generation=2,
                           num_generations=4, prompts_per_step=2, per_device_train_batch_size=2,
                           max_completion_length=8, diagnostics_every=0)
    recipe["train"].update(train)
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def _train(recipe: Path, method: str, out: Path, processes: int, *, engine: Path | None = None,
           env: dict | None = None) -> tuple[list[dict], dict]:
    """`stapo train` on ``processes`` CPU processes: plain DDP, or the accelerate config ``engine`` (fp32, CPU)."""
    args = ["train", "--recipe", str(recipe), "--model", "tiny-qwen3", "--method", method, "--out", str(out)]
    if processes == 1:
        cmd = [sys.executable, str(LAUNCHER), *args]
    else:  # torchrun under accelerate; with no GPU every process is a CPU rank of one gloo group
        launch = ["--multi_gpu"] if engine is None else ["--config_file", str(engine)]
        cmd = [str(BIN / "accelerate"), "launch", *launch, "--num_processes", str(processes),
               "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", str(LAUNCHER), *args]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", **(env or {})}
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert yaml.safe_load((out / "config.yaml").read_text())["trl"]["num_processes"] == processes
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return rows, load_file(str(out / "final" / "model.safetensors"))


def _same(a: tuple, b: tuple) -> bool:
    (rows_a, w_a), (rows_b, w_b) = a, b
    if [r["step"] for r in rows_a] != [r["step"] for r in rows_b]:
        return False
    for ra, rb in zip(rows_a, rows_b):
        for key in METRICS:
            if ra[key] != pytest.approx(rb[key], rel=1e-5, abs=1e-7):
                return False
    return all(torch.allclose(w_a[k], w_b[k], rtol=0, atol=1e-5) for k in w_a)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["justrl", "stapo", "entropy20"])
def test_two_processes_equal_one(tmp_path, method):
    recipe = _recipe(tmp_path, {})
    one = _train(recipe, method, tmp_path / "one", 1)
    two = _train(recipe, method, tmp_path / "two", 2)
    assert [r["step"] for r in one[0]] == [1, 2]
    if method == "stapo":
        assert any(r["silenced_fraction"] > 0 for r in one[0])  # the mask is exercised
    if method == "entropy20":
        assert all(0.1 < r["kept_fraction"] < 0.4 for r in one[0])
    assert _same(one, two), (one[0], two[0])


@pytest.mark.slow
def test_micro_batch_scope_depends_on_the_split(tmp_path):
    recipe = _recipe(tmp_path, {"entropy20": {"quantile_scope": "micro_batch"}})
    one = _train(recipe, "entropy20", tmp_path / "one", 1)
    two = _train(recipe, "entropy20", tmp_path / "two", 2)
    assert not _same(one, two)


def _first_step_gradient(tmp: Path, recipe: Path, method: str, processes: int, engine: Path | None = None) -> dict:
    """The first optimiser step's gradient after the trainer's normaliser, before clipping (fixed_rollouts.py)."""
    dump = tmp / f"{method}-{processes}.pt"
    _train(recipe, method, tmp / f"{method}-{processes}", processes, engine=engine,
           env={"STAPO_TEST_GRAD_DUMP": str(dump)})
    return torch.load(dump)


def _relative_errors(grads: dict, reference: dict) -> dict[str, float]:
    """‖g − g_ref‖ / ‖g_ref‖ per parameter tensor."""
    assert grads.keys() == reference.keys()
    return {k: float((grads[k] - reference[k]).norm() / reference[k].norm().clamp(min=1e-30)) for k in reference}


@pytest.mark.slow
@pytest.mark.parametrize("method", ["justrl", "stapo", "entropy20"])
def test_fsdp_step_gradient_equals_one_process_full_batch(tmp_path, method):
    """The paper's FSDP engine (configs/accelerate/fsdp.yaml, FSDP2 full shard; here on CPU, gloo, fp32) with two
    ranks of unequal token counts, two micro-batches each: the optimiser step's gradient — sharded, rescaled once
    by the exact normaliser — equals one process's gradient of the same loss over the whole batch in one
    micro-batch, to 1e-6 relative per parameter tensor."""
    engine = yaml.safe_load((REPO / "configs" / "paper.yaml").read_text())["models"]["qwen3-8b-base"]
    engine = REPO / engine["accelerate_config"]
    assert yaml.safe_load(engine.read_text())["distributed_type"] == "FSDP"
    sharded = _first_step_gradient(tmp_path, _recipe(tmp_path, {}, name="micro", max_steps=1, save_steps=1),
                                   method, 2, engine)
    full = _first_step_gradient(tmp_path, _recipe(tmp_path, {}, name="full", max_steps=1, save_steps=1,
                                                  per_device_train_batch_size=8), method, 1)
    assert (sharded["engine"], sharded["fsdp_version"], sharded["sharded"]) == ("FSDP", 2, True)
    assert sharded["normaliser"] == full["normaliser"] == "exact_rescale"
    tokens = sharded["tokens_per_rank"]
    assert tokens[0] != tokens[1] and sum(tokens) == sum(full["tokens_per_rank"])  # unequal ranks, same batch
    if method == "stapo":
        assert sum(sharded["kept_per_rank"]) < sum(tokens)  # the S2T mask silences tokens in this step
    errors = _relative_errors(sharded["grads"], full["grads"])
    print(f"{method}: tokens per rank {tokens}, kept {sharded['kept_per_rank']}, "
          f"max relative error {max(errors.values()):.2e} ({max(errors, key=errors.get)})")
    assert max(errors.values()) < 1e-6, errors
