"""Cost of the objectives and of the chunked token statistics at Qwen3 scale, on CPU (fp32).

(a) token_stats + policy_loss + backward at N = 4,096 tokens × V = 151,936 for justrl, stapo and entropy20:
    median wall time and peak extra RSS, as ratios to justrl (target: stapo/justrl ≤ 1.02 in both).
(b) peak extra RSS of the statistics (forward, and forward + backward) for the chunked implementation vs a naive
    full log_softmax, as a fraction of the logits' size (target: chunked ≤ 0.15×).

Peak RSS is read from /proc/self/status (VmHWM) after resetting it through /proc/self/clear_refs, so each
measurement sees only its own allocations (large tensors are mmap-backed and returned to the OS on free).
Methods are interleaved over repetitions so drift on a shared machine hits all of them alike.

    python benchmarks/bench_objectives.py [--tokens 4096] [--vocab 151936] [--reps 5]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

import torch

from stapo.losses.policy import policy_loss
from stapo.study import OBJECTIVES

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the chunked kernel is a test helper
from helpers.tokenstats import naive_token_stats, token_stats  # noqa: E402


def _rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(field)


def _measure(fn) -> tuple[float, float]:
    """(seconds, peak RSS above the starting RSS in bytes) of fn()."""
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    start = _rss_kib("VmRSS")
    t0 = time.perf_counter()
    fn()
    seconds = time.perf_counter() - t0
    return seconds, (_rss_kib("VmHWM") - start) * 1024.0


def _batch(tokens: int, vocab: int, seed: int = 0):
    """A [B, T] batch with logits [B·T, V]; rare tokens and both advantage signs so STAPO's mask is non-trivial."""
    g = torch.Generator().manual_seed(seed)
    B = 8
    T = tokens // B
    logits = torch.randn(B * T, vocab, generator=g) * 2.0
    labels = torch.randint(0, vocab, (B * T,), generator=g)
    old = torch.randn(B, T, generator=g) * 0.05  # offset of old log-probs from the current ones
    advantages = torch.tensor([1.0, -1.0] * (B // 2))
    mask = torch.ones(B, T, dtype=torch.int)
    return logits, labels, old, advantages, mask, (B, T)


def _step(method, logits, labels, old, advantages, mask, shape, stats_fn):
    x = logits.requires_grad_(True)
    s = stats_fn(x, labels)
    logps = s.logps.view(shape)
    loss, _ = policy_loss(
        OBJECTIVES[method], logps=logps, old_logps=logps.detach() + old, advantages=advantages,
        entropies=s.entropies.view(shape), completion_mask=mask,
    )
    loss.backward()
    x.grad = None  # the logits' gradient is the same for every method; drop it inside the measurement
    x.requires_grad_(False)


def bench_methods(args) -> None:
    logits, labels, old, adv, mask, shape = _batch(args.tokens, args.vocab)
    gib = logits.numel() * 4 / 2**30
    print(f"(a) token_stats + policy_loss + backward, N={args.tokens} V={args.vocab} fp32 (logits {gib:.2f} GiB), "
          f"{torch.get_num_threads()} threads, median of {args.reps}")
    methods = ("justrl", "stapo", "entropy20")
    times = {m: [] for m in methods}
    mems = {m: [] for m in methods}
    _step("justrl", logits, labels, old, adv, mask, shape, token_stats)  # warm-up
    for _ in range(args.reps):
        for m in methods:
            t, mem = _measure(lambda: _step(m, logits, labels, old, adv, mask, shape, token_stats))
            times[m].append(t)
            mems[m].append(mem)
    base_t, base_m = statistics.median(times["justrl"]), statistics.median(mems["justrl"])
    print(f"    {'method':<10} {'time s':>8} {'peak MiB':>9} {'time/justrl':>12} {'mem/justrl':>11}")
    for m in methods:
        t, mem = statistics.median(times[m]), statistics.median(mems[m])
        print(f"    {m:<10} {t:8.3f} {mem / 2**20:9.0f} {t / base_t:12.3f} {mem / base_m:11.3f}")


def _stats_only(stats_fn, logits, labels, backward: bool):
    x = logits.requires_grad_(backward)
    s = stats_fn(x, labels)
    if backward:
        (s.logps.sum() + s.entropies.sum() + s.collision.sum()).backward()
        x.grad = None
        x.requires_grad_(False)
    del s


def bench_memory(args) -> None:
    logits, labels, *_ = _batch(args.tokens, args.vocab)
    size = logits.numel() * 4
    grad_size = size  # backward must materialise d/dlogits: not "extra", subtract it
    print(f"(b) peak extra RSS of the token statistics, as a fraction of the logits ({size / 2**30:.2f} GiB)")
    print(f"    {'implementation':<22} {'forward':>8} {'fwd+bwd (beyond the logits grad)':>34}")
    for name, fn in (("chunked (128 rows)", token_stats), ("naive log_softmax", naive_token_stats)):
        fwd = min(_measure(lambda: _stats_only(fn, logits, labels, False))[1] for _ in range(2))
        both = min(_measure(lambda: _stats_only(fn, logits, labels, True))[1] for _ in range(2)) - grad_size
        print(f"    {name:<22} {fwd / size:8.3f} {max(both, 0.0) / size:34.3f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--reps", type=int, default=5)
    args = p.parse_args()
    torch.manual_seed(0)
    bench_methods(args)
    bench_memory(args)


if __name__ == "__main__":
    main()
