"""The paper's step unit: verl training steps (rollout batches), and their mapping onto TRL's optimiser steps.

verl (and so the paper, JustRL and every figure) counts a *training step* as one rollout batch: 256 prompts × 8
rollouts, updated in prompts_per_generation / prompts_per_step = 4 PPO mini-batches (optimiser steps) per PPO
epoch. The LR scheduler advances once per rollout batch (after the batch's last update). TRL counts optimiser
steps and advances the LR after each. The recipe speaks in rollout steps (``train.max_steps``, ``warmup_steps``,
``save_steps``, ``workflow.eval_every``); this module converts them once, where TRL is configured:

    optimiser steps per rollout step  k = prompts_per_generation / prompts_per_step × num_iterations
    TRL max_steps = k · max_steps,  TRL save_steps = k · save_steps,  checkpoint-N holds rollout step N / k
    LR at optimiser step o = the rollout-unit schedule at rollout step ⌊o / k⌋ (verl: constant within a batch)

No torch import: the workflow and the report use it at parse time.
"""

from __future__ import annotations

__all__ = ["optimizer_steps_per_rollout", "rollout_step", "per_rollout_schedule"]


def optimizer_steps_per_rollout(train: dict) -> int:
    """k for a recipe's ``train`` section (a dict, or anything with those attributes)."""
    get = train.get if isinstance(train, dict) else lambda key, default=None: getattr(train, key, default)
    ppg, pps = int(get("prompts_per_generation", 256)), int(get("prompts_per_step", 64))
    if ppg % pps:
        raise ValueError(f"train.prompts_per_generation ({ppg}) must be a multiple of train.prompts_per_step ({pps})")
    return ppg // pps * int(get("num_iterations", 1))


def rollout_step(optimizer_step: int, k: int) -> int:
    """The rollout step (1-based, verl's ``global_steps``) that optimiser step ``optimizer_step`` (1-based) is in."""
    return -(-int(optimizer_step) // int(k))


def per_rollout_schedule(scheduler, k: int):
    """Make a ``LambdaLR`` built in rollout units (warm-up and length in rollout steps) advance once per k
    optimiser steps, as verl's does once per rollout batch: every lambda f becomes o ↦ f(⌊o / k⌋).

    The initial LR is unchanged (f(0)); the scheduler's state_dict (last_epoch) still counts optimiser steps, so
    resuming from a TRL checkpoint restores the same LR.
    """
    if k == 1:
        return scheduler
    scheduler.lr_lambdas = [(lambda o, f=f: f(o // k)) for f in scheduler.lr_lambdas]
    return scheduler
