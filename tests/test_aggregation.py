"""stapo.losses.aggregation: one aggregator per loss_agg_mode, on hand-computed numbers — the micro-batch's loss,
the trainer's provisional normaliser, each micro-batch's weight and the step's close (objective loss, gradient
factor). The trainer's use of them is tested end to end in test_trainer.py (gradients equal the objective's)."""

from __future__ import annotations

import pytest
import torch

from stapo.losses.aggregation import (DeepSpeedTokenMean, MicroBatchTokenMean, SeqMeanTokenMean, SeqMeanTokenSum,
                                      SeqMeanTokenSumNorm, TokenMean, aggregation)
from stapo.study.objective import AggMode

# two completions of 3 and 1 kept tokens (masked per-token losses 1, 2, 3 | 4; the rest 0)
MASKED = torch.tensor([[1.0, 2.0, 3.0, 0.0], [4.0, 0.0, 0.0, 0.0]])
KEPT = torch.tensor([[True, True, True, False], [True, False, False, False]])


def test_one_aggregator_per_mode_and_engine():
    assert {m: type(aggregation(m)) for m in AggMode} == {
        AggMode.TOKEN_MEAN: TokenMean, AggMode.TOKEN_MEAN_PER_MICRO_BATCH: MicroBatchTokenMean,
        AggMode.SEQ_MEAN_TOKEN_MEAN: SeqMeanTokenMean, AggMode.SEQ_MEAN_TOKEN_SUM: SeqMeanTokenSum,
        AggMode.SEQ_MEAN_TOKEN_SUM_NORM: SeqMeanTokenSumNorm}
    assert type(aggregation(AggMode.TOKEN_MEAN, deepspeed=True)) is DeepSpeedTokenMean
    for mode in list(AggMode)[1:]:  # nothing to estimate there
        assert aggregation(mode, deepspeed=True) is aggregation(mode)
    assert aggregation("seq-mean-token-mean") is aggregation(AggMode.SEQ_MEAN_TOKEN_MEAN)  # a YAML string too
    # what config.yaml records (trl.normaliser): unchanged names, the report reads them
    assert [aggregation(m).name for m in AggMode] == ["exact_rescale", "micro_batch_token_mean", "grpo_seq_mean",
                                                      "luspo_seq_mean_token_sum", "dr_grpo_constant"]
    assert aggregation(AggMode.TOKEN_MEAN, deepspeed=True).name == "deepspeed_kept_fraction"
    assert [aggregation(m).estimated for m in AggMode] == [False] * 5
    assert aggregation(AggMode.TOKEN_MEAN, deepspeed=True).estimated


def test_reduce_by_hand():
    assert float(aggregation(AggMode.TOKEN_MEAN).reduce(MASKED, KEPT)) == pytest.approx(10 / 4)
    assert float(aggregation(AggMode.TOKEN_MEAN).reduce(MASKED, KEPT, token_normalizer=20)) == pytest.approx(0.5)
    assert float(aggregation(AggMode.TOKEN_MEAN_PER_MICRO_BATCH).reduce(MASKED, KEPT)) == pytest.approx(10 / 4)
    # per sequence: (6/3 + 4/1) / 2
    assert float(aggregation(AggMode.SEQ_MEAN_TOKEN_MEAN).reduce(MASKED, KEPT)) == pytest.approx(3.0)
    # LUSPO: per sequence its sum, (6 + 4) / 2; Dr. GRPO: 10 / (2 sequences × L), L = 10 given, else T = 4 (verl's)
    assert float(aggregation(AggMode.SEQ_MEAN_TOKEN_SUM).reduce(MASKED, KEPT)) == pytest.approx(5.0)
    assert float(aggregation(AggMode.SEQ_MEAN_TOKEN_SUM_NORM).reduce(MASKED, KEPT, horizon=10)) == pytest.approx(0.5)
    assert float(aggregation(AggMode.SEQ_MEAN_TOKEN_SUM_NORM).reduce(MASKED, KEPT)) == pytest.approx(10 / 8)
    nothing = torch.zeros_like(KEPT)  # an all-masked micro-batch: a finite zero (denominators clamped at 1)
    for mode in AggMode:
        assert float(aggregation(mode).reduce(torch.zeros_like(MASKED), nothing)) == 0.0
    for mode in list(AggMode)[1:]:
        with pytest.raises(ValueError, match=f"token_normalizer is not defined for loss_agg_mode '{mode.value}'"):
            aggregation(mode).reduce(MASKED, KEPT, token_normalizer=4)


def test_provisional_normaliser_weight_and_close():
    tm, ds = aggregation(AggMode.TOKEN_MEAN), aggregation(AggMode.TOKEN_MEAN, deepspeed=True)
    assert float(tm.provisional(torch.tensor(0.25))) == 1.0 and float(tm.provisional(torch.tensor(12.5))) == 12.5
    assert aggregation(AggMode.SEQ_MEAN_TOKEN_MEAN).provisional(torch.tensor(9.0)) is None
    assert aggregation(AggMode.TOKEN_MEAN_PER_MICRO_BATCH).provisional(torch.tensor(9.0)) is None
    loss, never = torch.tensor(2.0), lambda: pytest.fail("no collective where the weight needs none")
    assert float(tm.weight(loss, share=0.25, kept_and_tokens=never)) == 2.0  # the rescale comes at the close
    for mode in list(AggMode)[1:]:
        assert aggregation(mode).provisional(torch.tensor(9.0)) is None
        assert float(aggregation(mode).weight(loss, share=0.25, kept_and_tokens=never)) == 0.5  # n / N
    # DeepSpeed: divided by the micro-batch's global kept fraction 6 / 8; an all-silenced one keeps weight 1
    assert float(ds.weight(loss, share=0.25, kept_and_tokens=lambda: torch.tensor([6.0, 8.0]))) == pytest.approx(8 / 3)
    assert float(ds.weight(loss, share=0.25, kept_and_tokens=lambda: torch.tensor([0.0, 8.0]))) == 2.0
    # close: Σ S_j / c over the window = 3, c = 4, K = 6 kept on W = 2 ranks: the objective 3·4/6, gradients × 4·2/6
    objective, factor = tm.close(torch.tensor(3.0), torch.tensor(4.0), torch.tensor(6.0), 2)
    assert (objective, factor) == (pytest.approx(2.0), pytest.approx(4 / 3))
    assert tm.close(torch.tensor(0.0), torch.tensor(4.0), torch.tensor(0.0), 2) == (0.0, 1.0)  # nothing kept
    # one kept token (the clamps' and guards' boundary): objective 3·4/1, factor 4·2/1; DeepSpeed's weight 8/1
    assert tm.close(torch.tensor(3.0), torch.tensor(4.0), torch.tensor(1.0), 2) == (12.0, 8.0)
    assert float(ds.weight(loss, share=0.25, kept_and_tokens=lambda: torch.tensor([1.0, 8.0]))) == 16.0
    for agg in (ds, *(aggregation(m) for m in list(AggMode)[1:])):
        assert agg.close(torch.tensor(3.0), None, torch.tensor(6.0), 2) == (1.5, None)  # already weighted: ranks' mean
