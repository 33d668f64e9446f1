"""The paper's token analysis, as cheap per-step statistics: which tokens get the largest gradients, and why.

Theory (paper, Sec. "Gradient analysis"). For one token with logits a, π = softmax(a), sampled y, the gradient of
the clipped surrogate J = min(ρÂ, clip(ρ)Â) with respect to the logits is w (e_y − π), w = ρÂ (0 when the clip
branch is active), hence

    ‖∇_a J‖² = w² (1 − 2π(y) + Σ_v π(v)²)                                                  (closed form)
    w² (1 − 2π(y) + e^{−H}) ≤ ‖∇_a J‖² ≤ w² (2 − 2π(y) − C_V H²),  C_V = (|V|−1) / (|V| (ln|V|)²)

so low-probability (small π(y)), low-entropy (large Σπ²) tokens receive the largest updates. The functions here
take the per-token tensors the trainer already has (log-probs, entropies, collision probabilities from
:mod:`stapo.tokenstats`, ratios, advantages) and summarise them per probability × entropy quadrant, with the
thresholds of the S2T mask (τ_p and the candidates' q-quantile).

Shapes: logps, entropies, collision, ratio, completion_mask [B, T]; advantages [B].
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from stapo.objectives import candidate_mask, quantile

__all__ = [
    "QUADRANTS",
    "ENTROPY_QUANTILES",
    "grad_norm_sq",
    "gradient_norm_bounds",
    "quadrant_stats",
    "entropy_quantiles",
    "silenced_examples",
]

QUADRANTS = ("lowp_lowh", "lowp_highh", "highp_lowh", "highp_highh")
ENTROPY_QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9)


def grad_norm_sq(
    *, logps: Tensor, collision: Tensor, ratio: Tensor, advantages: Tensor, eps_low: float, eps_high: float
) -> Tensor:
    """Closed-form ‖∇_a J‖² = w²(1 − 2p + Σπ²) per token [B, T]; w = ρÂ, 0 where the clipped branch is active.

    Computed in fp32 at least (fp64 inputs stay fp64: 1 − 2p + Σπ² cancels when p → 1).
    """
    dt = torch.promote_types(logps.dtype, torch.float32)
    adv = advantages.to(dt).unsqueeze(-1)
    ratio = ratio.to(dt)
    clipped = ((ratio > 1.0 + eps_high) & (adv > 0)) | ((ratio < 1.0 - eps_low) & (adv < 0))
    w = torch.where(clipped, torch.zeros_like(ratio), ratio * adv)
    p = logps.to(dt).exp()
    return w * w * (1.0 - 2.0 * p + collision.to(dt))


def gradient_norm_bounds(*, logps: Tensor, entropies: Tensor, vocab_size: int, w: Tensor | float = 1.0):
    """The paper's (lower, upper) bounds on ‖∇_a J‖² from p and H alone."""
    p = logps.float().exp()
    h = entropies.float()
    c_v = (vocab_size - 1) / (vocab_size * math.log(vocab_size) ** 2)
    w2 = torch.as_tensor(w, dtype=torch.float32) ** 2
    return w2 * (1.0 - 2.0 * p + torch.exp(-h)), w2 * (2.0 - 2.0 * p - c_v * h * h)


def quadrant_stats(
    *, logps: Tensor, entropies: Tensor, collision: Tensor, ratio: Tensor, advantages: Tensor,
    completion_mask: Tensor, tau_p: float, q: float, eps_low: float, eps_high: float,
) -> dict[str, float]:
    """Count and mean closed-form gradient norm ‖∇_a J‖ per probability × entropy quadrant.

    Population: completion tokens of positive-advantage responses. Split: p < τ_p ("lowp") vs ≥, and H < τ_h
    ("lowh") vs ≥, τ_h the q-quantile of the S2T candidates' entropies — so lowp_lowh is exactly the S2T-silenced
    set. Without candidates, τ_h falls back to the q-quantile of the population (reported as quadrant/tau_h).
    Keys: quadrant/<name>_count, quadrant/<name>_grad_norm (NaN for an empty quadrant), quadrant/tau_h.
    """
    m = completion_mask.bool()
    pop = m & (advantages > 0).unsqueeze(-1)
    cand = candidate_mask(logps=logps, advantages=advantages, completion_mask=m, tau_p=tau_p)
    h = entropies.detach().float()
    pool = h[cand] if cand.any() else h[pop]
    tau_h = quantile(pool, q).item() if pool.numel() else float("nan")
    norm = grad_norm_sq(logps=logps.detach(), collision=collision.detach(), ratio=ratio.detach(),
                        advantages=advantages, eps_low=eps_low, eps_high=eps_high).clamp(min=0).sqrt()
    lowp = logps.detach().float().exp() < tau_p
    lowh = h < tau_h
    out: dict[str, float] = {"quadrant/tau_h": tau_h}
    for name, sel in zip(QUADRANTS, (lowp & lowh, lowp & ~lowh, ~lowp & lowh, ~lowp & ~lowh)):
        sel = sel & pop
        n = int(sel.sum())
        out[f"quadrant/{name}_count"] = float(n)
        out[f"quadrant/{name}_grad_norm"] = float(norm[sel].mean()) if n else float("nan")
    return out


def entropy_quantiles(entropies: Tensor, completion_mask: Tensor) -> dict[str, float]:
    """10/25/50/75/90 % quantiles of the entropies of all completion tokens (paper's quantile curves)."""
    h = entropies.detach().float()[completion_mask.bool()]
    return {f"entropy_q{round(q * 100)}": (quantile(h, q).item() if h.numel() else float("nan"))
            for q in ENTROPY_QUANTILES}


def silenced_examples(
    *, silenced: Tensor, completion_ids: Tensor, logps: Tensor, entropies: Tensor, advantages: Tensor,
    top_ids: Tensor, top_logps: Tensor, tokenizer, k: int = 8, context: int = 16,
) -> list[dict]:
    """Up to ``k`` silenced tokens as readable records (paper's table of spurious-token examples).

    silenced, completion_ids, logps, entropies: [B, T]; top_ids, top_logps: [B, T, K] (the policy's top-K
    alternatives at each position). Each record: token, context (the ``context`` tokens before, decoded), p, H,
    advantage, top (list of {token, p}).
    """
    rows = []
    for b, t in silenced.nonzero().tolist()[:k]:
        ids = completion_ids[b]
        rows.append({
            "token": tokenizer.decode([int(ids[t])]),
            "context": tokenizer.decode(ids[max(0, t - context) : t].tolist()),
            "p": math.exp(float(logps[b, t])),
            "entropy": float(entropies[b, t]),
            "advantage": float(advantages[b]),
            "top": [{"token": tokenizer.decode([int(i)]), "p": math.exp(float(lp))}
                    for i, lp in zip(top_ids[b, t].tolist(), top_logps[b, t].tolist())],
        })
    return rows
