"""``policy_loss``: the loss of one micro-batch for any declared method, the one entry point every method goes
through; and verl's clipped surrogate, the per-token loss of the paper's four methods.

Each method's hyper-parameters are a ``stapo.study.objective.ObjectiveConfig`` (the study's ``methods`` section,
with the paper's defaults). No TRL import: the trainer passes TRL's per-token tensors in and back-propagates the loss.

Shapes (B completions, T completion positions, right-padded):
    logps, old_logps, ref_logps, entropies, completion_mask   [B, T]
    advantages                                                [B]   one sequence-level advantage
Per-token surrogate (all methods; paper Eq. 1-2, as verl's ``compute_policy_loss_vanilla`` computes it, 0.4 to 0.9.1),
with ratio ρ = exp(clamp(logps − old_logps, ±20)):
    ℓ_t = −min(ρ_t Â, clip(ρ_t, 1 − ε_low, 1 + ε_high) Â)          for Â ≥ 0
    ℓ_t = min(−min(ρ_t Â, clip(ρ_t, …) Â), c·|Â|)                    for Â < 0 (dual clip, c = clip_ratio_c)
The dual clip caps a negative-advantage token's loss at c·|Â| (zero gradient beyond): it bites on tokens whose
probability rose a lot since sampling (ρ > c), typically rare tokens (π_old ≈ 1e-6).

    grpo       mean_i [ Σ_t m_it (ℓ_it + β k3_it) / max(1, Σ_t m_it) ]           (paper Eq. 1; DeepSeekMath)
               k3 = clamp(e^δ − δ − 1, ±10), δ = clamp(log π_ref − log π, ±20)   (verl ``low_var_kl``)
    justrl     Σ m ℓ / max(1, Σ m)                                              (paper Eq. 2; DAPO token-mean)
    entropy20  Σ k ℓ / max(1, Σ k),  k = m ∧ H ≥ quantile(H[m], 1 − ρ)           (arXiv 2506.01939 Eq. 6)
    stapo      Σ k ℓ / max(1, Σ k),  k = m ∧ ¬S2T                               (paper Eq. stapo_loss)

Related methods own their per-token loss (a method's declaration names it; :data:`POLICY_LOSSES`), aggregated as
above: verl 0.9.1's others (Clip-Cov, KL-Cov, GSPO, CISPO, DPPO, SAPO, GMPO, GPG, DRO), each equal to verl's function
(stapo/losses/related.py), and TRL 1.16's (its clipped surrogate, VESPO, SAPO), each equal to TRL's trainer
(stapo/losses/trl_losses.py).


Masks (which tokens are kept or silenced): stapo.losses.masks. Silenced and dropped tokens leave both the numerator
and the denominator. Aggregation (``loss_agg_mode``: token-mean, token-mean-per-micro-batch, seq-mean-token-mean,
seq-mean-token-sum, seq-mean-token-sum-norm):
stapo.losses.aggregation, which also owns how the trainer weighs micro-batches and ranks.
"""

from __future__ import annotations

import torch
from torch import Tensor

from stapo.losses.aggregation import aggregation
from stapo.study.objective import ObjectiveConfig
from stapo.losses.masks import candidate_mask, kept_mask
from stapo.losses import registry
from stapo.losses.registry import PerToken, Thresholds, register_policy_loss

__all__ = ["policy_loss", "k3_kl", "vanilla_loss"]

# ------------------------------------------------------------------------------------------------ loss


def _clipped_surrogate(cfg: ObjectiveConfig, logps: Tensor, old_logps: Tensor, advantages: Tensor):
    """verl's vanilla policy loss per token (module docstring): ℓ [B, T], ratio ρ [B, T] and the dual-clip
    mask [B, T] (True where the c·|Â| cap binds), in fp32."""
    log_ratio = torch.clamp(logps.float() - old_logps.float(), -cfg.log_ratio_clip, cfg.log_ratio_clip)
    ratio = torch.exp(log_ratio)
    adv = advantages.float().unsqueeze(-1)
    clipped = torch.clamp(ratio, 1.0 - cfg.eps_low, 1.0 + cfg.eps_high)
    loss = torch.maximum(-ratio * adv, -clipped * adv)
    cap = -adv * cfg.clip_ratio_c  # c·|Â| for Â < 0
    dual = (adv < 0) & (loss > cap)
    return torch.where(adv < 0, torch.minimum(loss, cap), loss), ratio, dual


def k3_kl(cfg: ObjectiveConfig, logps: Tensor, ref_logps: Tensor) -> Tensor:
    """verl ``low_var_kl``: k3 = e^δ − δ − 1, δ = clamp(log π_ref − log π, ±20), clamped to ±10. [B, T] fp32."""
    delta = torch.clamp(ref_logps.float() - logps.float(), -cfg.kl_log_ratio_clip, cfg.kl_log_ratio_clip)
    return torch.clamp(torch.exp(delta) - delta - 1.0, -cfg.kl_clip, cfg.kl_clip)





@register_policy_loss("vanilla")
def vanilla_loss(cfg: ObjectiveConfig, *, logps: Tensor, old_logps: Tensor, advantages: Tensor, **_) -> PerToken:
    """The paper's methods: verl's clipped surrogate with dual clip (module docstring)."""
    return PerToken(*_clipped_surrogate(cfg, logps, old_logps, advantages), None)


def policy_loss(
    cfg: ObjectiveConfig,
    *,
    logps: Tensor,
    old_logps: Tensor,
    advantages: Tensor,
    entropies: Tensor,
    completion_mask: Tensor,
    ref_logps: Tensor | None = None,
    token_normalizer: Tensor | float | None = None,
    generator: torch.Generator | None = None,
    thresholds: Thresholds | None = None,
    tokens: dict | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Loss of one micro-batch for ``cfg.method`` and its metrics (see the module docstring for the equations).

    token_normalizer: for "token-mean", replaces the local denominator max(1, Σ kept) — the trainer passes the
        number of KEPT tokens of the whole gradient-accumulation step. Not defined for "seq-mean-token-mean"
        (whose normaliser is per sequence) nor "token-mean-per-micro-batch" (whose denominator is this call's
        own kept count): passing it raises.
    generator: randomness of the stapo_random ablation (default: seeded from ``cfg.seed`` on every call).
    thresholds: the optimiser step's entropy thresholds (:func:`step_thresholds`, "mini_batch" scope); None takes
        them over this call's tokens ("micro_batch": gathered from every rank; "micro_batch_local_topk": this
        rank's alone, 20-Entropy by exact top-k).
    tokens: if given, filled with this call's Bool [B, T] ``candidates`` (S2T's, computed once here), ``kept`` and
        ``silenced``, for callers that report on them (the trainer's token diagnostics) without recomputing them.
    Returns a scalar fp32 loss (finite zero with a grad_fn on an all-masked or empty batch) and float metrics:
    entropy_mean (over all completion tokens, whatever the method), candidate/silenced/kept_fraction (of
    completion tokens), clip_fraction_low/high, clip_fraction, clip_fraction_dual, ratio_mean, kl_mean.
    """
    m = completion_mask.bool()
    # Padding may hold anything (even NaN): zero it through where(), whose backward sends exactly 0 there.
    logps, old_logps, entropies = (torch.where(m, t, torch.zeros_like(t)) for t in (logps, old_logps, entropies))
    if ref_logps is not None:
        ref_logps = torch.where(m, ref_logps, torch.zeros_like(ref_logps))
    per_token, ratio, dual, detached = registry.POLICY_LOSSES[cfg.loss](cfg, logps=logps, old_logps=old_logps,
                                                               advantages=advantages, completion_mask=m,
                                                               generator=generator)
    cand = candidate_mask(logps=logps, advantages=advantages, completion_mask=m, tau_p=cfg.tau_p)  # once
    kept, silenced = kept_mask(cfg, logps=logps, entropies=entropies, advantages=advantages, completion_mask=m,
                               generator=generator, thresholds=thresholds, candidates=cand)
    if detached is not None:  # a loss's own zero-gradient tokens (Clip-Cov) stay in the denominator
        silenced = silenced | detached

    kl = None
    if cfg.kl_beta > 0 or ref_logps is not None:
        if ref_logps is None:
            raise ValueError(f"kl_beta={cfg.kl_beta} > 0 needs ref_logps (the reference policy's log-probs)")
        kl = k3_kl(cfg, logps, ref_logps)  # ≥ 0
        if cfg.kl_beta > 0:
            per_token = per_token + cfg.kl_beta * kl  # same aggregation as the policy loss (verl)

    # where(), not multiplication: a masked position's value never reaches the loss or its gradient.
    masked = torch.where(kept, per_token, torch.zeros_like(per_token))
    loss = aggregation(cfg.loss_agg_mode).reduce(masked, kept, token_normalizer, horizon=cfg.loss_scale_factor)

    metrics = _metrics(cfg, m, kept, silenced, ratio, dual, entropies, cand, advantages, kl)
    if tokens is not None:
        tokens.update(candidates=cand, kept=kept, silenced=silenced)
    return loss, metrics


def _metrics(cfg, m, kept, silenced, ratio, dual, entropies, cand, advantages, kl) -> dict[str, float]:
    with torch.no_grad():
        n = max(1, int(m.sum()))
        adv = advantages.float().unsqueeze(-1)
        low = m & (ratio < 1.0 - cfg.eps_low) & (adv < 0)
        high = m & (ratio > 1.0 + cfg.eps_high) & (adv > 0)
        return {
            "entropy_mean": float(torch.where(m, entropies.float(), 0.0).sum() / n),
            "candidate_fraction": float(cand.sum()) / n,
            "silenced_fraction": float(silenced.sum()) / n,
            "kept_fraction": float(kept.sum()) / n,
            "clip_fraction_low": float(low.sum()) / n,
            "clip_fraction_high": float(high.sum()) / n,
            "clip_fraction": float((low | high).sum()) / n,
            "clip_fraction_dual": float((m & dual).sum()) / n,
            "ratio_mean": float(torch.where(m, ratio, 0.0).sum() / n),
            "kl_mean": 0.0 if kl is None else float(torch.where(m, kl, 0.0).sum() / n),
        }
