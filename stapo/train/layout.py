"""Token-budget micro-batches, the tensor half: a micro-batch is a row subset of the step's tensors with its own
padding only (:func:`select_rows`: prompts left-padded to the micro-batch's longest prompt, completions right-padded
to its longest completion), or, padding-free, one packed row whose position ids restart at every sequence
(:func:`pack`; transformers then masks attention to each sequence, for sdpa/eager/flash alike). Which rows go
together: stapo.train.partition.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

__all__ = ["Packed", "sequence_inputs", "attention_mask", "sequence_lengths", "select_rows", "pack", "unpack",
           "padded_fraction"]


class Packed(NamedTuple):
    """The real tokens of several rows in one row (all [1, L])."""

    input_ids: Tensor
    position_ids: Tensor  # restarting at 0 at every sequence
    labels: Tensor  # the completion tokens, -100 elsewhere
    spans: list[tuple[int, int]]  # per row: (start of its completion in the packed row, its completion length)


def sequence_inputs(batch: dict) -> tuple[Tensor, Tensor]:
    """(input_ids, attention_mask) [B, P + T] of a TRL batch: its left-padded prompts followed by its right-padded
    completions, as the policy's forward reads them."""
    return torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1), attention_mask(batch)


def attention_mask(batch: dict) -> Tensor:
    """The attention mask [B, P + T] of a TRL batch: its prompt mask followed by its completion mask."""
    return torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)


def sequence_lengths(batch: dict) -> list[int]:
    """Prompt + completion tokens of each row of a TRL batch (verl: ``attention_mask.sum(-1)``)."""
    return (batch["prompt_mask"].sum(-1) + batch["completion_mask"].sum(-1)).tolist()


def select_rows(batch: dict, rows: list[int]) -> dict:
    """The micro-batch ``rows`` of a TRL batch, with only its own padding: per-row tensors indexed, prompt
    columns (``prompt_*``, left-padded) trimmed to its longest prompt, completion-width columns to its longest
    completion. Scalars and non-tensors are kept as they are."""
    n, width = batch["completion_ids"].shape
    idx = torch.as_tensor(rows, device=batch["completion_ids"].device)
    prompt_mask, completion_mask = batch["prompt_mask"][idx], batch["completion_mask"][idx]
    first = int(prompt_mask.any(0).float().argmax()) if prompt_mask.any() else prompt_mask.size(1)
    last = int(completion_mask.any(0).nonzero().max()) + 1 if completion_mask.any() else 0
    out = {}
    for key, value in batch.items():
        if not isinstance(value, Tensor) or value.dim() == 0 or value.size(0) != n:
            out[key] = value
            continue
        value = value[idx]
        if key.startswith("prompt_") and value.dim() >= 2:
            value = value[:, first:]
        elif value.dim() >= 2 and value.size(1) == width:
            value = value[:, :last]
        out[key] = value
    return out


def pack(prompt_ids: Tensor, prompt_mask: Tensor, completion_ids: Tensor, completion_mask: Tensor) -> Packed:
    """Padding-free: the real tokens of every row in one row (:class:`Packed`)."""
    ids, pos, labels, spans, start = [], [], [], [], 0
    for p_ids, p_m, c_ids, c_m in zip(prompt_ids, prompt_mask.bool(), completion_ids, completion_mask.bool()):
        p, c = p_ids[p_m], c_ids[: int(c_m.nonzero().max()) + 1 if c_m.any() else 0]
        n = p.numel() + c.numel()
        ids += [p, c]
        pos.append(torch.arange(n, device=p.device))
        labels += [torch.full_like(p, -100), c]
        spans.append((start + p.numel(), c.numel()))
        start += n
    return Packed(torch.cat(ids)[None], torch.cat(pos)[None], torch.cat(labels)[None], spans)


def unpack(values: Tensor, spans: list[tuple[int, int]], width: int) -> Tensor:
    """[1, L] per-token values of a packed row -> [B, width], right-padded with zeros."""
    out = values.new_zeros(len(spans), width)
    for row, (start, n) in enumerate(spans):
        out[row, :n] = values[0, start : start + n]
    return out


def padded_fraction(batches: list[dict], packed: bool = False) -> float:
    """Padding positions over all positions the forward passes process (0 for padding-free micro-batches)."""
    real = padded = 0
    for b in batches:
        tokens = int(b["prompt_mask"].sum() + b["completion_mask"].sum())
        shape = b["prompt_mask"].size(0) * (b["prompt_mask"].size(1) + b["completion_mask"].size(1))
        real, padded = real + tokens, padded + (tokens if packed else shape)
    return 1.0 - real / max(1, padded)
