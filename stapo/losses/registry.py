"""The losses' registries (verl ``register_policy_loss`` style) and the types they exchange.

A method's declaration (stapo/study/methods.py) names one token mask, one per-token loss and, if its mask reads
any, one threshold function, each registered here by the module that defines it (masks.py, policy.py, related.py;
the package's __init__ imports those modules: the plug-in list). Uniform signatures, all tensors as keywords, shapes
[B, T] (B completions, T completion positions) unless said:

    ThresholdsFn   (cfg, *, logps, entropies, advantages, completion_mask, gather=True, candidates=None) -> Thresholds
                   over all the given tokens on every rank (it gathers: every rank calls it at the same time), or this
                   rank's alone with gather=False ("micro_batch_local_topk" scope)
    TokenMaskFn    (cfg, *, logps, entropies, advantages [B], completion_mask, thresholds, generator, candidates)
                   -> (kept, silenced), Bool each: the tokens that enter the loss, and those the mask silenced
                   (reported as silenced_fraction; all False for masks that only keep); ``thresholds`` is None for a
                   mask declared without; ``candidates``: the call's S2T candidates when policy_loss computed them
    PolicyLossFn   (cfg, *, logps, old_logps, advantages [B], completion_mask, generator) -> PerToken, with logps and
                   old_logps already zeroed in the padding
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import torch
from torch import Tensor

from stapo.study.objective import ObjectiveConfig

__all__ = ["Thresholds", "PerToken", "ThresholdsFn", "TokenMaskFn", "PolicyLossFn", "THRESHOLDS", "TOKEN_MASKS",
           "POLICY_LOSSES", "register_thresholds", "register_token_mask", "register_policy_loss"]


@dataclass(frozen=True)
class Thresholds:
    """Entropy thresholds of one optimiser step ("mini_batch" scope), fixed before its first micro-batch.

    A value is NaN when its pool is empty (no candidates: nothing is silenced; no tokens: nothing is kept).
        tau_h         S2T: q-quantile of the candidates' entropies (stapo, stapo_random's size)
        tau_h_high    stapo_high: (1 − q)-quantile of the candidates' entropies
        entropy_cut   20-Entropy: (1 − ρ)-quantile of all completion tokens' entropies
        entropy_top_k 20-Entropy at "micro_batch_local_topk" scope: keep exactly this many tokens by top-k (None:
                      use entropy_cut)
    """

    tau_h: float = math.nan
    tau_h_high: float = math.nan
    entropy_cut: float = math.nan
    entropy_top_k: int | None = None



class PerToken(NamedTuple):
    """A method's per-token loss of one micro-batch (all [B, T], fp32)."""

    loss: Tensor  # ℓ, aggregated by policy_loss over the kept tokens as loss_agg_mode says
    ratio: Tensor  # the importance ratio the clip-fraction metrics read (detached use only)
    dual: Tensor  # Bool: where the dual-clip cap c·|Â| binds
    detached: Tensor | None  # Bool: tokens whose gradient the loss itself removes, kept in the denominator


class ThresholdsFn(Protocol):
    def __call__(self, cfg: ObjectiveConfig, *, logps: Tensor, entropies: Tensor, advantages: Tensor,
                 completion_mask: Tensor, gather: bool = True, candidates: Tensor | None = None) -> Thresholds: ...


class TokenMaskFn(Protocol):
    def __call__(self, cfg: ObjectiveConfig, *, logps: Tensor, entropies: Tensor, advantages: Tensor,
                 completion_mask: Tensor, thresholds: Thresholds | None, generator: torch.Generator | None,
                 candidates: Tensor | None) -> tuple[Tensor, Tensor]: ...


class PolicyLossFn(Protocol):
    def __call__(self, cfg: ObjectiveConfig, *, logps: Tensor, old_logps: Tensor, advantages: Tensor,
                 completion_mask: Tensor, generator: torch.Generator | None) -> PerToken: ...


THRESHOLDS: dict[str, ThresholdsFn] = {}
TOKEN_MASKS: dict[str, TokenMaskFn] = {}
POLICY_LOSSES: dict[str, PolicyLossFn] = {}


def _registrar(table: dict, what: str, name: str) -> Callable:
    def register(fn):
        if name in table:
            raise ValueError(f"{what} {name!r} is registered twice")
        table[name] = fn
        return fn
    return register


def register_thresholds(name: str):
    """Register a step-threshold function under ``name`` (the ``thresholds`` of a method's declaration)."""
    return _registrar(THRESHOLDS, "thresholds", name)


def register_token_mask(name: str):
    """Register a token-mask function under ``name`` (the ``token_mask`` of a method's declaration)."""
    return _registrar(TOKEN_MASKS, "token mask", name)


def register_policy_loss(name: str):
    """Register a per-token loss under ``name`` (the ``loss`` of a method's declaration)."""
    return _registrar(POLICY_LOSSES, "policy loss", name)
