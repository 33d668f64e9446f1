"""TRL 1.16's per-token losses that verl's do not already give, registered in stapo.losses.registry's
``POLICY_LOSSES`` and aggregated by stapo.losses.policy's ``policy_loss`` as every method's; each equal to the branch
of ``GRPOTrainer._compute_loss`` (trl/trainer/grpo_trainer.py) it restates, driven through TRL's own trainer on the
same inputs (tests/test_trl_losses.py). TRL's ``dr_grpo`` and ``luspo`` loss types are aggregations
(stapo.losses.aggregation: seq-mean-token-sum-norm, seq-mean-token-sum) over one of these losses:

    ppo_clip       −min(ρÂ, clip(ρ, 1 − ε_low, 1 + ε_high)Â), ρ = exp(log ρ) unclamped, no dual clip
                   (TRL's grpo / bnpo / dr_grpo / dapo / luspo at importance_sampling_level="token")
    sequence_clip  the same on the sequence ratio s_i = exp(mean_t log ρ_it), one value per completion (TRL's
                   importance_sampling_level="sequence": GSPO without verl's cap of log s at 10; LUSPO's)
    vespo          −sg(φ(w_i)) · Â · log π, φ a gamma weight of the sequence ratio w_i = Π_t ρ_it  (arXiv 2602.10693)
    trl_sapo       verl's SAPO gate (stapo.losses.related.sapo_gates) on ρ = exp(log ρ) unclamped   (arXiv 2511.20347)

TRL's sapo and cispo differ from verl's only where verl clamps log ρ at ±20: there verl's gradient is 0 and TRL's
~ρ (tests/test_trl_losses.py measures it). SAPO is declared in both forms; CISPO in verl's.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from stapo.losses.registry import PerToken, register_policy_loss
from stapo.losses.related import sapo_gates
from stapo.study.objective import ObjectiveConfig

__all__ = ["ppo_clip_loss", "sequence_clip_loss", "vespo_weights", "vespo_loss", "trl_sapo_loss",
           "VESPO_LOG_RATIO_CLIP", "VESPO_LOG_W_MIN"]

VESPO_LOG_RATIO_CLIP = 20.0  # TRL clamps each token's log ρ to ±20 before summing ...
VESPO_LOG_W_MIN = math.log(1e-8)  # ... and the sequence's log w to [log 1e-8, 20]


def _clipped(cfg: ObjectiveConfig, coef: Tensor, adv: Tensor) -> Tensor:
    """TRL's two-sided PPO term −min(cÂ, clip(c, 1 − ε_low, 1 + ε_high)Â) (GRPOConfig.delta None: no upper cap)."""
    return -torch.min(coef * adv, torch.clamp(coef, 1 - cfg.eps_low, 1 + cfg.eps_high) * adv)


@register_policy_loss("ppo_clip")
def ppo_clip_loss(cfg: ObjectiveConfig, *, logps: Tensor, old_logps: Tensor, advantages: Tensor,
                  completion_mask: Tensor, **_) -> PerToken:
    """TRL 1.16's clipped surrogate (``GRPOTrainer._compute_loss``, loss_type grpo / bnpo / dr_grpo / dapo / luspo,
    importance_sampling_level="token"; DAPO arXiv 2503.14476 Eq. 8's per-token term): ρ = exp(log π − log π_old)
    unclamped and no dual clip, unlike verl's (stapo.losses.policy)."""
    coef = torch.exp(logps.float() - old_logps.float())
    loss = _clipped(cfg, coef, advantages.float().unsqueeze(-1))
    return PerToken(loss, coef.detach(), torch.zeros_like(completion_mask), None)


@register_policy_loss("sequence_clip")
def sequence_clip_loss(cfg: ObjectiveConfig, *, logps: Tensor, old_logps: Tensor, advantages: Tensor,
                       completion_mask: Tensor, **_) -> PerToken:
    """TRL 1.16's sequence-level clipped surrogate (importance_sampling_level="sequence"; GSPO arXiv 2507.18071
    Eq. 5, LUSPO arXiv 2602.05261): s_i = exp(Σ_t m log ρ / max(1, n_i)), ℓ_i = −min(s_i Â, clip(s_i) Â), one value
    per completion that each of its tokens carries (seq-mean-token-mean: TRL's GSPO; seq-mean-token-sum: its
    LUSPO, ℓ_i × n_i). No cap of log s (verl's GSPO caps it at 10: stapo.losses.related.gspo_loss)."""
    m = completion_mask.float()
    log_ratio = logps.float() - old_logps.float()
    coef = torch.exp((log_ratio * m).sum(-1) / m.sum(-1).clamp(min=1.0)).unsqueeze(-1)  # [B, 1]
    loss = _clipped(cfg, coef, advantages.float().unsqueeze(-1)).expand_as(log_ratio)
    return PerToken(loss, coef.expand_as(log_ratio).detach(), torch.zeros_like(completion_mask), None)


def vespo_weights(cfg: ObjectiveConfig, log_ratio: Tensor, mask: Tensor, adv: Tensor) -> Tensor:
    """VESPO's φ(w) [B, 1] (TRL 1.16 ``GRPOTrainer.get_gamma_weights`` without vLLM's importance ratio), no
    gradient: log w = clamp(Σ_t m clamp(log ρ_t, ±20), log 1e-8, 20), log φ = λ + k log w − λ w with (k, λ) =
    (k_pos, λ_pos) for Â ≥ 0 else (k_neg, λ_neg), λ ≥ 1e-4; non-finite φ → 0. φ(1) = 1: on-policy it is
    REINFORCE."""
    with torch.no_grad():
        seq = (torch.clamp(log_ratio, -VESPO_LOG_RATIO_CLIP, VESPO_LOG_RATIO_CLIP) * mask).sum(-1, keepdim=True)
        log_w = torch.clamp(seq, VESPO_LOG_W_MIN, 20.0)
        nonneg = adv >= 0
        k = torch.where(nonneg, cfg.vespo_k_pos, cfg.vespo_k_neg)
        lam = torch.where(nonneg, cfg.vespo_lambda_pos, cfg.vespo_lambda_neg).clamp(min=1e-4)
        log_phi = lam + k * log_w - lam * torch.exp(log_w)
        return torch.exp(log_phi).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


@register_policy_loss("vespo")
def vespo_loss(cfg: ObjectiveConfig, *, logps: Tensor, old_logps: Tensor, advantages: Tensor,
               completion_mask: Tensor, **_) -> PerToken:
    """VESPO (arXiv 2602.10693; TRL 1.16 loss_type="vespo"): ℓ = −sg(φ(w_i)) · Â · log π (:func:`vespo_weights`),
    normalised as TRL's dapo (token-mean)."""
    lp = logps.float()
    log_ratio = lp - old_logps.float()
    adv = advantages.float().unsqueeze(-1)
    phi = vespo_weights(cfg, log_ratio, completion_mask.float(), adv)
    return PerToken(-phi * adv * lp, torch.exp(log_ratio).detach(), torch.zeros_like(completion_mask), None)


@register_policy_loss("trl_sapo")
def trl_sapo_loss(cfg: ObjectiveConfig, *, logps: Tensor, old_logps: Tensor, advantages: Tensor,
                  completion_mask: Tensor, **_) -> PerToken:
    """SAPO as TRL 1.16 computes it (arXiv 2511.20347 Eq. 4; loss_type="sapo"): ℓ = −Â · σ(τ(ρ − 1)) · 4/τ with
    ρ = exp(log ρ) unclamped (verl clamps log ρ at ±20: stapo.losses.related.sapo_loss). Beyond log ρ ≈ 88, exp
    overflows float32 and the gradient is NaN, as TRL's (the trainer's non-finite guard stops such a run)."""
    lp = logps.float()
    ratio = torch.exp(lp - old_logps.float())
    adv = advantages.float().unsqueeze(-1).expand_as(lp)
    return PerToken(-sapo_gates(cfg, ratio, adv) * adv, ratio.detach(), torch.zeros_like(completion_mask), None)
