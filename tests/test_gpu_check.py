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
    args = gc.parse_args(["--dry-run", "--out", str(tmp_path), "--methods", "justrl,stapo,grpo", "--prompts", "8",
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
    # 8 prompts x 8 rollouts, micro-batch 1 on one GPU: 64 accumulation steps, one rollout per optimiser step
    assert (plans["stapo"]["gradient_accumulation_steps"], plans["stapo"]["steps_per_generation"]) == (64, 64)
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
    methods, tp = gc.summarize(train, ev, "H200")
    # steady state drops the first step: median step 31 s, rollout 10 s of 64,000 tokens
    assert methods["justrl"]["rollout_tokens_per_s"] == 6400
    assert methods["justrl"]["train_tokens_per_s"] == pytest.approx(64 * (100 + 1000) / 21)
    assert tp == {"gpu": "H200", "device": "cuda", "reference_params_b": 1.7, "rollout_tokens_per_s": 6400.0,
                  "train_tokens_per_s": round(64 * 1100 / 21, 1), "eval_tokens_per_s": 5000.0, "engine_start_s": 30.0}
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
    sizes = ["--prompts", "4", "--completion-length", "4096", "--micro-batch", "1"]
    gpu = gc.build_recipe(gc.parse_args(sizes), "/m")["train"]
    cpu = gc.build_recipe(gc.parse_args(["--cpu-smoke", *sizes]), "/m")["train"]
    assert (gpu["bf16"], gpu["gradient_checkpointing"], gpu["vllm_gpu_memory_utilization"]) == (True, True, 0.5)
    assert (cpu["bf16"], cpu["gradient_checkpointing"], cpu["vllm_gpu_memory_utilization"]) == (False, False, None)
    device_keys = ("bf16", "gradient_checkpointing", "vllm_gpu_memory_utilization")
    assert {k: v for k, v in gpu.items() if k not in device_keys} \
        == {k: v for k, v in cpu.items() if k not in ("bf16", "gradient_checkpointing", "vllm_gpu_memory_utilization")}
    assert (gpu["max_completion_length"], gpu["prompts_per_step"], gpu["use_vllm"], gpu["reward"]) == (
        4096, 4, True, "coin")
