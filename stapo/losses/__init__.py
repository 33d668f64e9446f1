"""The policy losses: pure functions of tensors (no TRL import), the heart of the paper. What a method is and its
hyper-parameters are the study's (torch-free, checked before torch loads): stapo/study/methods.py (one declaration
per method: token mask, loss, defaults) and stapo/study/objective.py (ObjectiveConfig, AggMode, QuantileScope).

    registry.py     the registries of token masks, threshold functions and per-token losses, and their types
    masks.py        the token masks (S2T, 20-Entropy, the ablations) and the entropy thresholds they read
    policy.py       policy_loss, the one entry point of every method; verl's clipped surrogate with dual clip, k3 KL
    related.py      verl 0.9.1's other policy losses (Clip-Cov, KL-Cov, GSPO, CISPO, DPPO-TV/KL, SAPO, GMPO, GPG,
                    DRO): each equal to verl's function
    trl_losses.py   TRL 1.16's per-token losses that verl's do not give (its clipped surrogate, token and sequence
                    level; VESPO): each equal to TRL's GRPOTrainer._compute_loss
    aggregation.py  one aggregator per loss_agg_mode: the micro-batch's loss and the trainer's weights and normalisers

Plug-ins: the modules below register their masks, thresholds and losses in stapo.losses.registry when the package
is imported, so every table is complete whichever module is asked first. A new method's function goes in one of them
(or in a module of its own, added here).
"""

from stapo.losses import masks, policy, related, trl_losses  # noqa: F401  (plug-in list: they fill stapo.losses.registry)
