"""Training metrics: what the trainer sums over an optimiser step, the accuracy metric, and metrics.jsonl.

Every per-token metric of the objective (:data:`STEP_METRICS`) is logged once per optimiser step as its
token-weighted mean over all the step's micro-batches on all processes: Σ n_j·m_j / Σ n_j, n_j the completion
tokens of micro-batch j (:class:`StepAccumulator`, one all-reduce per step).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor
from transformers import TrainerCallback

from stapo.train import step_cost
from stapo.core.atomic import append_line
from stapo.core.schedule import rollout_step

__all__ = ["STEP_METRICS", "StepAccumulator", "accuracy_reward", "MetricsJsonl"]

STEP_METRICS = ("entropy_mean", "candidate_fraction", "silenced_fraction", "kept_fraction", "clip_fraction",
                "clip_fraction_low", "clip_fraction_high", "clip_fraction_dual", "ratio_mean", "kl_mean")


@dataclass
class StepAccumulator:
    """One optimiser step's sums over its micro-batches (float64; this process's, or all processes' once reduced).

    normaliser: the provisional normaliser c the token-mean loss of every micro-batch was divided by (the
        trainer's; None for the sequence-mean loss).
    metric_sums: [len(STEP_METRICS)] Σ n·metric, n = the micro-batch's completion tokens.
    tokens: Σ n. kept: Σ n·kept_fraction, the kept-token count. loss: Σ of the back-propagated losses.
    sequences: [2] Σ L and Σ L² over the micro-batches' sequences, L = prompt + completion tokens (the step's
        model FLOPs, stapo.train.step_cost).
    """

    normaliser: Tensor | None = None
    metric_sums: Tensor | None = None
    tokens: Tensor | None = None
    kept: Tensor | None = None
    loss: Tensor | None = None
    sequences: Tensor | None = None

    def add(self, metrics: dict, completion_mask: Tensor, loss: Tensor, attention_mask: Tensor | None = None) -> None:
        """Add one micro-batch: the objective's ``metrics``, its completion mask, its (detached) loss and the
        attention mask of its prompts + completions (default: the completion mask)."""
        n = completion_mask.sum().float()
        f64 = lambda v: torch.as_tensor(v, dtype=torch.float64, device=n.device)  # noqa: E731
        sums = torch.stack([f64(n * metrics[k]) for k in STEP_METRICS])
        self.metric_sums = sums if self.metric_sums is None else self.metric_sums + sums
        lengths = f64((completion_mask if attention_mask is None else attention_mask).sum(-1))
        for name, value in (("tokens", f64(n)), ("kept", f64(n * metrics["kept_fraction"])), ("loss", f64(loss)),
                            ("sequences", torch.stack([lengths.sum(), (lengths**2).sum()]))):
            mine = getattr(self, name)
            setattr(self, name, value if mine is None else mine + value)

    def flat(self) -> Tensor:
        """[len(STEP_METRICS) + 5] every sum in one vector (the all-reduce's operand)."""
        return torch.cat([self.metric_sums, torch.stack([self.tokens, self.kept, self.loss]), self.sequences])

    def reduced(self, accelerator) -> StepAccumulator:
        """The sums over all processes (one all-reduce); the normaliser is every process's own."""
        m = len(STEP_METRICS)
        flat = accelerator.reduce(self.flat(), reduction="sum")
        return StepAccumulator(self.normaliser, flat[:m], flat[m], flat[m + 1], flat[m + 2], flat[m + 3:])

    def means(self) -> dict[str, float]:
        """The token-weighted mean of every STEP_METRICS entry (0 for a step without completion tokens)."""
        return {key: float(s / self.tokens.clamp(min=1.0)) for key, s in zip(STEP_METRICS, self.metric_sums)}


def accuracy_reward(reward_fn):
    """Wrap a ±1 / 1-0 reward so each call also logs ``accuracy`` (fraction of completions with reward > 0)."""

    def reward(prompts=None, completions=None, log_metric=None, **kwargs):
        values = reward_fn(prompts=prompts, completions=completions, **kwargs)
        if log_metric is not None and values:
            log_metric("accuracy", sum(v > 0 for v in values) / len(values))
        return values

    reward.__name__ = reward_fn.__name__
    return reward


# metrics.jsonl field <- key in TRL's per-step logs (TRL averages its per-micro-batch lists over the step)
LOG_FIELDS = {
    "loss": "objective_loss", "reward_mean": "reward", "reward_std": "reward_std", "accuracy": "accuracy",
    "grad_norm": "grad_norm", "response_length_mean": "completions/mean_length", "lr": "learning_rate",
    **{k: k for k in STEP_METRICS}, "completion_tokens": "completion_tokens",
}


class MetricsJsonl(TrainerCallback):
    """Append one JSON line per optimiser step to ``path`` (flushed + fsynced, so a kill loses at most a line).

    TRL logs the rollout's fields (reward, accuracy, lengths) only on the optimiser step that generated it; the
    other k − 1 steps of the rollout batch repeat them, so every line is complete. Each line also carries what the
    step cost (stapo.train.step_cost: seconds per part, tokens/s per GPU, MFU, peak memory).
    """

    ROLLOUT_FIELDS = ("reward_mean", "reward_std", "accuracy", "response_length_mean")

    def __init__(self, path: Path, k: int = 1):
        self.path, self.k = Path(path), k  # k optimiser steps per rollout step
        self._t0 = None
        self._seconds = None
        self._memory = None
        self._rollout: dict = {}
        self.device, self.peak_tflops = step_cost.device_peak()

    def on_step_begin(self, args, state, control, **kwargs):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        self._t0 = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
            self._memory = torch.cuda.max_memory_allocated() / 2**30
        self._seconds = time.perf_counter() - self._t0 if self._t0 is not None else None

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs or "objective_loss" not in logs:
            return
        row = {"step": state.global_step, "rollout_step": rollout_step(state.global_step, self.k)}
        for name, key in LOG_FIELDS.items():
            value = logs.get(key)
            row[name] = None if value is None or (isinstance(value, float) and math.isnan(value)) else value
        if "reward" in logs:
            self._rollout = {name: row[name] for name in self.ROLLOUT_FIELDS}
        else:
            row.update(self._rollout)
        row["step_seconds"] = self._seconds
        row.update(step_cost.cost_fields(logs, self._seconds, args.world_size, self.device, self.peak_tflops,
                                         self._memory))
        append_line(self.path, json.dumps(row), inside=self.path.parent)
