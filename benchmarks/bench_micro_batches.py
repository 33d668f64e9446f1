"""Micro-batching of one optimiser step: fixed micro-batches (TRL's) against a token budget (verl's dynamic bsz).

One optimiser step of N completions with a long-tailed length distribution like the paper's (most responses
short, a few near the cap), scaled to the tiny model: completion lengths ~ lognormal(median 40) capped at
``--cap`` tokens, prompts of 16-64 tokens. Its forward + backward through ``StapoGRPOTrainer._compute_loss``
(method justrl, token-mean) for
    micro-batch 1       TRL's fixed micro-batch of 1 completion, padded (as TRL's buffer is) to the step's widths
    micro-batch 4       TRL's fixed micro-batch of 4 completions, same padding
    budget (padded)     train.micro_batch_tokens: verl's Karmarkar–Karp micro-batches, each padded to its own
                        longest prompt and completion (stapo.train.layout)
    budget (packed)     the same micro-batches, padding-free (train.padding_free)
and per row: median seconds per step, padded-token fraction (padding positions / all positions the forwards
process) and the step gradient's relative L2 difference to one unpadded-per-row reference (micro-batch 1 with
each row trimmed to its own length). Target (issue 30): budget ≥ 1.5× faster than micro-batch 1, ≤ 5 % padded
tokens, gradient ≤ 1e-6 relative.

    python benchmarks/bench_micro_batches.py [--completions 64] [--cap 512] [--budget 1024] [--repeats 3]

Measured 2026-12-05, CPU, 1 thread of 2 cores (load ~1: nothing else running), bundled:tiny-qwen3, --completions 32
--cap 256 --budget 512 --repeats 2 (32 completions, 3,262 tokens, longest 277, median 88 -> 7 micro-batches):
    variant            median s/step speed-up  padded grad rel diff
    micro-batch 1             48.063     1.00   68.1%      4.11e-07
    micro-batch 4             58.918     0.82   68.1%      4.33e-07
    budget (padded)           37.739     1.27   51.0%      4.20e-07
    budget (packed)           18.709     2.57    0.0%      2.52e-07
The packed budget meets the targets (2.57x, 0 % padding, 2.5e-7); padded within its micro-batch it does not (51 %
padding: Karmarkar–Karp balances token sums, so a micro-batch mixes long and short rows). TRL's fixed micro-batches
keep the rollout batch's padding (every row as wide as the step's longest), hence 68 % for micro-batch 1. No GPU was
lent to this session, so there is no GPU row.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import stapo.train.trainer as T  # noqa: E402
from stapo.train import layout, partition
from stapo import study  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def step_batch(n: int, cap: int, seed: int = 0) -> dict:
    """One step's completions in TRL's layout: prompts left-padded, completions right-padded to the step's widths."""
    g = torch.Generator().manual_seed(seed)
    c_len = torch.exp(torch.randn(n, generator=g) * 1.0 + 3.7).long().clamp(1, cap)  # median ~40, a tail at the cap
    p_len = torch.randint(16, 65, (n,), generator=g)
    pw, cw = int(p_len.max()), int(c_len.max())
    prompt_mask = (torch.arange(pw)[None] >= (pw - p_len)[:, None]).long()
    completion_mask = (torch.arange(cw)[None] < c_len[:, None]).long()
    return {"prompt_ids": torch.randint(100, 5000, (n, pw), generator=g) * prompt_mask, "prompt_mask": prompt_mask,
            "completion_ids": torch.randint(100, 5000, (n, cw), generator=g) * completion_mask,
            "completion_mask": completion_mask, "advantages": torch.randn(n, generator=g),
            "num_items_in_batch": completion_mask.sum()}


def build(out: Path, n: int, model: str):
    recipe = study.load(ROOT / "configs" / "tiny.yaml")
    recipe["models"], recipe["workflow"]["models"] = {"m": {"spec": model, "gpus": 0}}, ["m"]
    recipe["train"].update(prompts_per_generation=n // 4, prompts_per_step=n // 4, num_generations=4,
                           per_device_train_batch_size=1, max_completion_length=512, diagnostics_every=0)
    plan = study.resolve_plan(recipe, "m", "justrl")
    trainer = T.build_trainer(plan, out)
    trainer.model.train()
    return trainer


def run_step(trainer, inputs: dict, mode: str, size: int) -> tuple[float, float, dict]:
    """(seconds, padded fraction, gradients) of one optimiser step's forward + backward."""
    model, n = trainer.model, inputs["advantages"].numel()
    s = trainer.settings
    model.zero_grad()
    t0 = time.perf_counter()
    if mode == "fixed":
        s.micro_batch_tokens, s.padding_free = None, False
        trainer.current_gradient_accumulation_steps = n // size
        parts = [{k: (v[i:i + size] if v.dim() else v) for k, v in inputs.items()} for i in range(0, n, size)]
        for mb in parts:
            trainer._compute_loss(model, mb).backward()
        fraction = layout.padded_fraction(parts)
    elif mode == "trimmed":  # the reference: one completion at a time, no padding at all
        s.micro_batch_tokens, s.padding_free = None, False
        trainer.current_gradient_accumulation_steps = n
        parts = [layout.select_rows(inputs, [i]) for i in range(n)]
        for mb in parts:
            trainer._compute_loss(model, mb).backward()
        fraction = layout.padded_fraction(parts)
    else:
        s.micro_batch_tokens, s.padding_free = size, mode == "packed"
        trainer.current_gradient_accumulation_steps = 1
        trainer._compute_loss(model, inputs).backward()
        rows = partition.token_budget_partitions(lengths := layout.sequence_lengths(inputs), size,
                                                  partition.micro_batch_count(lengths, size))
        fraction = layout.padded_fraction([layout.select_rows(inputs, r) for r in rows], packed=mode == "packed")
    trainer._close_window(model)
    seconds = time.perf_counter() - t0
    return seconds, fraction, {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}


def relative(a: dict, b: dict) -> float:
    num = sum(float((a[k] - b[k]).double().pow(2).sum()) for k in b)
    return (num / sum(float(b[k].double().pow(2).sum()) for k in b)) ** 0.5


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--completions", type=int, default=64)
    ap.add_argument("--cap", type=int, default=512)
    ap.add_argument("--budget", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--model", default="bundled:tiny-qwen3")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    inputs = step_batch(args.completions, args.cap)
    lengths = layout.sequence_lengths(inputs)
    print(f"step: {args.completions} completions, {sum(lengths):,} tokens, longest {max(lengths)}, median "
          f"{int(statistics.median(lengths))}; budget {args.budget} -> "
          f"{partition.micro_batch_count(lengths, args.budget)} micro-batches")
    with tempfile.TemporaryDirectory() as tmp:
        trainer = build(Path(tmp), args.completions, args.model)
        _, _, reference = run_step(trainer, inputs, "trimmed", 1)
        rows = [("micro-batch 1", "fixed", 1), ("micro-batch 4", "fixed", 4),
                ("budget (padded)", "padded", args.budget), ("budget (packed)", "packed", args.budget)]
        times = {name: [] for name, _, _ in rows}
        stats = {}
        for _ in range(args.repeats):  # interleaved, so load drifts hit every row alike
            for name, mode, size in rows:
                seconds, fraction, grads = run_step(trainer, inputs, mode, size)
                times[name].append(seconds)
                stats[name] = (fraction, relative(grads, reference))
    base = statistics.median(times["micro-batch 1"])
    print(f"{'variant':18s} {'median s/step':>13s} {'speed-up':>8s} {'padded':>7s} {'grad rel diff':>13s}")
    for name, _, _ in rows:
        med = statistics.median(times[name])
        fraction, rel = stats[name]
        print(f"{name:18s} {med:13.3f} {base / med:8.2f} {fraction:7.1%} {rel:13.2e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
