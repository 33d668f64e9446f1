"""What one optimiser step cost: where its time went, the tokens it processed, how far it ran from the device's peak.

metrics.jsonl fields (:func:`cost_fields`; verl's metric in brackets, verl/trainer/ppo/metric_utils.py):

    gen_seconds           [timing_s/gen] the rollout (generation, rewards, advantages) less the forwards below
    forward_seconds       [timing_s/old_log_prob + timing_s/ref] the rollout's no-grad π_old and reference forwards
    update_seconds        [timing_s/update_actor] the rest of the step: loss forwards, backwards, optimiser step
    step_seconds          [timing_s/step] the whole optimiser step
    step_tokens           prompt + completion tokens the update processed, all processes
    tokens_per_s_per_gpu  [perf/throughput] step_tokens / step_seconds / processes
    mfu                   [perf/mfu/actor] the update's model FLOPs / (update_seconds · processes · peak); null when
                          the peak is unknown (CPU, or a GPU not in PEAK_TFLOPS: set STAPO_PEAK_TFLOPS)
    device, peak_tflops   the device the run measured on and its dense bf16 peak (TFLOP/s per device)
    peak_memory_gib       [perf/max_memory_allocated_gb] torch.cuda.max_memory_allocated over the step on the
                          process that writes the line; null on CPU

TRL generates a rollout batch on the first of its k optimiser steps: that step carries gen_seconds and
forward_seconds, the other k − 1 carry 0 (a rollout step's cost is the sum of its k lines).

Model FLOPs of the update (:func:`update_flops`, verl's FlopsCounter for Qwen2/3): 6·N·tokens for the matmuls of
forward and backward, N the parameters less the input embedding (a lookup, not a matmul), plus the attention
scores and values, 12 · Σ L² · head_dim · heads · layers over the sequences' lengths L. Model FLOPs, not hardware
FLOPs: activation checkpointing's recomputed forward is not counted (MFU, not HFU).
"""

from __future__ import annotations

import os
import re
import time
from contextlib import contextmanager

import torch

__all__ = ["PEAK_TFLOPS", "COST_FIELDS", "device_peak", "model_flop_params", "update_flops", "StepClock",
           "cost_fields"]

# Dense bf16 tensor-core peak per device, TFLOP/s (vendor data sheets; SXM boards unless the name says PCIe).
# First match wins: H200 before H20, PCIe before the bare name.
PEAK_TFLOPS = (
    (r"H100.*PCIe", 756.0), (r"\bH100\b", 989.0), (r"\bH200\b", 989.0), (r"\bH800\b", 989.0), (r"\bH20\b", 148.0),
    (r"\bGH200\b", 989.0), (r"\bB200\b", 2250.0), (r"\bA100\b", 312.0), (r"\bA800\b", 312.0), (r"\bL40S\b", 362.0),
    (r"\bL40\b", 181.0), (r"\bA10G?\b", 125.0), (r"\bL4\b", 121.0),
)
COST_FIELDS = ("gen_seconds", "forward_seconds", "update_seconds", "step_tokens", "tokens_per_s_per_gpu", "mfu",
               "device", "peak_tflops", "peak_memory_gib")


def device_peak() -> tuple[str, float | None]:
    """(this process's device name, its peak TFLOP/s or None). STAPO_PEAK_TFLOPS overrides the table."""
    name = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    if os.environ.get("STAPO_PEAK_TFLOPS"):
        return name, float(os.environ["STAPO_PEAK_TFLOPS"])
    if name == "cpu":
        return name, None
    return name, next((peak for pattern, peak in PEAK_TFLOPS if re.search(pattern, name)), None)


def model_flop_params(model) -> dict:
    """What :func:`update_flops` needs of ``model`` (before FSDP/DeepSpeed wrap it): N (parameters less an untied
    input embedding), layers, heads, head_dim."""
    embedding, head = model.get_input_embeddings(), model.get_output_embeddings()
    numel = lambda p: getattr(p, "ds_numel", None) or p.numel()  # noqa: E731  (ZeRO-3 partitions at load)
    n = sum(numel(p) for p in model.parameters())
    if head is None or embedding.weight is not head.weight:
        n -= numel(embedding.weight)
    cfg = model.config
    heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    return {"params": n, "layers": cfg.num_hidden_layers, "heads": heads, "head_dim": head_dim}


def update_flops(shape: dict, tokens: float, tokens_sq: float) -> float:
    """Model FLOPs of one forward + backward over sequences of Σ L = ``tokens`` and Σ L² = ``tokens_sq``."""
    return 6.0 * shape["params"] * tokens + 12.0 * tokens_sq * shape["head_dim"] * shape["heads"] * shape["layers"]


def _synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()  # a CUDA kernel still running belongs to the part that launched it


class StepClock:
    """Seconds of the rollout and of its no-grad forwards, summed until :meth:`take` (one optimiser step)."""

    def __init__(self):
        self.rollout = self.forward = 0.0
        self.in_rollout = False

    @contextmanager
    def timing(self, part: str):
        """Add the block's wall time to ``part`` ("rollout" or "forward")."""
        _synchronize()
        t0, outer = time.perf_counter(), self.in_rollout
        self.in_rollout = self.in_rollout or part == "rollout"
        try:
            yield
        finally:
            _synchronize()
            self.in_rollout = outer
            setattr(self, part, getattr(self, part) + time.perf_counter() - t0)

    def take(self) -> tuple[float, float]:
        """(generation seconds, forward seconds) since the last take; the clock restarts at 0."""
        gen, forward = self.rollout - self.forward, self.forward
        self.rollout = self.forward = 0.0
        return gen, forward


def cost_fields(logs: dict, step_seconds: float | None, processes: int, device: str, peak_tflops: float | None,
                peak_memory_gib: float | None) -> dict:
    """The COST_FIELDS of one metrics.jsonl line from the trainer's logged ``gen_seconds``, ``forward_seconds``,
    ``step_tokens`` and ``step_flops`` and the callback's own step time and memory (None where one is missing)."""
    gen, forward, tokens, flops = (logs.get(k) for k in ("gen_seconds", "forward_seconds", "step_tokens",
                                                         "step_flops"))
    update = None
    if None not in (step_seconds, gen, forward):
        update = max(step_seconds - gen - forward, 0.0)
    rate = tokens / step_seconds / processes if tokens is not None and step_seconds else None
    mfu = None
    if flops is not None and update and peak_tflops:
        mfu = flops / (update * processes * peak_tflops * 1e12)
    return {"gen_seconds": gen, "forward_seconds": forward, "update_seconds": update, "step_tokens": tokens,
            "tokens_per_s_per_gpu": rate, "mfu": mfu, "device": device, "peak_tflops": peak_tflops,
            "peak_memory_gib": peak_memory_gib}
