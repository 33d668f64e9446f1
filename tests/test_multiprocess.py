"""Multi-process proof on CPU: `stapo train` under `accelerate launch --num_processes 2` (gloo) gives the same
per-step metrics and final weights as one process with the same global batch, for the token-mean methods with
the mini-batch threshold scope — the exact kept-token normaliser and the step-wide thresholds across ranks.

Generation is the one test double (tests/helpers/fixed_rollouts.py): completions keyed by their global index, so
both runs train on the same samples; everything else is the real trainer. With the micro-batch scope the two runs
differ (the thresholds then depend on how the batch is split), which shows the comparison can fail.

The paper's engine, FSDP2 (configs/paper.yaml): on two CPU ranks with unequal token counts, the first optimiser
step's gradient (sharded, after the trainer's exact normaliser, before clipping) equals one process's gradient of
the same loss over the whole batch in one micro-batch, to 1e-6 relative per tensor; DeepSpeed's per-micro-batch
estimate, forced on the same run, does not. Fast checks: the engine and normaliser recorded in config.yaml, and
FSDP's bf16 policy reducing gradients in fp32.
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

import stapo.train.trainer as T
from stapo.train import trl_config
from stapo import study

from helpers.shared import build_once

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
                           max_completion_length=8, diagnostics_every=0,
                           worked_example=None)  # the paper's bare prompts (the worked example is SmolLM2's)
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
           "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH")))),  # this checkout
           **(env or {})}
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
@pytest.mark.parametrize("method", ["justrl", "stapo"])
def test_token_budget_two_processes_equal_one(tmp_path, method):
    """Token-budget micro-batches (packed, whole groups): two DDP processes, each splitting its half of the step
    into the same number of micro-batches (an all-reduce MAX), equal one process with its own split — the exact
    token-mean does not depend on how the step is cut."""
    recipe = _recipe(tmp_path, {}, max_prompt_length=64, micro_batch_tokens=72, padding_free=True,
                     mini_batch="groups")
    one = _train(recipe, method, tmp_path / "one", 1)
    two = _train(recipe, method, tmp_path / "two", 2)
    assert yaml.safe_load((tmp_path / "two" / "config.yaml").read_text())["trl"]["micro_batches"] == \
        "token_budget_packed"
    assert _same(one, two), (one[0], two[0])


@pytest.mark.slow
@pytest.mark.parametrize("method", ["cispo"])
def test_related_losses_two_processes_equal_one(tmp_path, method):
    """A loss of its own that needs no cross-rank statistic (CISPO's, token-mean) trains on two processes as on
    one. Clip-Cov's and KL-Cov's covariance is taken per micro-batch on one rank, as verl's, so the split changes
    them; GSPO (sequence-mean, as grpo, which the test above leaves out too) matches its metrics but its weights
    differ by 1.3e-5 after two Adam steps at lr 1e-3 (the ranks' sequence-mean weights sum in another order)."""
    path = _recipe(tmp_path, {})
    recipe = yaml.safe_load(path.read_text())
    recipe["methods"][method] = {"objective": method}
    path.write_text(yaml.safe_dump(recipe))
    one = _train(path, method, tmp_path / "one", 1)
    two = _train(path, method, tmp_path / "two", 2)
    assert [r["step"] for r in one[0]] == [1, 2] and all(r["kept_fraction"] == 1.0 for r in one[0])
    assert _same(one, two), (one[0], two[0])


@pytest.mark.slow
def test_balance_batch_hands_each_process_its_partition(tmp_path):
    """train.balance_batch on two DDP processes (a rollout batch of 4 prompts x 4, two optimiser steps): each process
    trains on its equal-size Karmarkar–Karp partition of the gathered rollout batch (verl's _balance_batch), rows in
    rollout order; off, on the rows it generated. The step gradients stay exact either way (token-mean)."""
    from stapo.train import partition

    shares = {}
    for balance in (True, False):
        dump = tmp_path / f"shares-{balance}"
        dump.mkdir()
        recipe = _recipe(tmp_path, {}, name=f"recipe-{balance}", max_steps=1, prompts_per_generation=4,
                         mini_batch="groups", balance_batch=balance)
        _train(recipe, "justrl", tmp_path / f"run-{balance}", 2, env={"STAPO_TEST_SHARE_DUMP": str(dump)})
        shares[balance] = [json.loads((dump / f"rank{r}-1.json").read_text()) for r in (0, 1)]
    for balance, ranks in shares.items():
        generated = [c for r in ranks for c in r["generated"]["completions"]]  # the rollout batch, in process order
        lengths = [n for r in ranks for n in r["generated"]["lengths"]]
        parts = partition.rank_partitions(lengths, 2) if balance else [list(range(8)), list(range(8, 16))]
        for rank, part in zip(ranks, parts):
            assert rank["trained"]["completions"] == [generated[i] for i in part]
        sums = [sum(r["trained"]["lengths"]) for r in ranks]
        print(f"balance_batch {balance}: tokens per process {sums}, partitions {parts}")
    assert shares[True][0]["generated"] == shares[False][0]["generated"]  # the same rollouts either way
    balanced = [sum(r["trained"]["lengths"]) for r in shares[True]]
    plain = [sum(r["trained"]["lengths"]) for r in shares[False]]
    assert abs(balanced[0] - balanced[1]) <= abs(plain[0] - plain[1])


@pytest.mark.slow
def test_micro_batch_scope_depends_on_the_split(tmp_path):
    recipe = _recipe(tmp_path, {"entropy20": {"quantile_scope": "micro_batch"}})
    one = _train(recipe, "entropy20", tmp_path / "one", 1)
    two = _train(recipe, "entropy20", tmp_path / "two", 2)
    assert not _same(one, two)


def _first_step_gradient(tmp: Path, recipe: Path, method: str, processes: int, engine: Path | None = None,
                         normaliser: str | None = None) -> dict:
    """The first optimiser step's gradient after the trainer's normaliser, before clipping (fixed_rollouts.py)."""
    name = f"{method}-{processes}-{normaliser or 'chosen'}"
    env = {"STAPO_TEST_GRAD_DUMP": str(tmp / f"{name}.pt")}
    if normaliser:
        env["STAPO_TEST_NORMALISER"] = normaliser
    _train(recipe, method, tmp / name, processes, engine=engine, env=env)
    return _gradient_dump(tmp, name)


def _gradient_dump(tmp: Path, name: str) -> dict:
    """What _first_step_gradient's run ``name`` dumped, with the first step's logged (clipped-at) gradient norm."""
    rows = [json.loads(line) for line in (tmp / name / "metrics.jsonl").read_text().splitlines()]
    return {**torch.load(tmp / f"{name}.pt"), "logged_grad_norm": rows[0]["grad_norm"]}


def _full_batch_gradient(shared_dir: Path, method: str) -> dict:
    """One process's first-step gradient of ``method`` over the whole step in one micro-batch (``_step_recipes``'s
    "full"): the reference of the FSDP tests, computed once per test run per method (tests/helpers/shared.py)."""
    def build(tmp: Path):
        tmp.mkdir(parents=True)
        _first_step_gradient(tmp, _step_recipes(tmp)[1], method, 1)

    return _gradient_dump(build_once(shared_dir, f"full-batch-gradient-{method}", build), f"{method}-1-chosen")


def _paper_engine(model: str = "qwen3-8b-base") -> Path:
    """The accelerate config of a paper model (FSDP2: 8B/14B full shard, 1.7B SHARD_GRAD_OP), on CPU ranks in fp32."""
    entry = yaml.safe_load((REPO / "configs" / "paper.yaml").read_text())["models"][model]
    engine = REPO / entry["accelerate_config"]
    assert yaml.safe_load(engine.read_text())["distributed_type"] == "FSDP"
    return engine


def _step_recipes(tmp: Path) -> tuple[Path, Path]:
    """One optimiser step of 8 completions: micro-batches of 2 (two per rank on two ranks), and one of all 8. The
    ranks keep the rows they generated (balance_batch off): their token counts differ, which the exact normaliser
    must handle (balanced, they happen to be equal here)."""
    return (_recipe(tmp, {}, name="micro", max_steps=1, save_steps=1, balance_batch=False),
            _recipe(tmp, {}, name="full", max_steps=1, save_steps=1, per_device_train_batch_size=8))


def _relative_errors(grads: dict, reference: dict) -> dict[str, float]:
    """‖g − g_ref‖ / ‖g_ref‖ per parameter tensor."""
    assert grads.keys() == reference.keys()
    return {k: float((grads[k] - reference[k]).norm() / reference[k].norm().clamp(min=1e-30)) for k in reference}


@pytest.mark.slow
@pytest.mark.parametrize(("method", "model"), [("justrl", "qwen3-8b-base"), ("stapo", "qwen3-8b-base"),
                                               ("entropy20", "qwen3-8b-base"), ("stapo", "qwen3-1.7b-base")])
def test_fsdp_step_gradient_equals_one_process_full_batch(tmp_path, shared_dir, method, model):
    """The paper model's FSDP engine (FSDP2; here on CPU, gloo, fp32) with two ranks of unequal token counts, two
    micro-batches each: the optimiser step's gradient — sharded, rescaled once by the exact normaliser — equals one
    process's gradient of the same loss over the whole batch in one micro-batch, to 1e-6 relative per tensor."""
    micro, _ = _step_recipes(tmp_path)
    sharded = _first_step_gradient(tmp_path, micro, method, 2, _paper_engine(model))
    full = _full_batch_gradient(shared_dir, method)
    assert (sharded["engine"], sharded["fsdp_version"], sharded["sharded"]) == ("FSDP", 2, True)
    assert sharded["normaliser"] == full["normaliser"] == "exact_rescale"
    tokens = sharded["tokens_per_rank"]
    assert tokens[0] != tokens[1] and sum(tokens) == sum(full["tokens_per_rank"])  # unequal ranks, same batch
    if method == "stapo":
        assert sum(sharded["kept_per_rank"]) < sum(tokens)  # the S2T mask silences tokens in this step
    errors = _relative_errors(sharded["grads"], full["grads"])
    print(f"{method} ({model} engine): tokens per rank {tokens}, kept {sharded['kept_per_rank']}, "
          f"max relative error {max(errors.values()):.2e} ({max(errors, key=errors.get)})")
    assert max(errors.values()) < 1e-6, errors
    # the clip (after training_step) measured the rescaled gradient: its norm is the full-batch gradient's
    norm = float(torch.stack([g.norm() for g in full["grads"].values()]).norm())
    assert sharded["logged_grad_norm"] == pytest.approx(norm, rel=1e-5)


@pytest.mark.slow
def test_fsdp_gradient_check_catches_the_deepspeed_estimate(tmp_path, shared_dir):
    """The check has power: the same FSDP run with DeepSpeed's per-micro-batch kept-fraction normaliser forced on
    misses the full-batch gradient of entropy20 (kept fractions differ between micro-batches) by far more than 1e-6."""
    micro, _ = _step_recipes(tmp_path)
    estimate = _first_step_gradient(tmp_path, micro, "entropy20", 2, _paper_engine(), "deepspeed_kept_fraction")
    full = _full_batch_gradient(shared_dir, "entropy20")
    assert estimate["normaliser"] == "deepspeed_kept_fraction"
    error = max(_relative_errors(estimate["grads"], full["grads"]).values())
    print(f"entropy20 with the DeepSpeed estimate: max relative error {error:.2e}")
    assert error > 1e-3


@pytest.mark.parametrize(("engine", "method", "normaliser"), [
    ("fsdp", "stapo", "exact_rescale"), ("ddp", "entropy20", "exact_rescale"), ("single", "justrl", "exact_rescale"),
    ("deepspeed", "stapo", "deepspeed_kept_fraction"), ("deepspeed", "justrl", "deepspeed_kept_fraction"),
    ("fsdp", "grpo", "grpo_seq_mean")])
def test_config_records_engine_and_normaliser(tmp_path, engine, method, normaliser):
    paper = study.load(REPO / "configs" / "paper.yaml")
    paper["train"]["use_vllm"] = False  # no vLLM here; the engine settings are not the point
    plan = study.resolve_plan(paper, "qwen3-8b-base", method)
    config = trl_config.grpo_config(plan, tmp_path, 8, deepspeed=engine == "deepspeed")
    trl = trl_config.resolved_config(plan, config, engine)["trl"]
    assert (trl["engine"], trl["normaliser"]) == (engine, normaliser)
    assert trl["model_dtype"] == ("bfloat16" if engine == "deepspeed" else "float32")  # FSDP: fp32 master weights


def test_training_engine_is_known_before_the_accelerator(monkeypatch):
    monkeypatch.delenv("ACCELERATE_USE_FSDP", raising=False)
    assert trl_config.training_engine() == "single"
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")  # what `accelerate launch` with an FSDP config exports
    assert trl_config.training_engine() == "fsdp"


def test_fsdp_bf16_reduces_gradients_in_fp32():
    """accelerate's bf16 policy for FSDP2 reduces gradients in bf16; the trainer makes it fp32 (verl's reduce_dtype),
    keeping bf16 compute."""
    from accelerate.utils import FullyShardedDataParallelPlugin

    plugin = FullyShardedDataParallelPlugin(fsdp_version=2)
    plugin.set_mixed_precision("bf16")
    assert plugin.mixed_precision_policy.reduce_dtype == torch.bfloat16
    T._fp32_gradient_reduction(plugin)
    policy = plugin.mixed_precision_policy
    assert (policy.param_dtype, policy.reduce_dtype) == (torch.bfloat16, torch.float32)
