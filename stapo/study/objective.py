"""The ``methods`` section of a study: one :class:`ObjectiveConfig` per method, over the paper's defaults.

The methods, their token masks, whether those read entropy thresholds, and their paper defaults are declared in
stapo/methods.py (one declaration each); ``OBJECTIVES`` are those defaults as configs. The math is in
stapo.objectives; this module has no torch import (configs are checked before it loads).
"""

from __future__ import annotations

from dataclasses import dataclass

from stapo.methods import METHODS

__all__ = ["ObjectiveConfig", "OBJECTIVES", "AGG_MODES", "SCOPES", "get_objective"]

# loss_agg_mode values (the first is the default); "token-mean-per-micro-batch" = verl 0.4's per-micro-batch agg_loss
AGG_MODES = ("token-mean", "token-mean-per-micro-batch", "seq-mean-token-mean")
# quantile_scope values (the first is the default); "micro_batch_local_topk" = the 80/20 release's per-GPU top-k
SCOPES = ("mini_batch", "micro_batch", "micro_batch_local_topk")


@dataclass(frozen=True)
class ObjectiveConfig:
    """Hyper-parameters of one policy objective.

    Attributes:
        method: a declared method (stapo/methods.py): "grpo", "entropy20", "justrl", "stapo", or a STAPO
            ablation (paper, Ablations): "stapo_high" silences the HIGH-entropy candidates
            (H > quantile(H[cand], 1 − q), as many as S2T would), "stapo_random" a random subset of candidates of
            S2T's size (seeded by ``seed``), "stapo_full" every candidate (the paper's "FullMask" probe).
        eps_low: lower clip ε_low; the ratio is clipped at 1 − ε_low (paper: 0.2).
        eps_high: upper clip ε_high; the ratio is clipped at 1 + ε_high (paper: 0.28, GRPO 0.2).
        kl_beta: weight β of the k3 KL estimator to the reference policy (GRPO only; DeepSeekMath: 0.04).
        tau_p: STAPO's absolute probability threshold τ_p (paper: 0.002).
        entropy_quantile: STAPO's q; τ_h is the q-quantile of candidate entropies (paper: 0.75).
        top_entropy_ratio: 20-Entropy's ρ; the top-ρ fraction of tokens by entropy gets gradient (0.2).
        seed: seed of stapo_random's choice when policy_loss gets no generator.
        clip_ratio_c: verl's dual-clip constant c: for Â < 0 the per-token loss is capped at c·|Â|
            (JustRL's script: 10.0; verl's default 3.0, used for grpo). Must be > 1.
        log_ratio_clip: log ρ is clamped to ±this before exp (verl: 20).
        kl_log_ratio_clip, kl_clip: verl ``low_var_kl``: log(π_ref/π) clamped to ±20, k3 clamped to ±10.
        loss_agg_mode: how the per-token losses of an optimiser step become one loss (stapo.objectives, trainer):
            "token-mean" (default; JustRL family, as verl's engine workers aggregate it — agg_loss with the global
            batch_num_tokens in verl 0.9.1 — chosen, the paper names no verl version: Σ kept ℓ over the whole
            optimiser step on all ranks / its kept-token count, one denominator);
            "token-mean-per-micro-batch" (verl 0.4.0, the trainer JustRL's repo ships: each micro-batch's own
            token-mean over its kept tokens, weighted by its share of the rank's sequences in the step (÷ gradient
            accumulation steps with TRL's fixed micro-batch size; verl's own token-budget micro-batches with
            ``train.micro_batch_tokens``), ranks averaged — TRL's "bnpo");
            "seq-mean-token-mean" (GRPO: mean over completions of each completion's token-mean).
        quantile_scope: where the entropy thresholds of entropy20 / stapo (and its ablations) are taken:
            "mini_batch" (default, paper; once per optimiser step over all its completions on all ranks,
            statistics from π_old); "micro_batch" (per micro-batch, gathered across ranks — TRL's
            top_entropy_quantile); "micro_batch_local_topk" (the 80/20 release, arXiv 2506.01939: per
            micro-batch on ONE rank, no gather, current policy's entropies; entropy20 keeps exactly
            k = max(1, ceil(ρ·n)) tokens by top-k, stapo takes τ_h over the micro-batch's local candidates).
            It normalises per micro-batch as the release does, so it requires loss_agg_mode
            "token-mean-per-micro-batch". See the module docstring of stapo.objectives.
    """

    method: str
    eps_low: float = 0.2
    eps_high: float = 0.28
    kl_beta: float = 0.0
    tau_p: float = 0.002
    entropy_quantile: float = 0.75
    top_entropy_ratio: float = 0.2
    seed: int = 0
    clip_ratio_c: float = 10.0
    log_ratio_clip: float = 20.0
    kl_log_ratio_clip: float = 20.0
    kl_clip: float = 10.0
    loss_agg_mode: str = "token-mean"
    quantile_scope: str = "mini_batch"

    @property
    def token_mask(self) -> str:
        """The registered token mask of this method (its declaration in stapo/methods.py)."""
        return METHODS[self.method].token_mask

    @property
    def thresholds(self) -> str | None:
        """The entropy thresholds its token mask reads (declared, never inferred); None: none."""
        return METHODS[self.method].thresholds

    @property
    def uses_thresholds(self) -> bool:
        """True when the token mask reads per-step entropy thresholds (its declaration says which)."""
        return self.thresholds is not None

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"method: unknown method {self.method!r}; expected one of {list(METHODS)}")
        if not 0.0 <= self.eps_low < 1.0:
            raise ValueError(f"eps_low: must be in [0, 1), got {self.eps_low}")
        if self.eps_high < 0.0:
            raise ValueError(f"eps_high: must be >= 0, got {self.eps_high}")
        if self.kl_beta < 0.0:
            raise ValueError(f"kl_beta: must be >= 0, got {self.kl_beta}")
        if not 0.0 < self.tau_p < 1.0:
            raise ValueError(f"tau_p: must be in (0, 1), got {self.tau_p}")
        if not 0.0 < self.entropy_quantile < 1.0:
            raise ValueError(f"entropy_quantile: must be in (0, 1), got {self.entropy_quantile}")
        if not 0.0 < self.top_entropy_ratio <= 1.0:
            raise ValueError(f"top_entropy_ratio: must be in (0, 1], got {self.top_entropy_ratio}")
        if not self.clip_ratio_c > 1.0:
            raise ValueError(f"clip_ratio_c: must be > 1 (verl's dual clip), got {self.clip_ratio_c}")
        for key in ("log_ratio_clip", "kl_log_ratio_clip", "kl_clip"):
            if not getattr(self, key) > 0:
                raise ValueError(f"{key}: must be > 0, got {getattr(self, key)}")
        if self.loss_agg_mode not in AGG_MODES:
            raise ValueError(f"loss_agg_mode: unknown mode {self.loss_agg_mode!r}; expected one of {list(AGG_MODES)}")
        if self.quantile_scope not in SCOPES:
            raise ValueError(f"quantile_scope: unknown scope {self.quantile_scope!r}; expected one of {list(SCOPES)}")
        if self.quantile_scope == "micro_batch_local_topk" and self.loss_agg_mode != "token-mean-per-micro-batch":
            raise ValueError("quantile_scope: micro_batch_local_topk normalises per micro-batch (the 80/20 release); "
                             f"it needs loss_agg_mode: token-mean-per-micro-batch, got {self.loss_agg_mode!r}")


OBJECTIVES: dict[str, ObjectiveConfig] = {key: ObjectiveConfig(key, **m.defaults) for key, m in METHODS.items()}


def get_objective(method: str, **overrides) -> ObjectiveConfig:
    """The paper's config for ``method``, with keyword overrides (validated)."""
    if method not in METHODS:
        raise ValueError(f"method: unknown method {method!r}; expected one of {list(METHODS)}")
    return ObjectiveConfig(method, **{**METHODS[method].defaults, **overrides})
