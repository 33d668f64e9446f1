"""How a micro-batch's per-token losses become the optimiser step's loss: one aggregator per ``loss_agg_mode``
(verl's names), the one owner of the aggregation's normaliser and of how the trainer weighs micro-batches and ranks.

``policy_loss`` asks :meth:`Aggregator.reduce` for one micro-batch's loss; the trainer asks the same aggregator,
chosen once with the training engine (:func:`aggregation`), for everything else and never decides again:

    token-mean                   Σ kept ℓ / K, K the kept tokens of the whole optimiser step on every rank: one
                                 denominator (verl 0.9.1's engine workers: agg_loss with the global batch_num_tokens;
                                 a choice, the paper names no verl version). K depends on masks computed during each
                                 micro-batch's forward, so it is unknown when micro-batch 1 is back-propagated: each
                                 micro-batch is back-propagated as S_j / c with a provisional normaliser c (TRL's
                                 dapo normaliser: the window's completion tokens per rank), and after the step's last
                                 backward every gradient is rescaled by c·W / K (exact: the masks are constants of θ,
                                 which does not change within a window; one scalar times FSDP's local shards is that
                                 scalar times the whole gradient). Under DeepSpeed, whose engine steps inside the last
                                 backward, the rescale is impossible: each micro-batch is divided by its global kept
                                 fraction instead, c·f estimating K (exact for methods that keep every token).
    token-mean-per-micro-batch   verl 0.4.0 (JustRL's own trainer, ``dp_actor.update_policy``): each micro-batch's
                                 own token-mean Σ_j kept ℓ / max(1, Σ_j kept), weighted by its share n / N of the
                                 rank's sequences in the step (÷ gradient-accumulation steps with TRL's fixed
                                 micro-batch size, TRL's "bnpo"); ranks averaged, so a token of a short micro-batch
                                 weighs more than one of a long one.
    seq-mean-token-mean          GRPO, GSPO: the mean over completions of each completion's token-mean, weighted n / N
                                 as TRL weighs its "grpo" loss.
    seq-mean-token-sum           LUSPO (TRL's "luspo"): the mean over completions of each completion's token-sum,
                                 weighted n / N.
    seq-mean-token-sum-norm      Dr. GRPO (TRL's "dr_grpo"): Σ kept ℓ / (n · L), weighted n / N: Σ / (N · L) for the
                                 step, L = ``loss_scale_factor`` (the recipe's max_completion_length; the padded
                                 length T of the call when None, verl's default).

What a run records (config.yaml's ``trl.normaliser``) is the aggregator's ``name``.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor

from stapo.study.objective import AggMode

__all__ = ["Aggregator", "TokenMean", "DeepSpeedTokenMean", "MicroBatchTokenMean", "SeqMeanTokenMean",
           "SeqMeanTokenSum", "SeqMeanTokenSumNorm", "aggregation"]


class Aggregator:
    """One aggregation mode: the micro-batch's loss (:meth:`reduce`) and the trainer's weights and normalisers."""

    mode: AggMode
    name: str  # what a run's config.yaml records as trl.normaliser
    step_normaliser = False  # the denominator is the whole step's kept tokens (policy_loss's token_normalizer)
    estimated = False  # the step's gradient is an estimate of the objective's, not the objective's

    def reduce(self, masked: Tensor, kept: Tensor, token_normalizer: Tensor | float | None = None,
               horizon: int | None = None) -> Tensor:
        """The loss of one micro-batch from its masked per-token losses and kept mask [B, T]; ``horizon``: the
        constant L of seq-mean-token-sum-norm (ignored by the others)."""
        raise NotImplementedError

    def provisional(self, tokens_per_process: Tensor) -> Tensor | None:
        """The window's provisional normaliser c (None: each micro-batch is complete on its own)."""
        return None

    def weight(self, loss: Tensor, *, share: float, kept_and_tokens: Callable[[], Tensor]) -> Tensor:
        """The micro-batch's loss as the trainer back-propagates it; ``share``: its n / N of the process's step,
        ``kept_and_tokens``: its kept and completion tokens summed over every rank, [2] (a collective: called only
        where needed)."""
        return loss * share

    def close(self, loss: Tensor, c: Tensor | None, kept: Tensor, world: int) -> tuple[float, float | None]:
        """At the step's end, from the window's Σ over ranks of the back-propagated losses, its c and its kept
        tokens: (the objective's loss, the factor every gradient is multiplied by; None: none)."""
        return float(loss) / world, None

    def _no_step_normaliser(self, token_normalizer) -> None:
        if token_normalizer is not None:
            raise ValueError(f"token_normalizer is not defined for loss_agg_mode {self.mode.value!r}")


class TokenMean(Aggregator):
    """token-mean, exact: S_j / c per micro-batch, gradients × c·W / K after the step's last backward."""

    mode, name, step_normaliser = AggMode.TOKEN_MEAN, "exact_rescale", True

    def reduce(self, masked, kept, token_normalizer=None, horizon=None):
        return masked.sum() / (kept.sum().clamp(min=1) if token_normalizer is None else token_normalizer)

    def provisional(self, tokens_per_process):
        return tokens_per_process.clamp(min=1.0)

    def weight(self, loss, *, share, kept_and_tokens):
        return loss

    def close(self, loss, c, kept, world):
        factor = float(c * world / kept) if float(kept) > 0 else 1.0
        return float(loss * c / kept.clamp(min=1.0)), factor


class DeepSpeedTokenMean(TokenMean):
    """token-mean under DeepSpeed: S_j / (c · f_j), f_j the micro-batch's global kept fraction; no rescale."""

    name, estimated = "deepspeed_kept_fraction", True

    def weight(self, loss, *, share, kept_and_tokens):
        kept, tokens = kept_and_tokens()  # 1 / f: c · f estimates the step's kept count
        return loss * (float(tokens / kept) if float(kept) > 0 else 1.0)

    def close(self, loss, c, kept, world):
        return float(loss) / world, None  # each micro-batch was divided by its own estimate: the ranks' mean


class MicroBatchTokenMean(Aggregator):
    """token-mean-per-micro-batch (verl 0.4.0): the micro-batch's own token-mean × n / N."""

    mode, name = AggMode.TOKEN_MEAN_PER_MICRO_BATCH, "micro_batch_token_mean"

    def reduce(self, masked, kept, token_normalizer=None, horizon=None):
        self._no_step_normaliser(token_normalizer)
        return masked.sum() / kept.sum().clamp(min=1)


class SeqMeanTokenMean(Aggregator):
    """seq-mean-token-mean (GRPO): the mean over completions of their token-means × n / N."""

    mode, name = AggMode.SEQ_MEAN_TOKEN_MEAN, "grpo_seq_mean"

    def reduce(self, masked, kept, token_normalizer=None, horizon=None):
        self._no_step_normaliser(token_normalizer)
        per_seq = masked.sum(-1) / kept.sum(-1).clamp(min=1)
        return per_seq.sum() / max(1, per_seq.numel())


class SeqMeanTokenSum(Aggregator):
    """seq-mean-token-sum (LUSPO, arXiv 2602.05261; TRL 1.16 loss_type="luspo": ``(ℓ · mask).sum(-1).mean()``): the
    mean over completions of their token-sums × n / N."""

    mode, name = AggMode.SEQ_MEAN_TOKEN_SUM, "luspo_seq_mean_token_sum"

    def reduce(self, masked, kept, token_normalizer=None, horizon=None):
        self._no_step_normaliser(token_normalizer)
        return masked.sum(-1).sum() / max(1, masked.size(0))  # per completion, then over them: TRL and verl


class SeqMeanTokenSumNorm(Aggregator):
    """seq-mean-token-sum-norm (Dr. GRPO, arXiv 2503.20783; TRL 1.16 loss_type="dr_grpo": ``(ℓ · mask).sum() /
    (B · max_completion_length)``): Σ kept ℓ / (n · L) × n / N, L = ``horizon`` (None: the call's padded length T,
    verl's default)."""

    mode, name = AggMode.SEQ_MEAN_TOKEN_SUM_NORM, "dr_grpo_constant"

    def reduce(self, masked, kept, token_normalizer=None, horizon=None):
        self._no_step_normaliser(token_normalizer)
        return masked.sum() / (max(1, masked.size(0)) * (max(1, masked.size(-1)) if horizon is None else horizon))


_AGGREGATORS = {AggMode.TOKEN_MEAN: TokenMean(), AggMode.TOKEN_MEAN_PER_MICRO_BATCH: MicroBatchTokenMean(),
                AggMode.SEQ_MEAN_TOKEN_MEAN: SeqMeanTokenMean(), AggMode.SEQ_MEAN_TOKEN_SUM: SeqMeanTokenSum(),
                AggMode.SEQ_MEAN_TOKEN_SUM_NORM: SeqMeanTokenSumNorm()}
_DEEPSPEED = {AggMode.TOKEN_MEAN: DeepSpeedTokenMean()}


def aggregation(mode: AggMode, *, deepspeed: bool = False) -> Aggregator:
    """The aggregator of ``mode``; ``deepspeed``: the engine steps inside the last backward (every other engine —
    one process, DDP, FSDP — rescales after it)."""
    return (_DEEPSPEED.get(mode) if deepspeed else None) or _AGGREGATORS[AggMode(mode)]


assert set(_AGGREGATORS) == set(AggMode), "every loss_agg_mode has its aggregator"
