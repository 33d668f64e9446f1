"""The vLLM paths, executed (opt-in: ``make test-vllm``, which builds .venv-vllm with vLLM's CPU build).

- ``stapo eval`` through lm-eval's vllm backend (summary written, backend recorded);
- ``stapo train`` with TRL colocate rollouts for 2 optimiser steps (metrics, checkpoint, final);
- benchmarks/gpu_check.py rehearsed at toy size (``--cpu-smoke``);
- TRL's weight sync to the colocated engine: after an optimiser step the engine's greedy tokens equal HF greedy
  on the updated policy (and differ from the pre-step policy's, so the check can fail).

The test model is bundled:tiny-qwen3 with head_dim 32 (vLLM's CPU attention rejects the default head_dim 16).
Skipped where vllm is not installed (the main .venv of ``make test``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
import yaml

pytest.importorskip("vllm", reason="vLLM tests need the vllm package: run `make test-vllm`")

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
MODEL = "bundled:tiny-qwen3?hidden=128&heads=4&kv_heads=2&intermediate=256"  # head_dim 32
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
       "VLLM_CPU_OMP_THREADS_BIND": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "nobind")}


def vllm_recipe(tmp_path: Path, **train) -> Path:
    """configs/tiny.yaml with the head_dim-32 model, vLLM rollouts (colocate) and vLLM evaluation.

    One rollout batch per optimiser step, so the 2-step run syncs the engine's weights before its second rollout.
    """
    recipe = yaml.safe_load((ROOT / "configs" / "tiny.yaml").read_text())
    recipe["models"] = {"tiny-vllm": {"spec": MODEL, "gpus": 0}}
    recipe["train"].update(
        dataset={"name": "synthetic-arith", "n": 16, "difficulty": 1, "seed": 0}, max_steps=2, save_steps=1,
        save_total_limit=None, learning_rate=1e-3, warmup_steps=0, prompts_per_generation=2, num_generations=4,
        prompts_per_step=2, per_device_train_batch_size=4, max_completion_length=16, diagnostics_every=0,
        use_vllm=True, vllm_mode="colocate")
    recipe["train"].update(train)
    recipe["eval"].update(backend="vllm", max_new_tokens=16,
                          benchmarks={"arith": {"samples": 2, "n": 4, "limit": 4}})
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def stapo(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "stapo.cli", *args], cwd=ROOT, env=ENV, capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return proc


def test_eval_through_vllm_backend(tmp_path):
    out = tmp_path / "scores" / "arith" / "t1.0_p1.0.jsonl"
    proc = stapo("eval", "--model", MODEL, "--benchmark", "arith", "--setting", "t1.0_p1.0", "--out", str(out),
                 "--recipe", str(vllm_recipe(tmp_path)))
    summary = json.loads(out.with_name("t1.0_p1.0.summary.json").read_text())
    assert summary["generation"]["backend"] == "vllm"
    assert (summary["problems"], summary["n_samples"], summary["samples"]) == (4, 2, 8)
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 8 and all(isinstance(r["completion"], str) for r in records)
    assert "vllm" in (proc.stdout + proc.stderr).lower()  # the engine's own log lines


def test_train_two_colocate_steps(tmp_path):
    run = tmp_path / "run"
    proc = stapo("train", "--recipe", str(vllm_recipe(tmp_path)), "--model", "tiny-vllm", "--method", "stapo",
                 "--out", str(run))
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["response_length_mean"] and r["response_length_mean"] > 0 for r in rows)
    assert (run / "checkpoint-2" / "STAPO_CHECKPOINT_COMPLETE").is_file()
    assert (run / "final" / "model.safetensors").is_file()
    assert yaml.safe_load((run / "config.yaml").read_text())["train"]["use_vllm"] is True
    assert "vllm" in proc.stderr.lower()


def coin_reward(prompts=None, completions=None, **kwargs):
    """Deterministic ±1 that varies across completions, so advantages (and the update) are non-zero."""
    return [1.0 if zlib.crc32(c.encode()) % 2 else -1.0 for c in completions]


def _hf_greedy(model, prompts: list[list[int]], n: int) -> list[list[int]]:
    """Greedy continuation by argmax over the full forward (no generation config: nothing can differ but weights)."""
    import torch

    outs = []
    with torch.no_grad():
        for ids in prompts:
            seq = list(ids)
            for _ in range(n):
                logits = model(torch.tensor([seq], device=model.device)).logits[0, -1]
                seq.append(int(logits.argmax()))
            outs.append(seq[len(ids):])
    return outs


def _engine_greedy(llm, prompts: list[list[int]], n: int) -> list[list[int]]:
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def test_weight_sync_to_colocated_engine(tmp_path, monkeypatch):
    import stapo.trainer as T
    from stapo import study
    from stapo.rewards import REWARDS

    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", ENV["VLLM_CPU_OMP_THREADS_BIND"])
    monkeypatch.setitem(REWARDS, "coin", coin_reward)
    recipe = yaml.safe_load(vllm_recipe(tmp_path, reward="coin", learning_rate=5e-2, max_steps=1).read_text())
    plan = study.resolve_plan(recipe, "tiny-vllm", "justrl")
    trainer = T.build_trainer(plan, tmp_path / "run", save_strategy="no")
    tok = trainer.processing_class
    prompts = [tok(text)["input_ids"] for text in ("What is 2 + 3?", "Compute 7 * 6.", "Solve x + 1 = 4.")]
    llm, n = trainer.vllm_generation.llm, 8

    before_hf = _hf_greedy(trainer.model, prompts, n)
    assert _engine_greedy(llm, prompts, n) == before_hf  # same initial weights
    trainer.train()
    assert trainer.state.global_step == 1
    trainer.vllm_generation.sync_weights()  # what TRL does before the next rollout
    after_hf = _hf_greedy(trainer.model, prompts, n)
    assert after_hf != before_hf, "the optimiser step did not change the greedy tokens; the check would be vacuous"
    assert _engine_greedy(llm, prompts, n) == after_hf


def test_gpu_check_cpu_rehearsal(tmp_path):
    """benchmarks/gpu_check.py end to end at toy size (--cpu-smoke): the workers, timing, summary, throughputs
    file and the stapo plan it runs; only the model build and the CUDA calls differ on a GPU."""
    out = tmp_path / "gc"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--cpu-smoke", "--out", str(out), "--steps", "2",
         "--prompts", "1", "--micro-batch", "4", "--completion-length", "16", "--eval-problems", "2",
         "--eval-samples", "2"], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    tp = yaml.safe_load((out / "throughputs.yaml").read_text())
    assert tp["gpu"] == "cpu (smoke)" and tp["reference_params_b"] == 0.02
    assert all(tp[k] > 0 for k in ("rollout_tokens_per_s", "train_tokens_per_s", "eval_tokens_per_s"))
    result = json.loads((out / "gpu_check.json").read_text())
    assert set(result["methods"]) == {"justrl", "stapo"}
    assert all(0 < m["response_tokens_mean"] <= 16 and m["completions"] == 8 for m in result["methods"].values())
    assert result["eval"]["samples"] == 4
    assert "step time stapo / justrl = " in proc.stdout
    assert "jobs: train 12, evaluate 1968, report 1 (total 1981)" in proc.stdout  # stapo plan on paper.yaml
