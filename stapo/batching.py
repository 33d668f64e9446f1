"""Token-budget micro-batches: verl's dynamic batch size (``use_dynamic_bsz``, ``ppo_max_token_len_per_gpu``).

An optimiser step's completions on one process are split into M micro-batches, where
    M = max over processes of min(N, ⌈Σ_i len_i / budget⌉)        (verl ``rearrange_micro_batches``)
len_i = prompt + completion tokens of completion i (verl's ``attention_mask.sum(-1)``), and the N completions are
assigned to the M micro-batches by Karmarkar–Karp's largest differencing method, which balances the micro-batches'
token sums (verl ``get_seqlen_balanced_partitions(..., equal_size=False)``: same algorithm and tie-breaking, so the
same partitions; tests/test_batching.py checks them against a transcription of verl 0.4.0's code). Every process
gets the same M (verl's ``same_micro_num_in_dp``), so collectives inside a micro-batch line up. As in verl, a
micro-batch may hold more than ``budget`` tokens: the budget sets the count M, the balancing the contents.

A micro-batch is a row subset of the step's tensors with its own padding only (:func:`select_rows`: prompts are
left-padded to the micro-batch's longest prompt, completions right-padded to its longest completion), or, padding-
free, one packed row whose position ids restart at every sequence (:func:`pack`; transformers then masks attention
to each sequence, for sdpa/eager/flash alike).
"""

from __future__ import annotations

import heapq
import math

import torch
import torch.distributed as dist
from torch import Tensor

__all__ = ["balanced_partitions", "micro_batch_count", "token_budget_partitions", "sequence_lengths",
           "select_rows", "pack", "unpack", "padded_fraction"]


# ------------------------------------------------------------------------------------- Karmarkar–Karp


class _Part:
    """One micro-batch being built: its (index, length) items and their sum."""

    __slots__ = ("items", "total")

    def __init__(self, items=()):
        self.items = list(items)
        self.total = sum(v for _, v in self.items)

    def key(self):  # verl's Set.__lt__: by sum, then item count, then the items themselves
        return self.total, len(self.items), self.items


class _State:
    """k parts, kept in decreasing order; the heap pops the state of largest spread first (verl's State)."""

    __slots__ = ("parts",)

    def __init__(self, parts: list[_Part]):
        self.parts = sorted(parts, key=_Part.key, reverse=True)

    @property
    def spread(self) -> int:
        return self.parts[0].total - self.parts[-1].total

    def __lt__(self, other: _State) -> bool:
        if self.spread != other.spread:
            return self.spread > other.spread
        return self.parts[0].key() > other.parts[0].key()

    def merge(self, other: _State) -> None:
        """Largest part with the other's smallest, and so on (the differencing step)."""
        k = len(self.parts)
        merged = [_Part(a.items + b.items) for a, b in zip(self.parts, reversed(other.parts))]
        assert len(merged) == k
        self.parts = sorted(merged, key=_Part.key, reverse=True)


def balanced_partitions(lengths: list[int], k: int) -> list[list[int]]:
    """Indices of ``lengths`` in ``k`` non-empty parts of balanced sums (largest differencing; verl 0.4.0
    ``get_seqlen_balanced_partitions(lengths, k, equal_size=False)``), each part's indices ascending, parts in
    verl's order (decreasing sum)."""
    if not 1 <= k <= len(lengths):
        raise ValueError(f"cannot split {len(lengths)} sequences into {k} micro-batches")
    heap: list[_State] = []
    for length, i in sorted((int(v), i) for i, v in enumerate(lengths)):
        heapq.heappush(heap, _State([_Part([(i, length)])] + [_Part() for _ in range(k - 1)]))
    while len(heap) > 1:
        first, second = heapq.heappop(heap), heapq.heappop(heap)
        first.merge(second)
        heapq.heappush(heap, first)
    parts = [sorted(i for i, _ in p.items) for p in heap[0].parts]
    if any(not p for p in parts):
        raise AssertionError(f"an empty micro-batch among {k} for lengths {lengths}")  # verl asserts the same
    return parts


def micro_batch_count(lengths: list[int], budget: int, *, reduce_max=None) -> int:
    """M = min(N, ⌈Σ lengths / budget⌉), the maximum over processes (``reduce_max``: int -> int; default an
    all-reduce MAX when torch.distributed is initialised)."""
    m = min(len(lengths), math.ceil(sum(lengths) / budget))
    if reduce_max is None and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        device = "cuda" if dist.get_backend() == "nccl" else "cpu"
        t = torch.tensor([m], device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t.item())
    return reduce_max(m) if reduce_max is not None else m


def token_budget_partitions(lengths: list[int], budget: int, *, reduce_max=None) -> list[list[int]]:
    """verl's ``rearrange_micro_batches``: the micro-batches (index lists) of one process's step."""
    longest = max(lengths, default=0)
    if budget < longest:
        raise ValueError(f"train.micro_batch_tokens {budget} is below a sequence of {longest} tokens")
    return balanced_partitions(lengths, micro_batch_count(lengths, budget, reduce_max=reduce_max))


# ------------------------------------------------------------------------------------------ tensors


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


def pack(prompt_ids: Tensor, prompt_mask: Tensor, completion_ids: Tensor, completion_mask: Tensor):
    """Padding-free: the real tokens of every row in one row. Returns (input_ids [1, L], position_ids [1, L],
    labels [1, L] (completion tokens, else -100), spans [(start of completion, completion length)] per row)."""
    ids, pos, labels, spans, start = [], [], [], [], 0
    for p_ids, p_m, c_ids, c_m in zip(prompt_ids, prompt_mask.bool(), completion_ids, completion_mask.bool()):
        p, c = p_ids[p_m], c_ids[: int(c_m.nonzero().max()) + 1 if c_m.any() else 0]
        n = p.numel() + c.numel()
        ids += [p, c]
        pos.append(torch.arange(n, device=p.device))
        labels += [torch.full_like(p, -100), c]
        spans.append((start + p.numel(), c.numel()))
        start += n
    return (torch.cat(ids)[None], torch.cat(pos)[None], torch.cat(labels)[None], spans)


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
