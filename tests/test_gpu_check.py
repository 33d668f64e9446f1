"""benchmarks/gpu_check.py on CPU: argument parsing, the model config, recipe, plans and eval config it builds
(--dry-run), and the fail-fast preflight where there is no GPU / no vLLM GPU build. The GPU run itself needs a
lent GPU (see the script's docstring)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"


@pytest.fixture(scope="module")
def gc():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_argument_parsing(gc):
    args = gc.parse_args([])
    assert (args.methods, args.steps, args.prompts, args.completion_length, args.micro_batch) == (
        ["justrl", "stapo"], 2, 4, 4096, 1)
    assert gc.parse_args(["--methods", "grpo, stapo", "--steps", "3"]).methods == ["grpo", "stapo"]
    with pytest.raises(SystemExit):
        gc.parse_args(["--methods", "ppo"])
    with pytest.raises(SystemExit):
        gc.parse_args(["--steps", "0"])
    with pytest.raises(SystemExit):
        gc.parse_args(["--prompts", "1", "--micro-batch", "3"])  # 8 completions not divisible by 3


def test_dry_run_builds_the_configs(gc, tmp_path, capsys):
    args = gc.parse_args(["--dry-run", "--rollouts", "vllm", "--out", str(tmp_path), "--methods", "justrl,stapo,grpo",
                          "--prompts", "8",
                          "--completion-length", "2048", "--eval-problems", "16"])
    info = gc.dry_run(args, tmp_path)
    model = info["model"]
    # Qwen3-1.7B-Base: 28 x (attention 12,582,912 + q/k norms 256 + MLP 37,748,736 + 2 norms 4,096)
    #                  + tied embedding 151,936 x 2,048 + final norm 2,048
    assert model["params"] == 28 * (12_582_912 + 256 + 37_748_736 + 4_096) + 151_936 * 2_048 + 2_048
    assert (model["hidden_size"], model["num_hidden_layers"], model["head_dim"]) == (2048, 28, 128)
    assert model["tokenizer_vocab"] <= model["vocab_size"]  # the real Qwen3 tokenizer fits the embedding
    plans = info["plans"]
    assert set(plans) == {"justrl", "stapo", "grpo"}
    # 8 prompts x 8 rollouts on one GPU with the paper's token-budget micro-batches (train.micro_batch_tokens,
    # verl's dynamic bsz): TRL hands the whole 64-completion step over at once (no TRL accumulation), the trainer
    # splits it under the budget; one rollout per optimiser step
    assert (plans["stapo"]["gradient_accumulation_steps"], plans["stapo"]["steps_per_generation"]) == (1, 1)
    assert plans["stapo"]["completions_per_step"] == 64
    assert plans["stapo"]["vllm"] == {"use_vllm": True, "vllm_mode": "colocate", "vllm_gpu_memory_utilization": 0.5,
                                      "vllm_max_model_length": 1024 + 2048}
    assert plans["grpo"]["objective"] == "grpo"
    assert info["eval"] == {"n": 4, "limit": 16, "max_new_tokens": 2048, "backend": "vllm",
                            "engine": {"dtype": "bfloat16", "gpu_memory_utilization": 0.9, "tensor_parallel_size": 1}}
    assert json.loads((tmp_path / "dry_run.json").read_text())["plans"]["justrl"]["completions_per_step"] == 64
    assert "recipe.yaml" in {p.name for p in tmp_path.iterdir()}


def test_summary_arithmetic(gc):
    train = {m: {"step_seconds": [99.0, 30.0, 32.0], "prompt_tokens_mean": 100.0, "peak_reserved_gib": 60.0,
                 "device_used_gib": 80.0,
                 "rollouts": [{"seconds": 50.0, "tokens": 1, "completions": 64}] +
                             [{"seconds": 10.0, "tokens": 64 * 1000, "completions": 64}] * 2}
             for m in ("justrl", "stapo")}
    train["stapo"]["step_seconds"] = [99.0, 33.0, 35.2]
    ev = {"tokens": 20_000, "generation_s": 4.0, "engine_start_s": 30.0, "samples": 64}
    methods, tp = gc.summarize(train, ev, "H200", date="2026-12-05")
    # steady state drops the first step: median step 31 s, rollout 10 s of 64,000 tokens
    assert methods["justrl"]["rollout_tokens_per_s"] == 6400
    assert methods["justrl"]["train_tokens_per_s"] == pytest.approx(64 * (100 + 1000) / 21)
    assert tp == {"gpu": "H200", "device": "cuda", "measured": "2026-12-05", "rollout_engine": "vllm",
                  "reference_params_b": 1.7, "rollout_tokens_per_s": 6400.0,
                  "train_tokens_per_s": round(64 * 1100 / 21, 1), "rollout_completions": 64,
                  "rollout_response_tokens": 1000.0, "eval_tokens_per_s": 5000.0, "engine_start_s": 30.0}
    assert "step time stapo / justrl = 1.100" in gc.report(methods, ev, tp)  # 34.1 / 31


def test_without_gpu_it_fails_fast_and_names_the_fix(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2
    assert "gpu_check needs a CUDA GPU" in proc.stderr and "--dry-run" in proc.stderr
    assert not (tmp_path / "model").exists()


def test_cpu_smoke_defaults_fit_the_tiny_model(gc):
    """--cpu-smoke's defaults are toy sizes: the engine's context (max prompt + completion) fits the tiny model's
    4,096 positions (the GPU defaults, 1,024 + 4,096, do not); explicit flags still win."""
    from stapo.models import resolve_model

    args = gc.parse_args(["--cpu-smoke"])
    assert (args.steps, args.prompts, args.completion_length, args.micro_batch, args.eval_problems,
            args.eval_samples) == (2, 1, 16, 4, 2, 2)
    train = gc.build_recipe(args, "/m")["train"]
    context = train["max_prompt_length"] + train["max_completion_length"]
    import transformers

    config = transformers.AutoConfig.from_pretrained(resolve_model(gc.SMOKE_MODEL))
    assert context <= config.max_position_embeddings < 1024 + 4096
    assert gc.parse_args(["--cpu-smoke", "--completion-length", "32"]).completion_length == 32
    _, tp = gc.summarize({"justrl": {"step_seconds": [2.0], "prompt_tokens_mean": 10.0, "peak_reserved_gib": 1.0,
                                     "device_used_gib": 1.0,
                                     "rollouts": [{"seconds": 1.0, "tokens": 64, "completions": 8}]}},
                         {"tokens": 10, "generation_s": 1.0, "engine_start_s": 1.0, "samples": 4}, "cpu (smoke)")
    assert tp["device"] == "cpu"  # so that stapo plan can tell a CPU rehearsal's throughputs from a GPU's


def test_cpu_smoke_recipe_differs_only_in_precision_and_engine_memory(gc):
    sizes = ["--prompts", "4", "--completion-length", "4096", "--micro-batch", "1", "--rollouts", "vllm"]
    gpu = gc.build_recipe(gc.parse_args(sizes), "/m")["train"]
    cpu = gc.build_recipe(gc.parse_args(["--cpu-smoke", *sizes]), "/m")["train"]
    assert (gpu["bf16"], gpu["gradient_checkpointing"], gpu["vllm_gpu_memory_utilization"]) == (True, True, 0.5)
    assert (cpu["bf16"], cpu["gradient_checkpointing"], cpu["vllm_gpu_memory_utilization"]) == (False, False, None)
    device_keys = ("bf16", "gradient_checkpointing", "vllm_gpu_memory_utilization")
    assert {k: v for k, v in gpu.items() if k not in device_keys} \
        == {k: v for k, v in cpu.items() if k not in ("bf16", "gradient_checkpointing", "vllm_gpu_memory_utilization")}
    assert (gpu["max_completion_length"], gpu["prompts_per_step"], gpu["use_vllm"], gpu["reward"]) == (
        4096, 4, True, "coin")


def _no_vllm_no_lm_eval(imports: list[str]) -> None:
    names = {name.lower().replace("-", "_") for name in imports}
    assert {"torch", "transformers", "stapo"} <= names, names  # a real import list
    assert not {n for n in names if "vllm" in n or n.startswith("lm_eval")}, names


def test_hf_rollouts_without_eval_import_neither_vllm_nor_lm_eval(tmp_path):
    """--rollouts hf --no-eval: the recipe generates with TRL's HF generate, no eval stage, and the dry run's import
    list (the installed distributions the process imported) has no vLLM and no lm-eval."""
    proc = subprocess.run([sys.executable, str(SCRIPT), "--rollouts", "hf", "--no-eval", "--dry-run", "--out",
                           str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    info = json.loads((tmp_path / "dry_run.json").read_text())
    assert info["rollouts"] == "hf" and info["eval"] is None and info["workers"] == [
        "--worker train --method justrl", "--worker train --method stapo"]
    assert info["plans"]["stapo"]["vllm"] == {"use_vllm": False}
    _no_vllm_no_lm_eval(info["imports"])


@pytest.mark.slow
def test_cpu_smoke_with_hf_rollouts_measures_the_update(tmp_path):
    """--cpu-smoke --rollouts hf --no-eval end to end on CPU (no vLLM anywhere): per method the update probes at the
    run's shape and at --long-length, the rollout rate from metrics.jsonl, throughputs naming the engine, and no
    vLLM / lm-eval in the workers' imports."""
    out = tmp_path / "gc"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--cpu-smoke", "--rollouts", "hf", "--no-eval", "--out",
                           str(out), "--long-length", "256"], capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((out / "gpu_check.json").read_text())
    _no_vllm_no_lm_eval(result["imports"])
    assert {"trl", "accelerate", "datasets"} <= set(result["imports"])
    for method in ("justrl", "stapo"):
        probes = result["methods"][method]["probes"]
        assert (probes["run"]["sequences"], probes["long"]["sequences"], probes["long"]["length"]) == (4, 1, 256)
        for p in probes.values():
            assert p["tokens_per_s"] == pytest.approx(p["tokens"] / p["seconds"]) and p["seconds"] > 0
            assert (p["mfu"], p["gpu_busy"], p["peak_gib"]) == (None, None, None)  # CPU: no peak, no CUDA
        assert result["methods"][method]["rollout_tokens_per_s"] > 0
    tp = result["throughputs"]
    assert (tp["rollout_engine"], tp["device"], tp["long_length"]) == ("hf", "cpu", 256)
    assert "eval_tokens_per_s" not in tp
    assert tp["train_tokens_per_s_long"] == round(result["methods"]["justrl"]["probes"]["long"]["tokens_per_s"], 1)
    assert "update probe" in proc.stdout and "rollouts: hf" in proc.stdout and "eval: not run" in proc.stdout
