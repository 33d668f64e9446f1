"""The methods a study can train, one declaration each; every other list of methods derives from here.

A method is a token mask (which completion tokens enter the loss), a per-token loss (verl's clipped surrogate
unless the method owns its loss, as Clip-Cov, KL-Cov, GSPO and CISPO do) and the paper's hyper-parameters (the
fields of stapo.study.ObjectiveConfig, documented there one by one). Its declaration names:

    key               what configs, paths and ``methods.<key>.objective`` use
    label             what tables and figures show (a study may override it with ``methods.<key>.label``)
    token_mask        the mask function, registered in stapo.losses.registry with ``@register_token_mask(name)``
                      (the masks: stapo/losses/masks.py; "all": every completion token)
    loss              the per-token loss, registered with ``@register_policy_loss(name)`` (policy.py, related.py;
                      "vanilla": verl's clipped surrogate with dual clip, the paper's Eq. 1-2)
    params            the ObjectiveConfig fields only this method's loss reads (recorded in a run's config.yaml for
                      this method alone)
    thresholds        the per-step entropy thresholds the mask reads, registered with
                      ``@register_thresholds(name)`` (masks.py) (None: it reads none, and the trainer computes none)
    paper             the key of the paper's results table (None: the paper reports no number for it)
    main              one of the paper's four trained methods (its main table)
    defaults          the paper's values of stapo.study.ObjectiveConfig's fields for this method

The study schema's ``objective`` enum, ``stapo.study.names.METHODS`` (labels, the table's row order),
``stapo.study.OBJECTIVES`` (the defaults) and the trainer's choice of mask all read :data:`METHODS`; the contract
tests in tests/test_objectives.py run over every declared method. Adding a method (README "Add a method"): one
``declare(...)`` below and its mask (or loss) function, registered in stapo.losses.registry. No torch here: a study
is checked against these declarations before torch loads.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Method", "METHODS", "declare"]


@dataclass(frozen=True)
class Method:
    """One declared method (module docstring)."""

    key: str
    label: str
    token_mask: str
    thresholds: str | None = None
    paper: str | None = None
    main: bool = False
    defaults: dict = field(default_factory=dict)
    loss: str = "vanilla"
    params: tuple[str, ...] = ()


METHODS: dict[str, Method] = {}  # in declaration order: the table's row order


def declare(key: str, *, label: str, token_mask: str = "all", thresholds: str | None = None,
            paper: str | None = None, main: bool = False, loss: str = "vanilla", params: tuple[str, ...] = (),
            **defaults) -> Method:
    """Declare a method (module docstring); ``defaults`` are ObjectiveConfig fields (checked when it is built)."""
    if key in METHODS:
        raise ValueError(f"method {key!r} is declared twice")
    METHODS[key] = Method(key, label, token_mask, thresholds, paper, main, dict(defaults), loss, tuple(params))
    return METHODS[key]


# The paper's four (Table 2). GRPO: symmetric clip, k3 KL to the reference, verl's default dual clip c = 3,
# sequence-mean of token-means. The JustRL family: JustRL's verl script (clip 0.2 / 0.28, c = 10, token-mean).
declare("grpo", label="GRPO", token_mask="all", paper="GRPO", main=True,
        eps_low=0.2, eps_high=0.2, kl_beta=0.04, clip_ratio_c=3.0, loss_agg_mode="seq-mean-token-mean")
declare("entropy20", label="20-Entropy", token_mask="high_entropy", thresholds="top_entropy", paper="20-Entropy",
        main=True)
declare("justrl", label="JustRL", token_mask="all", paper="JustRL", main=True)
declare("stapo", label="STAPO", token_mask="s2t", thresholds="s2t", paper="STAPO", main=True)

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
declare("clip_cov", label="Clip-Cov", loss="clip_cov", params=("clip_cov_ratio", "clip_cov_lb", "clip_cov_ub"),
        clip_cov_ratio=0.0002, clip_cov_lb=1.0, clip_cov_ub=5.0)
declare("kl_cov", label="KL-Cov", loss="kl_cov", params=("kl_cov_ratio", "ppo_kl_coef"),
        kl_cov_ratio=0.002, ppo_kl_coef=1.0)
# GSPO (arXiv 2507.18071; verl compute_policy_loss_gspo, TRL importance_sampling_level="sequence"): the
# length-normalised sequence ratio, clip range 3e-4 / 4e-4 (the paper's Sec. 5.1), sequence-level aggregation
# (the paper; verl's function default "seq-mean-token-mean").
declare("gspo", label="GSPO", loss="gspo", eps_low=0.0003, eps_high=0.0004, loss_agg_mode="seq-mean-token-mean")
# CISPO (MiniMax-M1, arXiv 2506.13585; verl compute_policy_loss_cispo, TRL loss_type="cispo"): REINFORCE on log π
# weighted by the stop-gradient clipped ratio. No lower bound (eps_low 1: the ratio is clipped at 0, as the paper
# sets ε_low large), upper ratio bound 5 (eps_high 4: TRL's GRPOConfig.epsilon_high doc recommends ε_max = 5.0 for
# cispo, after ScaleRL arXiv 2510.13786), token-mean (verl's default; TRL normalises cispo as dapo).
declare("cispo", label="CISPO", loss="cispo", eps_low=1.0, eps_high=4.0)
