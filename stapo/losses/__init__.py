"""The policy losses: pure functions of tensors (no TRL import), the heart of the paper.

    methods.py      the methods a study can train, one declaration each (token mask, loss, defaults)
    config.py       ObjectiveConfig (a method's hyper-parameters), AggMode, QuantileScope (no torch: studies are
                    checked before it loads)
    registry.py     the registries of token masks, threshold functions and per-token losses, and their types
    masks.py        the token masks (S2T, 20-Entropy, the ablations) and the entropy thresholds they read
    policy.py       policy_loss, the one entry point of every method; verl's clipped surrogate with dual clip, k3 KL
    related.py      Clip-Cov, KL-Cov, GSPO, CISPO: losses of their own, each equal to verl 0.9.1's
    aggregation.py  one aggregator per loss_agg_mode: the micro-batch's loss and the trainer's weights and normalisers

Plug-ins: the modules below register their masks, thresholds and losses in stapo.losses.registry when the package
is imported, so every table is complete whichever module is asked first. A new method's function goes in one of them
(or in a module of its own, added here).
"""

from stapo.losses import masks, policy, related  # noqa: F401  (plug-in list: they fill stapo.losses.registry)
