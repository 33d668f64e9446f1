"""The methods a study can train, one declaration each; every other list of methods derives from here.

A method is a token mask (which completion tokens enter the loss), a per-token loss (verl's clipped surrogate
unless the method owns its loss, as verl's and TRL's other methods do) and the paper's hyper-parameters (the
fields of stapo.study.ObjectiveConfig, documented there one by one). Its declaration names:

    key               what configs, paths and ``methods.<key>.objective`` use
    label             what tables and figures show (a study may override it with ``methods.<key>.label``)
    token_mask        the mask function, registered in stapo.losses.registry with ``@register_token_mask(name)``
                      (the masks: stapo/losses/masks.py; "all": every completion token)
    loss              the per-token loss, registered with ``@register_policy_loss(name)`` (policy.py, related.py,
                      trl_losses.py;
                      "vanilla": verl's clipped surrogate with dual clip, the paper's Eq. 1-2)
    params            the ObjectiveConfig fields only this method's loss reads (recorded in a run's config.yaml for
                      this method alone)
    thresholds        the per-step entropy thresholds the mask reads, registered with
                      ``@register_thresholds(name)`` (masks.py) (None: it reads none, and the trainer computes none)
    paper             the key of the paper's results table (None: the paper reports no number for it)
    family            where it comes from (:class:`Family`): the paper's four, the S2T ablations, verl 0.9.1's
                      policy losses, TRL 1.16's loss types; the report groups its rows and curves by it. ``main``
                      (one of the paper's four trained methods, its main table) is ``family is Family.PAPER``
    only_agg          the one loss_agg_mode its source defines (verl's sapo and geo_mean ignore loss_agg_mode); it
                      is the method's default and any other is refused (None: any)
    defaults          the paper's values of stapo.study.ObjectiveConfig's fields for this method

The study schema's ``objective`` enum, ``stapo.study.names.METHODS`` (labels, the table's row order),
``stapo.study.OBJECTIVES`` (the defaults) and the trainer's choice of mask all read :data:`METHODS`; the contract
tests in tests/test_objectives.py run over every declared method. Adding a method (README "Add a method"): one
``declare(...)`` below and its mask (or loss) function, registered in stapo.losses.registry. No torch here: a study
is checked against these declarations before torch loads.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from stapo.core.fields import Choice

__all__ = ["Family", "Method", "METHODS", "declare"]


class Family(Choice):
    """Where a method comes from: the report's groups of rows and curves, in this order."""

    PAPER = "paper"
    ABLATION = "ablation"
    VERL = "verl"
    TRL = "trl"

    @property
    def title(self) -> str:
        """The group's heading in the report."""
        return {"paper": "The paper's four (STAPO, Table 2)", "ablation": "Ablations of the S2T mask",
                "verl": "verl 0.9.1's policy losses", "trl": "TRL 1.16's loss types"}[self.value]


@dataclass(frozen=True)
class Method:
    """One declared method (module docstring)."""

    key: str
    label: str
    token_mask: str
    thresholds: str | None = None
    paper: str | None = None
    family: Family = Family.PAPER
    defaults: dict = field(default_factory=dict)
    loss: str = "vanilla"
    params: tuple[str, ...] = ()
    only_agg: str | None = None

    @property
    def main(self) -> bool:
        """One of the paper's four trained methods (its main table)."""
        return self.family is Family.PAPER


METHODS: dict[str, Method] = {}  # in declaration order: the table's row order


def declare(key: str, *, label: str, token_mask: str = "all", thresholds: str | None = None,
            paper: str | None = None, family: Family = Family.ABLATION, loss: str = "vanilla",
            params: tuple[str, ...] = (), only_agg: str | None = None, **defaults) -> Method:
    """Declare a method (module docstring); ``defaults`` are ObjectiveConfig fields (checked when it is built)."""
    if key in METHODS:
        raise ValueError(f"method {key!r} is declared twice")
    if only_agg is not None:
        defaults.setdefault("loss_agg_mode", only_agg)
    METHODS[key] = Method(key, label, token_mask, thresholds, paper, Family(family), dict(defaults), loss,
                          tuple(params), only_agg)
    return METHODS[key]


# The paper's four (Table 2). GRPO: symmetric clip, k3 KL to the reference, verl's default dual clip c = 3,
# sequence-mean of token-means. The JustRL family: JustRL's verl script (clip 0.2 / 0.28, c = 10, token-mean).
declare("grpo", label="GRPO", token_mask="all", paper="GRPO", family=Family.PAPER,
        eps_low=0.2, eps_high=0.2, kl_beta=0.04, clip_ratio_c=3.0, loss_agg_mode="seq-mean-token-mean")
declare("entropy20", label="20-Entropy", token_mask="high_entropy", thresholds="top_entropy", paper="20-Entropy",
        family=Family.PAPER)
declare("justrl", label="JustRL", token_mask="all", paper="JustRL", family=Family.PAPER)
declare("stapo", label="STAPO", token_mask="s2t", thresholds="s2t", paper="STAPO", family=Family.PAPER)

# Ablations of the S2T mask over the same candidates (paper, Ablations; configs/ablations.yaml): no paper row.
declare("stapo_high", label="STAPO (mask high-H)", token_mask="s2t_high", thresholds="s2t")
declare("stapo_random", label="STAPO (mask random)", token_mask="s2t_random", thresholds="s2t")
declare("stapo_full", label="STAPO (mask all candidates)", token_mask="s2t_full")

# Related methods that own their per-token loss (configs/related.yaml), each equal to verl 0.9.1's function of the
# same name in verl/trainer/ppo/core_algos.py (tests/test_related_methods.py calls it on random inputs).
# Clip-Cov / KL-Cov (PRIME-RL "The Entropy Mechanism of RL", arXiv 2505.22617; verl compute_policy_loss_clip_cov /
# _kl_cov): clip_cov_ratio 2e-4, bounds (1, 5) as verl 0.9.1 trainer/config/actor/actor.yaml (policy_loss.clip_cov_*)
# and the paper; KL-Cov k = 2e-3, β = 1 as the paper's 7B runs (actor.yaml's defaults are 2e-4 and 0.1). Clip ratios
# and aggregation: the paper's recipe (0.2 / 0.28, token-mean).
declare("clip_cov", label="Clip-Cov", family=Family.VERL, loss="clip_cov",
        params=("clip_cov_ratio", "clip_cov_lb", "clip_cov_ub"), clip_cov_ratio=0.0002, clip_cov_lb=1.0,
        clip_cov_ub=5.0)
declare("kl_cov", label="KL-Cov", family=Family.VERL, loss="kl_cov", params=("kl_cov_ratio", "ppo_kl_coef"),
        kl_cov_ratio=0.002, ppo_kl_coef=1.0)
# GSPO (arXiv 2507.18071; verl compute_policy_loss_gspo, TRL importance_sampling_level="sequence"): the
# length-normalised sequence ratio, clip range 3e-4 / 4e-4 (the paper's Sec. 5.1), sequence-level aggregation
# (the paper; verl's function default "seq-mean-token-mean").
declare("gspo", label="GSPO", family=Family.VERL, loss="gspo", eps_low=0.0003, eps_high=0.0004,
        loss_agg_mode="seq-mean-token-mean")
# CISPO (MiniMax-M1, arXiv 2506.13585; verl compute_policy_loss_cispo, TRL loss_type="cispo"): REINFORCE on log π
# weighted by the stop-gradient clipped ratio. No lower bound (eps_low 1: the ratio is clipped at 0, as the paper
# sets ε_low large), upper ratio bound 5 (eps_high 4: TRL's GRPOConfig.epsilon_high doc recommends ε_max = 5.0 for
# cispo, after ScaleRL arXiv 2510.13786), token-mean (verl's default; TRL normalises cispo as dapo).
declare("cispo", label="CISPO", family=Family.VERL, loss="cispo", eps_low=1.0, eps_high=4.0)

# verl 0.9.1's other registered policy losses (verl/trainer/ppo/core_algos.py, @register_policy_loss), each equal to
# its function (tests/test_related_methods.py). Their own parameters take verl 0.9.1's actor config defaults
# (verl/trainer/config/actor/actor.yaml; the same values as the ActorConfig / PolicyLossConfig dataclasses of
# verl/workers/config/actor.py); the rest is the paper's recipe (token-mean where the function reads loss_agg_mode).
# DPPO (arXiv 2602.04879; compute_policy_loss_dppo_tv / _dppo_kl): REINFORCE with a truncated importance weight, a
# token's gradient dropped once π left the TV / binary-KL trust region δ in the advantage's direction. verl reads
# δ from clip_ratio_low / _high (actor.yaml 0.2 / 0.2) and the weight's cap from clip_ratio_c (actor.yaml 3.0).
declare("dppo_tv", label="DPPO-TV", family=Family.VERL, loss="dppo_tv",
        params=("dppo_delta_low", "dppo_delta_high", "dppo_is_cap"),
        dppo_delta_low=0.2, dppo_delta_high=0.2, dppo_is_cap=3.0)
declare("dppo_kl", label="DPPO-KL", family=Family.VERL, loss="dppo_kl",
        params=("dppo_delta_low", "dppo_delta_high", "dppo_is_cap"),
        dppo_delta_low=0.2, dppo_delta_high=0.2, dppo_is_cap=3.0)
# SAPO (arXiv 2511.20347; compute_policy_loss_sapo, TRL loss_type="sapo"): a soft gate σ(τ(ρ − 1))·4/τ instead of
# the clip, τ 1.0 / 1.05 (actor.yaml tau_pos / tau_neg, TRL's defaults too); verl aggregates it seq-mean-token-mean
# whatever loss_agg_mode says, as TRL's sapo does. TRL's form differs in verl's ±20 clamp of log ρ only: sapo_trl.
declare("sapo", label="SAPO", family=Family.VERL, loss="sapo", params=("sapo_tau_pos", "sapo_tau_neg"),
        only_agg="seq-mean-token-mean", sapo_tau_pos=1.0, sapo_tau_neg=1.05)
# GMPO (arXiv 2507.20673; compute_policy_loss_geo_mean): −Â times the geometric mean of the token ratios, each log ρ
# clipped to [−ε_low, ε_high] in the advantage's direction; verl ignores loss_agg_mode (a mean over sequences).
# ε 0.2 / 0.2: actor.yaml clip_ratio_low / _high (the GMPO paper's own range is (e^−0.4, e^0.4)).
declare("geo_mean", label="GMPO", family=Family.VERL, loss="geo_mean", only_agg="seq-mean-token-mean",
        eps_low=0.2, eps_high=0.2)
# GPG (arXiv 2504.02546; compute_policy_loss_gpg): plain REINFORCE −Â·log π (GPG's own advantage estimator,
# verl's compute_gpg_outcome_advantage, is not a policy loss: the study's advantages are GRPO's).
declare("gpg", label="GPG", family=Family.VERL, loss="gpg")
# DRO (compute_policy_loss_dro): −(Â·log π − β/2 (log ρ)²); actor.yaml has no β (dro_beta null, must be set).
declare("dro", label="DRO", family=Family.VERL, loss="dro", params=("dro_beta",), dro_beta=0.05)

# TRL 1.16's loss types beyond those above (GRPOConfig.loss_type, branches of GRPOTrainer._compute_loss), each
# equal to TRL's own trainer on the same inputs (tests/test_trl_losses.py); TRL's GRPOConfig defaults. dr_grpo and
# luspo are aggregations (stapo.study.objective.AggMode), which any method may use; their methods here pair them
# with the per-token loss TRL pairs them with.
# Dr. GRPO (arXiv 2503.20783): TRL's clipped surrogate (no dual clip, no log ρ clamp), ε 0.2 / 0.2 (TRL's epsilon,
# epsilon_high None = epsilon), Σ ℓ / (completions × max_completion_length). (The paper also drops the std
# scaling of the advantages: TRL's scale_rewards, not the loss.)
declare("dr_grpo", label="Dr. GRPO", family=Family.TRL, loss="ppo_clip", eps_low=0.2, eps_high=0.2,
        loss_agg_mode="seq-mean-token-sum-norm")
# LUSPO (arXiv 2602.05261): GSPO's sequence ratio (TRL importance_sampling_level="sequence", without verl's cap of
# the log-ratio at 10), each completion's loss × its length: seq-mean-token-sum. ε 3e-4 / 4e-4: GSPO's, whose
# objective LUSPO rescales (the LUSPO paper's own values were not checked).
declare("luspo", label="LUSPO", family=Family.TRL, loss="sequence_clip", eps_low=0.0003, eps_high=0.0004,
        loss_agg_mode="seq-mean-token-sum")
# VESPO (arXiv 2602.10693): −sg(φ(w))·Â·log π, φ a gamma weight of the sequence ratio w = Π ρ_t; k / λ 2 / 3 for
# Â ≥ 0 and 3 / 2 below (TRL's defaults); TRL normalises it as dapo (token-mean).
declare("vespo", label="VESPO", family=Family.TRL, loss="vespo",
        params=("vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg"),
        vespo_k_pos=2.0, vespo_lambda_pos=3.0, vespo_k_neg=3.0, vespo_lambda_neg=2.0)
# SAPO as TRL computes it (loss_type="sapo"): verl's gate without verl's ±20 clamp of log ρ (where every token of a
# call is beyond −20, verl's gradient is 0 and TRL's ~ρ: tests/test_trl_losses.py measures it); TRL's defaults τ
# 1.0 / 1.05 and its grpo normalisation, seq-mean-token-mean.
declare("sapo_trl", label="SAPO (TRL)", family=Family.TRL, loss="trl_sapo", params=("sapo_tau_pos", "sapo_tau_neg"),
        only_agg="seq-mean-token-mean", sapo_tau_pos=1.0, sapo_tau_neg=1.05)
