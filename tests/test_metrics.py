"""stapo.train.metrics.StepAccumulator: token-weighted step metrics, kept count and loss summed over micro-batches and
processes (two ranks simulated by a stub accelerator whose all-reduce adds the other rank's vector)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from stapo.train.metrics import STEP_METRICS, StepAccumulator


def _metrics(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {k: float(torch.rand(1, generator=g)) for k in STEP_METRICS}


def _mask(lengths: list[int]) -> torch.Tensor:
    return torch.tensor([[1] * n + [0] * (8 - n) for n in lengths])


# (rank, micro-batch) -> (completion lengths, metrics, loss)
BATCHES = {(0, 0): ([3, 8], _metrics(0), 0.5), (0, 1): ([1, 0], _metrics(1), -0.25),
           (1, 0): ([5, 5], _metrics(2), 2.0), (1, 1): ([0, 0], _metrics(3), 0.0)}


def _rank(rank: int) -> StepAccumulator:
    acc = StepAccumulator(normaliser=torch.tensor(7.0 + rank))
    for j in (0, 1):
        lengths, metrics, loss = BATCHES[(rank, j)]
        acc.add(metrics, _mask(lengths), torch.tensor(loss))
    return acc


def test_reduced_sums_are_token_weighted_over_micro_batches_and_ranks():
    ranks = [_rank(0), _rank(1)]
    flat = [a.flat() for a in ranks]
    accelerator = SimpleNamespace(reduce=lambda t, reduction: t + flat[1] if reduction == "sum" else None)
    total = ranks[0].reduced(accelerator)
    tokens = sum(sum(lengths) for lengths, _, _ in BATCHES.values())
    assert float(total.tokens) == tokens == 22
    assert float(total.loss) == pytest.approx(2.25)
    kept = sum(sum(lengths) * m["kept_fraction"] for lengths, m, _ in BATCHES.values())
    assert float(total.kept) == pytest.approx(kept)
    means = total.means()
    assert list(means) == list(STEP_METRICS)
    for key in STEP_METRICS:
        expected = sum(sum(lengths) * m[key] for lengths, m, _ in BATCHES.values()) / tokens
        assert means[key] == pytest.approx(expected, rel=1e-6), key
    lengths = [n for ls, _, _ in BATCHES.values() for n in ls]  # no attention mask given: the completions'
    assert total.sequences.tolist() == [sum(lengths), sum(n * n for n in lengths)]
    assert float(total.normaliser) == 7.0  # each rank keeps its own provisional normaliser
    assert all(t.dtype == torch.float64 for t in (total.metric_sums, total.tokens, total.kept, total.loss))


def test_sequences_count_prompt_and_completion_tokens():
    acc = StepAccumulator()
    attention = torch.tensor([[0, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]])  # left-padded prompt + completion
    acc.add(_metrics(5), _mask([2, 5]), torch.tensor(0.0), attention)
    acc.add(_metrics(6), _mask([1, 1]), torch.tensor(0.0), attention[:1])
    assert acc.sequences.tolist() == [4 + 6 + 4, 16 + 36 + 16] and float(acc.tokens) == 9


def test_step_without_tokens_has_zero_means():
    acc = StepAccumulator()
    acc.add(_metrics(4), _mask([0, 0]), torch.tensor(0.0))
    assert acc.reduced(SimpleNamespace(reduce=lambda t, reduction: t)).means() == {k: 0.0 for k in STEP_METRICS}
