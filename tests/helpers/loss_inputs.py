"""Random inputs of the policy losses and the comparison of ours with a source's (verl's function, TRL's trainer):
tests/test_related_methods.py, tests/test_trl_losses.py.

    inputs               moderate ratios: log-probs (a fifth rare, π < 0.002), old = new + noise, Â [B] of both signs,
                         masks of 1..T tokens a row
    extreme_inputs       every log ρ near one of EXTREME_LOG_RATIOS (the ±20 clamps, GSPO's cap at 10, dual clips)
    probability_inputs   π and π_old both in (0, 1): close, anywhere, or below e^−21 (trust regions, weight caps)
"""

from __future__ import annotations

import math

import torch

from stapo.losses import registry
from stapo.losses.aggregation import aggregation
from stapo.losses.policy import policy_loss


def inputs(B: int, T: int, seed: int, noise: float) -> dict:
    """Random log-probs (a fifth rare, π < 0.002), old = new + noise, advantages [B] of both signs, masks with
    1..T tokens per row and random (finite) values in the padding."""
    g = torch.Generator().manual_seed(seed)
    probs = torch.rand(B, T, generator=g) * 0.9 + 0.05
    probs = torch.where(torch.rand(B, T, generator=g) < 0.2, torch.rand(B, T, generator=g) * 0.002, probs)
    logps = probs.log()
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    return dict(logps=logps, old_logps=logps + noise * torch.randn(B, T, generator=g),
                advantages=torch.randn(B, generator=g),
                completion_mask=(torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)).int())


EXTREME_LOG_RATIOS = (-30.0, -15.0, 15.0, 30.0)


def extreme_inputs(B: int, T: int, seed: int, log_ratio: float) -> dict:
    """:func:`_inputs` with every log ρ = log_ratio ± 0.5·N(0, 1)."""
    x = inputs(B, T, seed, 0.5)
    return {**x, "old_logps": x["old_logps"] - log_ratio}


def probability_inputs(B: int, T: int, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)

    def mixture(close_to=None):
        choice = torch.randint(0, 3, (B, T), generator=g)
        tiny = torch.log(torch.rand(B, T, generator=g) * 1e-10 + 1e-12)
        anywhere = torch.log(torch.rand(B, T, generator=g) * 0.98 + 0.01)
        near = anywhere if close_to is None else (close_to + 0.05 * torch.randn(B, T, generator=g)).clamp(max=-1e-6)
        return torch.where(choice == 0, near, torch.where(choice == 1, anywhere, tiny))

    logps = mixture()
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    return dict(logps=logps, old_logps=mixture(close_to=logps), advantages=torch.randn(B, generator=g),
                completion_mask=(torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)).int())


def ours(cfg, x: dict, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    logps = x["logps"].clone().requires_grad_(True)
    loss, _ = policy_loss(cfg, logps=logps, old_logps=x["old_logps"], advantages=x["advantages"],
                          entropies=torch.zeros_like(logps), completion_mask=x["completion_mask"],
                          generator=torch.Generator().manual_seed(seed))
    loss.backward()
    with torch.no_grad():  # the loss's scale: the same aggregation of |ℓ| (where the terms cancel, float32's
        m = x["completion_mask"].bool()  # summation order alone moves the loss by ~1e-7 of this, not of the loss)
        lp, old = (torch.where(m, x[k], 0.0) for k in ("logps", "old_logps"))
        per = registry.POLICY_LOSSES[cfg.loss](cfg, logps=lp, old_logps=old, advantages=x["advantages"],
                                               completion_mask=m, generator=torch.Generator().manual_seed(seed)).loss
        scale = aggregation(cfg.loss_agg_mode).reduce(torch.where(m, per.abs(), 0.0), m,
                                                      horizon=cfg.loss_scale_factor)
    return loss.detach(), logps.grad, scale


def relative_differences(a, b) -> tuple[float, float]:
    """(loss, gradient) relative differences of ours ``a`` (loss, gradient, the loss's scale) to the source's ``b``:
    the loss's relative to the larger of |loss| and its scale, the gradient's relative to its largest element; inf
    where either side is not finite (a NaN would pass a max())."""
    (la, ga, scale), (lb, gb) = a, b
    diff = (float((la - lb).abs() / torch.maximum(lb.abs(), scale).clamp(min=1e-12)),
            float((ga - gb).abs().max() / gb.abs().max().clamp(min=1e-12)))
    return tuple(d if math.isfinite(d) else math.inf for d in diff)
