"""Overhead of ``stapo train`` over plain TRL: median optimiser-step time and peak RSS.

Variants, same model, data, batch and generation settings (configs/tiny.yaml scaled down, bundled:tiny-qwen3):
    trl-dapo      trl.GRPOTrainer with loss_type="dapo" (the JustRL objective inside TRL)
    stapo-justrl  stapo.train.trainer.StapoGRPOTrainer, method justrl
    stapo-stapo   stapo.train.trainer.StapoGRPOTrainer, method stapo (S2T mask)
    stapo-diag    method stapo with token diagnostics every step (train.diagnostics_every=1); its cost is
                  reported against stapo-stapo (target ≤ 1.05)
Each trial is a fresh subprocess (so peak RSS is per variant); trials are interleaved round-robin so machine load
drifts hit every variant alike. The reward is a deterministic coin on the completion text so that advantages are
non-zero and the S2T mask does real work. Target: ratios ≤ 1.05.

A timed step is one training step in the paper's unit: a rollout batch of 8 prompts × 4 completions (generation)
and its 2 optimiser updates of 16 completions each (the paper: 4 updates), so TRL runs its no-grad π_old forward
for every variant, and stapo's mini-batch thresholds (quantile_scope: mini_batch, the default) reuse it.

    python benchmarks/bench_trainer.py [--rounds 3] [--steps 4] [--model bundled:tiny-qwen3]

Measured 2026-12-04 after issue 19 (named protocols: loss_agg_mode / quantile_scope values, FSDP engine detection,
train.prompt, report_to; the default protocol token-mean + mini_batch), quiet machine, --rounds 2 --steps 3
--variants trl-dapo,stapo-justrl,stapo-stapo (4 timed training steps each):
    variant        median step s  ratio  peak RSS MB  ratio
    trl-dapo              29.073  1.000         1696  1.000
    stapo-justrl          30.256  1.041         1667  0.983
    stapo-stapo           30.118  1.036         1685  0.993

Measured 2026-12-02 after the step-unit / mini-batch-scope change (a timed step = one rollout batch and its 2
updates; stapo with quantile_scope mini_batch), quiet machine (load ~1), --rounds 3 --steps 3 --variants
trl-dapo,stapo-justrl,stapo-stapo (6 timed training steps each; step times spread ±10 % between trials):
    variant        median step s  ratio  peak RSS MB  ratio
    trl-dapo              20.383  1.000         1247  1.000
    stapo-justrl          20.194  0.991         1222  0.981
    stapo-stapo           19.799  0.971         1224  0.982

Earlier (one optimiser step per rollout, micro-batch scope), 2 CPU cores shared with two other jobs (load average
~5), --rounds 2 --steps 3
(4 timed steps per variant; noisy):
    variant        median step s  ratio  peak RSS MB  ratio
    trl-dapo              33.781  1.000         1254  1.000
    stapo-justrl          35.133  1.040         1262  1.006
    stapo-stapo           35.405  1.048         1251  0.997
Diagnostics every step, quiet machine, --rounds 3 --steps 4 --variants stapo-stapo,stapo-diag (9 timed steps each):
    with Σπ² from a second TRL fused head over every position:   1.095 and 1.049 (two runs; target NOT met)
    with Σπ² recomputed for the positive-advantage tokens only:   stapo-stapo 11.756 s, stapo-diag 11.952 s = 1.017,
                                                                  peak RSS 1237 vs 1256 MB (1.016)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import zlib

VARIANTS = ("trl-dapo", "stapo-justrl", "stapo-stapo", "stapo-diag")


def coin(prompts=None, completions=None, **kwargs):
    return [1.0 if zlib.crc32(c.encode()) % 2 else -1.0 for c in completions]


def worker(variant: str, steps: int, model: str) -> dict:
    """One trial: build the trainer, run ``steps`` optimiser steps, report per-step seconds and peak RSS."""
    import torch
    from transformers import TrainerCallback

    import stapo.train.trainer as T
    from stapo import study
    from stapo.tasks.rewards import REWARDS

    torch.set_num_threads(1)
    REWARDS["coin"] = coin
    recipe = study.load(os.path.join(os.path.dirname(__file__), "..", "configs", "tiny.yaml"))
    recipe["models"]["bench"] = {"spec": model}
    recipe["train"].update(dataset={"name": "synthetic-arith", "n": 64, "difficulty": 1, "seed": 0}, reward="coin",
                           max_steps=steps, save_steps=10_000, warmup_steps=0, prompts_per_generation=8,
                           num_generations=4, prompts_per_step=4, per_device_train_batch_size=8,
                           max_completion_length=16, diagnostics_every=1 if variant == "stapo-diag" else 0)
    method = "justrl" if variant in ("trl-dapo", "stapo-justrl") else "stapo"
    plan = study.resolve_plan(recipe, "bench", method)

    times: list[float] = []

    class StepClock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            times.append(time.perf_counter() - self.t0)

    with tempfile.TemporaryDirectory() as out:
        trainer = T.build_trainer(plan, out, plain=variant == "trl-dapo", callbacks=[StepClock()], disable_tqdm=True)
        trainer.train()
    k = T.optimizer_steps_per_rollout(plan.settings)  # optimiser steps per training (rollout) step
    per_rollout = [sum(times[i:i + k]) for i in range(0, len(times), k)]
    return {"variant": variant, "step_seconds": per_rollout,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def _trial(variant: str, steps: int, model: str) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1"}
    proc = subprocess.run([sys.executable, __file__, "--worker", variant, "--steps", str(steps), "--model", model],
                          capture_output=True, text=True, env=env, check=False)
    if proc.returncode:
        raise RuntimeError(f"{variant} trial failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=4, help="training (rollout) steps per trial; the first is dropped")
    p.add_argument("--model", default="bundled:tiny-qwen3")
    p.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset of " + ",".join(VARIANTS))
    p.add_argument("--worker", choices=VARIANTS, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker, args.steps, args.model)))
        return 0
    variants = [v for v in VARIANTS if v in args.variants.split(",")]
    steps = {v: [] for v in variants}
    rss = {v: [] for v in variants}
    for r in range(args.rounds):
        for v in variants:
            result = _trial(v, args.steps, args.model)
            steps[v] += result["step_seconds"][1:]  # drop the first step (allocator / lazy-init warm-up)
            rss[v].append(result["peak_rss_mb"])
            print(f"round {r + 1}/{args.rounds} {v:13s} steps {['%.2f' % s for s in result['step_seconds']]} "
                  f"peak RSS {result['peak_rss_mb']:.0f} MB", flush=True)
    base = variants[0]  # trl-dapo unless a subset is asked for
    base_t, base_m = statistics.median(steps[base]), statistics.median(rss[base])
    print(f"\n{'variant':13s} {'median step s':>14s} {'ratio':>6s} {'peak RSS MB':>12s} {'ratio':>6s}  (n steps)")
    for v in variants:
        t, m = statistics.median(steps[v]), statistics.median(rss[v])
        print(f"{v:13s} {t:14.3f} {t / base_t:6.3f} {m:12.0f} {m / base_m:6.3f}  ({len(steps[v])})")
    if {"stapo-diag", "stapo-stapo"} <= set(variants):
        diag = statistics.median(steps["stapo-diag"]) / statistics.median(steps["stapo-stapo"])
        print(f"diagnostics every step: stapo-diag / stapo-stapo step time = {diag:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
