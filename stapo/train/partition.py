"""Token-budget micro-batches, the counting half (no tensors): verl's dynamic batch size (``use_dynamic_bsz``,
``ppo_max_token_len_per_gpu``).

Across processes (``train.balance_batch``, verl's ``RayPPOTrainer._balance_batch``, on by default in verl and in
JustRL's run): the rollout batch's N sequences are split into W equal-size parts of balanced token sums
(:func:`rank_partitions`, ``get_seqlen_balanced_partitions(lengths, W, equal_size=True)``); process r trains on the
r-th, its indices in rollout order, and forms its optimiser steps from it as verl's ``batch.split``.

Within a process, an optimiser step's completions are split into M micro-batches, where
    M = max over processes of min(N, ⌈Σ_i len_i / budget⌉)        (verl ``rearrange_micro_batches``)
len_i = prompt + completion tokens of completion i (verl's ``attention_mask.sum(-1)``), and the N completions are
assigned to the M micro-batches by Karmarkar–Karp's largest differencing method, which balances the micro-batches'
token sums (verl ``get_seqlen_balanced_partitions(..., equal_size=False)``: same algorithm and tie-breaking, so the
same partitions; tests/test_batching.py checks them against a transcription of verl 0.4.0's code). Every process
uses the same M (verl's ``same_micro_num_in_dp``), so collectives inside a micro-batch line up: the caller takes
the maximum of :func:`micro_batch_count` over its processes (the trainer, through accelerate) and hands it to
:func:`token_budget_partitions`. As in verl, a micro-batch may hold more than ``budget`` tokens: the budget sets the
count M, the balancing the contents. The tensors of a micro-batch: stapo.train.layout.
"""

from __future__ import annotations

import heapq
import math

__all__ = ["balanced_partitions", "rank_partitions", "micro_batch_count", "token_budget_partitions"]


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


def balanced_partitions(lengths: list[int], k: int, *, equal_size: bool = False) -> list[list[int]]:
    """Indices of ``lengths`` in ``k`` non-empty parts of balanced sums (largest differencing; verl 0.4.0
    ``get_seqlen_balanced_partitions(lengths, k, equal_size)``), each part's indices ascending, parts in verl's order
    (decreasing sum). ``equal_size``: every part holds len / k items (verl seeds the heap with one state per k
    consecutive sorted lengths instead of one per length)."""
    if not 1 <= k <= len(lengths):
        raise ValueError(f"cannot split {len(lengths)} sequences into {k} micro-batches")
    if equal_size and len(lengths) % k:
        raise ValueError(f"cannot split {len(lengths)} sequences into {k} parts of equal size")
    ranked = [(i, length) for length, i in sorted((int(v), i) for i, v in enumerate(lengths))]
    width = k if equal_size else 1
    heap: list[_State] = []
    for start in range(0, len(ranked), width):
        items = ranked[start:start + width]
        heapq.heappush(heap, _State([_Part([item]) for item in items] + [_Part() for _ in range(k - len(items))]))
    while len(heap) > 1:
        first, second = heapq.heappop(heap), heapq.heappop(heap)
        first.merge(second)
        heapq.heappush(heap, first)
    parts = [sorted(i for i, _ in p.items) for p in heap[0].parts]
    if any(not p for p in parts):
        raise AssertionError(f"an empty micro-batch among {k} for lengths {lengths}")  # verl asserts the same
    return parts


def rank_partitions(lengths: list[int], world: int) -> list[list[int]]:
    """verl's ``_balance_batch``: the rollout batch's sequences (``lengths`` = prompt + completion tokens, in rollout
    order) in ``world`` equal-size parts of balanced token sums; part r is process r's share, in rollout order."""
    if len(lengths) % world:
        raise ValueError(f"train.balance_batch: the rollout batch's {len(lengths)} sequences do not split evenly "
                         f"over {world} processes")
    return balanced_partitions(lengths, world, equal_size=True)


def micro_batch_count(lengths: list[int], budget: int) -> int:
    """This process's M = min(N, ⌈Σ lengths / budget⌉); every process must then use the largest over processes."""
    if not lengths:
        raise ValueError("an optimiser step with no completions on this process: there is nothing to split into "
                         "micro-batches (train.prompts_per_step × num_generations must give every process some)")
    return min(len(lengths), math.ceil(sum(lengths) / budget))


def token_budget_partitions(lengths: list[int], budget: int, count: int) -> list[list[int]]:
    """verl's ``rearrange_micro_batches``: the ``count`` micro-batches (index lists) of one process's step, ``count``
    being the largest :func:`micro_batch_count` over the processes."""
    longest = max(lengths, default=0)
    if budget < longest:
        raise ValueError(f"train.micro_batch_tokens {budget} is below a sequence of {longest} tokens")
    return balanced_partitions(lengths, count)
