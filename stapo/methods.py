"""The methods a study can train, one declaration each; every other list of methods derives from here.

A method is a token mask (which completion tokens enter the shared clipped-surrogate loss) with the paper's
hyper-parameters. Its declaration names:

    key               what configs, paths and ``methods.<key>.objective`` use
    label             what tables and figures show (a study may override it with ``methods.<key>.label``)
    token_mask        the mask function, registered in stapo/objectives.py with ``@register_token_mask(name)``
    thresholds        the per-step entropy thresholds the mask reads, registered there with
                      ``@register_thresholds(name)`` (None: it reads none, and the trainer computes none)
    paper             the key of the paper's results table (None: the paper reports no number for it)
    main              one of the paper's four trained methods (its main table)
    defaults          the paper's values of stapo.study.ObjectiveConfig's fields for this method

The study schema's ``objective`` enum, ``stapo.names.METHODS`` (labels, the table's row order),
``stapo.study.OBJECTIVES`` (the defaults) and the trainer's choice of mask all read :data:`METHODS`; the contract
tests in tests/test_objectives.py run over every declared method. Adding a method (README "Add a method"): one
``declare(...)`` below and its mask function in stapo/objectives.py. No torch here: a study is checked against
these declarations before torch loads.
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


METHODS: dict[str, Method] = {}  # in declaration order: the table's row order


def declare(key: str, *, label: str, token_mask: str, thresholds: str | None = None, paper: str | None = None,
            main: bool = False, **defaults) -> Method:
    """Declare a method (module docstring); ``defaults`` are ObjectiveConfig fields (checked when it is built)."""
    if key in METHODS:
        raise ValueError(f"method {key!r} is declared twice")
    METHODS[key] = Method(key, label, token_mask, thresholds, paper, main, dict(defaults))
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
