"""A method's hyper-parameters: one :class:`ObjectiveConfig` per method of a study (its ``methods`` section), over
the paper's defaults.

The methods, their token masks or own losses, whether those read entropy thresholds, and their paper defaults are
declared in stapo/study/methods.py (one declaration each); ``OBJECTIVES`` are those defaults as configs. The math
is in stapo.losses.masks and stapo.losses.policy; this module has no torch import (configs are checked before it
loads).

Aggregation and quantile scope are enums carried once, with their behaviour as attributes (TRL's loss type; whether
thresholds are per step or gathered; the aggregation's own behaviour is its aggregator, stapo.losses.aggregation),
so no other module compares their strings. They are ``str`` enums: a YAML string parses into them and they
JSON-dump as their value.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from enum import Enum

from stapo.core.fields import Choice, check_fields, option
from stapo.study.methods import METHODS

__all__ = ["AggMode", "QuantileScope", "ObjectiveConfig", "OBJECTIVES", "AGG_MODES", "SCOPES", "get_objective"]


class AggMode(Choice):
    """``loss_agg_mode``: how the per-token losses of an optimiser step become one loss (verl's names).

    token-mean                   Σ kept ℓ over the whole optimiser step on all ranks / its kept-token count K, one
                                 denominator (verl 0.9.1's engine workers: agg_loss with the global
                                 batch_num_tokens); the trainer passes K as ``token_normalizer``.
    token-mean-per-micro-batch   verl 0.4.0 (JustRL's own trainer): each micro-batch's own token-mean, weighted by
                                 its share of the rank's sequences in the step; ranks averaged (TRL's "bnpo").
    seq-mean-token-mean          GRPO: mean over completions of each completion's token-mean (TRL's "grpo").
    seq-mean-token-sum           LUSPO (arXiv 2602.05261): mean over completions of each completion's token-SUM, so a
                                 sequence weighs by its length (TRL's "luspo"; verl's agg_loss of the same name).
    seq-mean-token-sum-norm      Dr. GRPO (arXiv 2503.20783): Σ kept ℓ / (completions × L), L a constant
                                 (``loss_scale_factor``: TRL's max_completion_length) (TRL's "dr_grpo"; verl's
                                 agg_loss of the same name).
    """

    TOKEN_MEAN = "token-mean"
    TOKEN_MEAN_PER_MICRO_BATCH = "token-mean-per-micro-batch"
    SEQ_MEAN_TOKEN_MEAN = "seq-mean-token-mean"
    SEQ_MEAN_TOKEN_SUM = "seq-mean-token-sum"
    SEQ_MEAN_TOKEN_SUM_NORM = "seq-mean-token-sum-norm"

    @property
    def trl_loss_type(self) -> str:
        """TRL's ``loss_type`` of the same aggregation (plain TRL runs and logs read it)."""
        return {"token-mean": "dapo", "token-mean-per-micro-batch": "bnpo", "seq-mean-token-mean": "grpo",
                "seq-mean-token-sum": "luspo", "seq-mean-token-sum-norm": "dr_grpo"}[self.value]

    @property
    def params(self) -> tuple[str, ...]:
        """The ObjectiveConfig fields this aggregation reads (recorded in a run's config.yaml only with it)."""
        return ("loss_scale_factor",) if self is AggMode.SEQ_MEAN_TOKEN_SUM_NORM else ()


class QuantileScope(Choice):
    """``quantile_scope``: where the entropy thresholds of entropy20 / stapo (and its ablations) are taken.

    mini_batch               (paper) once per optimiser step over all its completions on all ranks, from π_old
    micro_batch              per micro-batch, gathered across ranks (TRL's top_entropy_quantile)
    micro_batch_local_topk   the 80/20 release (arXiv 2506.01939): per micro-batch on ONE rank, no gather; entropy20
                             keeps exactly k = max(1, ceil(ρ·n)) tokens by top-k. Normalises per micro-batch, so it
                             requires loss_agg_mode token-mean-per-micro-batch.
    """

    MINI_BATCH = "mini_batch"
    MICRO_BATCH = "micro_batch"
    MICRO_BATCH_LOCAL_TOPK = "micro_batch_local_topk"

    @property
    def per_step(self) -> bool:
        """Thresholds are computed once per optimiser step, before its first micro-batch (the trainer does)."""
        return self is QuantileScope.MINI_BATCH

    @property
    def gathered(self) -> bool:
        """A per-call threshold pools every rank's tokens (False: this rank's alone)."""
        return self is not QuantileScope.MICRO_BATCH_LOCAL_TOPK

    @property
    def required_agg(self) -> AggMode | None:
        """The aggregation this scope only makes sense with (None: any)."""
        return AggMode.TOKEN_MEAN_PER_MICRO_BATCH if self is QuantileScope.MICRO_BATCH_LOCAL_TOPK else None


# the values, in order (the first is the default): the schema's enums
AGG_MODES = tuple(m.value for m in AggMode)
SCOPES = tuple(s.value for s in QuantileScope)


@dataclass(frozen=True)
class ObjectiveConfig:
    """Hyper-parameters of one policy objective; each field's documentation is its ``metadata["help"]`` (TRL
    style: the study schema's descriptions are generated from it). Ranges are checked in ``__post_init__``."""

    method: str = option(help="A declared method (stapo/study/methods.py, one declaration each: its token mask, its "
                              "loss, its paper defaults); the study schema's ``objective`` lists them with their "
                              "labels (`stapo schema`).")
    eps_low: float = option(0.2, "Lower clip ε_low; the ratio is clipped at 1 − ε_low (paper: 0.2; 1.0 = no lower "
                                "clip, CISPO).", minimum=0, maximum=1)
    eps_high: float = option(0.28, "Upper clip ε_high; the ratio is clipped at 1 + ε_high (paper: 0.28, GRPO 0.2).",
                             minimum=0)
    kl_beta: float = option(0.0, "Weight β of the k3 KL estimator to the reference policy (GRPO only; "
                                "DeepSeekMath: 0.04).", minimum=0)
    tau_p: float = option(0.002, "STAPO's absolute probability threshold τ_p (paper: 0.002).", exclusiveMinimum=0,
                          exclusiveMaximum=1)
    entropy_quantile: float = option(0.75, "STAPO's q; τ_h is the q-quantile of the candidates' entropies "
                                          "(paper: 0.75).", exclusiveMinimum=0, exclusiveMaximum=1)
    top_entropy_ratio: float = option(0.2, "20-Entropy's ρ: the top-ρ fraction of tokens by entropy gets gradient.",
                                      exclusiveMinimum=0, maximum=1)
    seed: int = option(0, "Seed of stapo_random's and clip_cov's random choice when policy_loss gets no generator.")
    clip_ratio_c: float = option(10.0, "verl's dual-clip constant c: for Â < 0 the per-token loss is capped at c·|Â| "
                                      "(JustRL's script: 10.0; verl's default 3.0, used for grpo).", exclusiveMinimum=1)
    log_ratio_clip: float = option(20.0, "log ρ is clamped to ±this before exp (verl: 20).", exclusiveMinimum=0)
    kl_log_ratio_clip: float = option(20.0, "verl low_var_kl: log(π_ref/π) is clamped to ±this (20).",
                                      exclusiveMinimum=0)
    kl_clip: float = option(10.0, "verl low_var_kl: the k3 estimate is clamped to ±this (10).", exclusiveMinimum=0)
    loss_agg_mode: AggMode = option(AggMode.TOKEN_MEAN, (
        "How the per-token losses of an optimiser step become one loss: token-mean (default; JustRL family; the "
        "whole step's kept tokens on all ranks are one denominator, verl 0.9.1's engine workers), "
        "token-mean-per-micro-batch (verl 0.4.0, JustRL's own trainer: each micro-batch's own token-mean weighted "
        "by its share of the rank's sequences; TRL's bnpo), seq-mean-token-mean (GRPO, GSPO: mean over completions "
        "of each completion's token-mean), seq-mean-token-sum (LUSPO, TRL's luspo: mean over completions of each "
        "completion's token-sum), seq-mean-token-sum-norm (Dr. GRPO, TRL's dr_grpo: Σ ℓ / (completions × "
        "loss_scale_factor)). See stapo.study.objective.AggMode."))
    quantile_scope: QuantileScope = option(QuantileScope.MINI_BATCH, (
        "Where the entropy thresholds of entropy20 / stapo (and its ablations) are taken: mini_batch (default, "
        "paper: once per optimiser step over all its completions on all ranks, from π_old), micro_batch (per "
        "micro-batch, gathered across ranks; TRL's top_entropy_quantile), micro_batch_local_topk (the 80/20 "
        "release, arXiv 2506.01939: per micro-batch on one rank; requires loss_agg_mode "
        "token-mean-per-micro-batch). See stapo.study.objective.QuantileScope."))
    clip_cov_ratio: float = option(0.0002, "Clip-Cov: the fraction of a micro-batch's tokens whose gradient is "
                                          "detached, among those with covariance in (clip_cov_lb, clip_cov_ub) "
                                          "(arXiv 2505.22617; verl 0.9.1 actor.yaml policy_loss.clip_cov_ratio).",
                                   exclusiveMinimum=0)
    clip_cov_lb: float = option(1.0, "Clip-Cov: lower bound of the covariance of the tokens it may detach (verl: 1.0).")
    clip_cov_ub: float = option(5.0, "Clip-Cov: upper bound of the covariance of the tokens it may detach (verl: 5.0).")
    kl_cov_ratio: float = option(0.002, "KL-Cov: the fraction of a micro-batch's tokens, those of largest covariance, "
                                       "that get the |log ρ| penalty (arXiv 2505.22617: 2e-3 for 7B; verl's "
                                       "actor.yaml default 2e-4).", exclusiveMinimum=0)
    ppo_kl_coef: float = option(1.0, "KL-Cov: weight of the |log ρ| penalty on the selected tokens (arXiv 2505.22617: "
                                    "1; verl's actor.yaml default 0.1).", minimum=0)

    loss_scale_factor: int | None = option(None, (
        "seq-mean-token-sum-norm (Dr. GRPO, arXiv 2503.20783): the constant L of the normaliser completions × L. "
        "None: the recipe's train.max_completion_length (TRL's dr_grpo; verl 0.9.1's actor.yaml loss_scale_factor "
        "null means the padded response length instead). Read by no other aggregation."), exclusiveMinimum=0)
    # verl 0.9.1's other policy losses (verl/trainer/ppo/core_algos.py); defaults: verl/trainer/config/actor/actor.yaml
    dppo_delta_low: float = option(0.2, (
        "DPPO (arXiv 2602.04879; dppo_tv, dppo_kl): a negative-advantage token keeps its gradient while its "
        "divergence from π_old stays within this bound (TV: π_old − π ≤ δ; KL: binary KL ≤ δ, or π ≥ π_old). "
        "verl reads it from clip_ratio_low (actor.yaml: 0.2)."), exclusiveMinimum=0)
    dppo_delta_high: float = option(0.2, (
        "DPPO: the same bound for a positive-advantage token (TV: π − π_old ≤ δ; KL: binary KL ≤ δ, or π ≤ π_old). "
        "verl reads it from clip_ratio_high (actor.yaml: 0.2)."), exclusiveMinimum=0)
    dppo_is_cap: float = option(3.0, (
        "DPPO: the truncated importance weight sg(min(ρ, C)) of its REINFORCE term. verl reads clip_ratio_c "
        "(actor.yaml: 3.0; its function's fallback when the key is absent: 20)."), exclusiveMinimum=0)
    sapo_tau_pos: float = option(1.0, (
        "SAPO (arXiv 2511.20347): temperature τ of the soft gate σ(τ(ρ − 1))·4/τ for Â > 0 (verl actor.yaml tau_pos "
        "1.0 = TRL sapo_temperature_pos)."), exclusiveMinimum=0)
    sapo_tau_neg: float = option(1.05, (
        "SAPO: the gate's temperature for Â ≤ 0 (verl actor.yaml tau_neg 1.05 = TRL sapo_temperature_neg)."),
        exclusiveMinimum=0)
    dro_beta: float = option(0.05, (
        "DRO (verl 0.9.1 compute_policy_loss_dro): weight β of the quadratic penalty β/2 (log ρ)². verl's actor.yaml "
        "has no default (dro_beta null: must be set); 0.05 is the usage example of the pull request that added it "
        "(verl-project/verl#7245)."), exclusiveMinimum=0)
    # TRL 1.16's loss types (trl/trainer/grpo_trainer.py GRPOTrainer._compute_loss); defaults: its GRPOConfig
    vespo_k_pos: float = option(2.0, (
        "VESPO (arXiv 2602.10693): power k of the gamma weight φ(w) = e^λ w^k e^(−λw) for Â ≥ 0 (TRL vespo_k_pos)."),
        minimum=0)
    vespo_lambda_pos: float = option(3.0, "VESPO: decay λ of φ(w) for Â ≥ 0 (TRL vespo_lambda_pos).",
                                     exclusiveMinimum=0)
    vespo_k_neg: float = option(3.0, "VESPO: power k of φ(w) for Â < 0 (TRL vespo_k_neg).", minimum=0)
    vespo_lambda_neg: float = option(2.0, "VESPO: decay λ of φ(w) for Â < 0 (TRL vespo_lambda_neg).",
                                     exclusiveMinimum=0)

    @property
    def token_mask(self) -> str:
        """The registered token mask of this method (its declaration in stapo/study/methods.py)."""
        return METHODS[self.method].token_mask

    @property
    def loss(self) -> str:
        """The registered per-token loss of this method (its declaration; "vanilla" = verl's clipped surrogate)."""
        return METHODS[self.method].loss

    @property
    def thresholds(self) -> str | None:
        """The entropy thresholds its token mask reads (declared, never inferred); None: none."""
        return METHODS[self.method].thresholds

    def with_horizon(self, max_completion_length: int) -> ObjectiveConfig:
        """This config with ``loss_scale_factor`` set to the recipe's ``max_completion_length`` where its
        aggregation reads it and it is unset (TRL's dr_grpo constant); else itself."""
        if "loss_scale_factor" not in self.loss_agg_mode.params or self.loss_scale_factor is not None:
            return self
        return replace(self, loss_scale_factor=max_completion_length)

    @property
    def uses_thresholds(self) -> bool:
        """True when the token mask reads per-step entropy thresholds (its declaration says which)."""
        return self.thresholds is not None

    @property
    def step_thresholds(self) -> bool:
        """The trainer computes this method's thresholds once per optimiser step (mini-batch scope)."""
        return self.uses_thresholds and self.quantile_scope.per_step

    def as_dict(self) -> dict:
        """The fields as plain values (enums as their strings): what a run directory records. A field that only
        another method's loss reads (its declaration's ``params``) is left out, so adding a method does not change
        the recorded config of the others."""
        others = ({p for m in METHODS.values() for p in m.params} | {p for a in AggMode for p in a.params}) - (
            set(METHODS[self.method].params) | set(self.loss_agg_mode.params))
        return {k: (v.value if isinstance(v, Enum) else v) for k, v in asdict(self).items() if k not in others}

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"method: unknown method {self.method!r}; expected one of {list(METHODS)}")
        check_fields(self)  # the enums from their strings, every number within its field's bounds
        if not self.clip_cov_lb < self.clip_cov_ub:
            raise ValueError(f"clip_cov_lb: must be < clip_cov_ub, got {self.clip_cov_lb} >= {self.clip_cov_ub}")
        only = METHODS[self.method].only_agg
        if only is not None and self.loss_agg_mode is not AggMode(only):
            raise ValueError(f"loss_agg_mode: {self.method} aggregates as {only} only (its source defines no other: "
                             f"it ignores loss_agg_mode), got {self.loss_agg_mode.value!r}")
        need = self.quantile_scope.required_agg
        if need is not None and self.loss_agg_mode is not need:
            raise ValueError(f"quantile_scope: {self.quantile_scope} normalises per micro-batch (the 80/20 release); "
                             f"it needs loss_agg_mode: {need}, got {self.loss_agg_mode.value!r}")


assert all("help" in f.metadata for f in fields(ObjectiveConfig))  # the schema's descriptions come from here

OBJECTIVES: dict[str, ObjectiveConfig] = {key: ObjectiveConfig(key, **m.defaults) for key, m in METHODS.items()}


def get_objective(method: str, **overrides) -> ObjectiveConfig:
    """The paper's config for ``method``, with keyword overrides (validated)."""
    if method not in METHODS:
        raise ValueError(f"method: unknown method {method!r}; expected one of {list(METHODS)}")
    return ObjectiveConfig(method, **{**METHODS[method].defaults, **overrides})
