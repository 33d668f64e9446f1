"""The related methods' own per-token losses from verl 0.9.1 (verl/trainer/ppo/core_algos.py), registered in
stapo.losses.registry's ``POLICY_LOSSES`` and aggregated by stapo.losses.policy's ``policy_loss`` as every method's;
each equal to verl 0.9.1's function of the same name (tests/test_related_methods.py):

    clip_cov   PPO-clip, the gradient of a random r·n of the tokens with covariance in (lb, ub) detached (ℓ × 0,
               still counted in the denominator)                               (arXiv 2505.22617)
    kl_cov     −Âρ (no clip) + β|log ρ| on the top k·n tokens by covariance   (arXiv 2505.22617)
    gspo       PPO-clip on the length-normalised sequence ratio               (arXiv 2507.18071)
    cispo      −sg(clip(ρ)) Â log π                                           (arXiv 2506.13585)
    dppo_tv    −Â sg(min(ρ, C)) log π on the tokens inside the TV trust region  (arXiv 2602.04879)
    dppo_kl    the same inside the binary-KL trust region                       (arXiv 2602.04879)
    sapo       −Â σ(τ(ρ − 1))·4/τ, a soft gate instead of the clip             (arXiv 2511.20347)
    geo_mean   −Â times the geometric mean of the clipped token ratios          (arXiv 2507.20673, GMPO)
    gpg        −Â log π                                                        (arXiv 2504.02546)
    dro        −(Â log π − β/2 (log ρ)²)                                       (verl compute_policy_loss_dro)
with covariance (Â − mean Â)(log π − mean log π) over the call's completion tokens; ρ = π_θ / π_old per token.
"""

from __future__ import annotations

import torch
from torch import Tensor

from stapo.losses.registry import PerToken, register_policy_loss
from stapo.study.objective import ObjectiveConfig

__all__ = ["clip_cov_loss", "kl_cov_loss", "gspo_loss", "cispo_loss", "dppo_tv_loss", "dppo_kl_loss", "sapo_loss",
           "geo_mean_loss", "gpg_loss", "dro_loss", "sapo_gates", "clamped_ratio"]


def clamped_ratio(cfg: ObjectiveConfig, logps: Tensor, old_logps: Tensor) -> Tensor:
    """ρ = exp(clamp(log π − log π_old, ±log_ratio_clip)) [B, T], fp32: verl's clamped importance ratio (CISPO,
    DPPO, SAPO; stapo.losses.policy's vanilla loss clamps the same way)."""
    return torch.exp(torch.clamp(logps.float() - old_logps.float(), -cfg.log_ratio_clip, cfg.log_ratio_clip))


def _masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    """Σ values over ``mask`` / (Σ mask + 1e-8), as verl's ``masked_mean``."""
    return torch.where(mask, values, 0.0).sum() / (mask.sum() + 1e-8)


def _ppo_terms(cfg: ObjectiveConfig, logps: Tensor, old_logps: Tensor, advantages: Tensor):
    """Unclamped ratio ρ and the two PPO branches −Âρ, −Â·clip(ρ) [B, T] (verl's Clip-Cov: no log-ratio clamp)."""
    ratio = torch.exp(logps.float() - old_logps.float())
    adv = advantages.float().unsqueeze(-1).expand_as(ratio)
    return ratio, adv, -adv * ratio, -adv * torch.clamp(ratio, 1 - cfg.eps_low, 1 + cfg.eps_high)


@register_policy_loss("clip_cov")
def clip_cov_loss(cfg: ObjectiveConfig, *, logps: Tensor, old_logps: Tensor, advantages: Tensor,
                  completion_mask: Tensor, generator: torch.Generator | None = None, **_) -> PerToken:
    """Clip-Cov (arXiv 2505.22617; verl 0.9.1 ``compute_policy_loss_clip_cov``): the PPO-clip loss, with the gradient
    of max(1, ⌊r·n⌋) tokens detached (ℓ × 0), drawn at random among the unclipped completion tokens whose
    covariance (Â − mean Â)(log π − mean log π) lies in (lb, ub); n = the call's completion tokens. The detached
    tokens stay in the denominator. Random choice: ``generator`` (default: seeded from ``cfg.seed``)."""
    m = completion_mask
    ratio, adv, loss1, loss2 = _ppo_terms(cfg, logps, old_logps, advantages)
    lp = logps.float()
    with torch.no_grad():
        cov = (adv - _masked_mean(adv, m)) * (lp - _masked_mean(lp, m))
        eligible = m & ~(loss2 > loss1) & (cov > cfg.clip_cov_lb) & (cov < cfg.clip_cov_ub)
        idx = eligible.nonzero()
        corr = torch.ones_like(ratio)
        if len(idx):
            gen = torch.Generator().manual_seed(cfg.seed) if generator is None else generator
            perm = torch.randperm(len(idx), generator=gen).to(idx.device)
            pick = idx[perm[: max(int(cfg.clip_cov_ratio * int(m.sum())), 1)]]
            corr[pick[:, 0], pick[:, 1]] = 0
    return PerToken(torch.maximum(loss1, loss2) * corr, ratio.detach(), torch.zeros_like(m), corr == 0)


@register_policy_loss("kl_cov")
def kl_cov_loss(cfg: ObjectiveConfig, *, logps: Tensor, old_logps: Tensor, advantages: Tensor,
                completion_mask: Tensor, **_) -> PerToken:
    """KL-Cov (arXiv 2505.22617; verl 0.9.1 ``compute_policy_loss_kl_cov``): the unclipped surrogate −Âρ, plus
    β·|log ρ| on the max(1, ⌊k·n⌋) completion tokens of largest covariance (Â − mean Â)(log π − mean log π) of the
    call (β = ppo_kl_coef, k = kl_cov_ratio). No ratio clip, as verl's."""
    log_ratio = logps.float() - old_logps.float()
    ratio = torch.exp(log_ratio)
    adv = advantages.float().unsqueeze(-1).expand_as(ratio)
    loss = -adv * ratio
    with torch.no_grad():
        valid = completion_mask.flatten().nonzero().squeeze(-1)
        penalised = torch.zeros_like(completion_mask).flatten()
        if valid.numel():
            a, lp = adv.flatten()[valid], logps.detach().float().flatten()[valid]
            cov = (a - a.mean()) * (lp - lp.mean())
            k = max(1, int(valid.numel() * cfg.kl_cov_ratio))
            penalised[valid[torch.topk(cov, k, largest=True).indices]] = True
    loss = torch.where(penalised.view_as(loss), -adv * ratio + cfg.ppo_kl_coef * log_ratio.abs(), loss)
    return PerToken(loss, ratio.detach(), torch.zeros_like(completion_mask), None)


GSPO_LOG_RATIO_MAX = 10.0  # verl clamps the sequence log-ratio from above only, at 10


@register_policy_loss("gspo")
def gspo_loss(cfg: ObjectiveConfig, *, logps: Tensor, old_logps: Tensor, advantages: Tensor,
              completion_mask: Tensor, **_) -> PerToken:
    """GSPO (arXiv 2507.18071 Eq. 7; verl 0.9.1 ``compute_policy_loss_gspo``; TRL importance_sampling_level=
    "sequence"): the PPO-clip loss on the length-normalised sequence ratio s_i = exp(mean_t log ρ_it), whose
    gradient flows per token as s_it = sg(s_i) · π_θ(y_t) / sg(π_θ(y_t)); log s_it ≤ 10. No dual clip."""
    lp = logps.float()
    log_ratio = lp - old_logps.float()
    seq = torch.sum(log_ratio * completion_mask, dim=-1) / completion_mask.sum(-1).clamp(min=1)
    log_s = torch.clamp(lp - lp.detach() + seq.detach().unsqueeze(-1), max=GSPO_LOG_RATIO_MAX)
    s = torch.exp(log_s)
    adv = advantages.float().unsqueeze(-1).expand_as(s)
    loss = torch.maximum(-adv * s, -adv * torch.clamp(s, 1 - cfg.eps_low, 1 + cfg.eps_high))
    return PerToken(loss, s.detach(), torch.zeros_like(completion_mask), None)


@register_policy_loss("cispo")
def cispo_loss(cfg: ObjectiveConfig, *, logps: Tensor, old_logps: Tensor, advantages: Tensor,
               completion_mask: Tensor, **_) -> PerToken:
    """CISPO (arXiv 2506.13585 Eq. 4; verl 0.9.1 ``compute_policy_loss_cispo``; TRL loss_type="cispo"):
    ℓ = −sg(clip(ρ, 1 − ε_low, 1 + ε_high)) · Â · log π_θ(y_t): every token keeps its gradient, weighted by the
    clipped importance ratio (log ρ clamped to ±log_ratio_clip)."""
    lp = logps.float()
    ratio = clamped_ratio(cfg, lp, old_logps)
    weight = torch.clamp(ratio, 1 - cfg.eps_low, 1 + cfg.eps_high).detach()
    adv = advantages.float().unsqueeze(-1).expand_as(lp)
    return PerToken(-weight * adv * lp, ratio.detach(), torch.zeros_like(completion_mask), None)


# ------------------------------------------------------------------------ verl 0.9.1's other registered losses


def _dppo(cfg: ObjectiveConfig, logps: Tensor, old_logps: Tensor, advantages: Tensor, completion_mask: Tensor,
          valid) -> PerToken:
    """DPPO's shared form (verl 0.9.1 ``compute_policy_loss_dppo_tv`` / ``_dppo_kl``): ℓ = −Â · sg(min(ρ, C)) ·
    log π · v, ρ = exp(clamp(log ρ, ±20)), C = dppo_is_cap, v = ``valid(p, p_old, lp, old, Â)`` (Bool, no
    gradient): the token is inside the trust region in the direction its advantage pushes it. A token outside
    (v = 0) keeps its place in the denominator: reported as ``detached``, as Clip-Cov's."""
    lp, old = logps.float(), old_logps.float()
    ratio = clamped_ratio(cfg, lp, old)
    weight = torch.clamp(ratio, max=cfg.dppo_is_cap).detach()
    adv = advantages.float().unsqueeze(-1).expand_as(lp)
    with torch.no_grad():
        v = valid(torch.exp(lp), torch.exp(old), lp, old, adv)
    loss = -adv * weight * lp * v.float()
    return PerToken(loss, ratio.detach(), torch.zeros_like(completion_mask), completion_mask & ~v)


@register_policy_loss("dppo_tv")
def dppo_tv_loss(cfg: ObjectiveConfig, *, logps: Tensor, old_logps: Tensor, advantages: Tensor,
                 completion_mask: Tensor, **_) -> PerToken:
    """DPPO-Binary-TV (arXiv 2602.04879; verl 0.9.1 ``compute_policy_loss_dppo_tv``): :func:`_dppo` with the
    total-variation region: Â > 0 keeps π − π_old ≤ δ_high, Â ≤ 0 keeps π − π_old ≥ −δ_low."""
    def valid(p, p_old, lp, old, adv):
        return torch.where(adv > 0, (p - p_old) <= cfg.dppo_delta_high, (p - p_old) >= -cfg.dppo_delta_low)
    return _dppo(cfg, logps, old_logps, advantages, completion_mask, valid)


@register_policy_loss("dppo_kl")
def dppo_kl_loss(cfg: ObjectiveConfig, *, logps: Tensor, old_logps: Tensor, advantages: Tensor,
                 completion_mask: Tensor, **_) -> PerToken:
    """DPPO-Binary-KL (arXiv 2602.04879; verl 0.9.1 ``compute_policy_loss_dppo_kl``): :func:`_dppo` with the binary
    KL D = p_old (log p_old − log p) + (1 − p_old) log((1 − p_old + 1e-8) / (1 − p + 1e-8)): Â > 0 keeps
    D ≤ δ_high or p ≤ p_old, Â ≤ 0 keeps D ≤ δ_low or p ≥ p_old."""
    def valid(p, p_old, lp, old, adv):
        kl = p_old * (old - lp) + (1 - p_old) * torch.log((1.0 - p_old + 1e-8) / (1.0 - p + 1e-8))
        return torch.where(adv > 0, (kl <= cfg.dppo_delta_high) | (p <= p_old),
                           (kl <= cfg.dppo_delta_low) | (p >= p_old))
    return _dppo(cfg, logps, old_logps, advantages, completion_mask, valid)


def sapo_gates(cfg: ObjectiveConfig, ratio: Tensor, adv: Tensor) -> Tensor:
    """SAPO's soft gate f(ρ) = σ(τ(ρ − 1)) · 4/τ, τ = sapo_tau_pos where Â > 0 else sapo_tau_neg [B, T]."""
    tau = torch.where(adv > 0, torch.tensor(cfg.sapo_tau_pos), torch.tensor(cfg.sapo_tau_neg))
    return torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)


@register_policy_loss("sapo")
def sapo_loss(cfg: ObjectiveConfig, *, logps: Tensor, old_logps: Tensor, advantages: Tensor,
              completion_mask: Tensor, **_) -> PerToken:
    """SAPO (arXiv 2511.20347 Eq. 4; verl 0.9.1 ``compute_policy_loss_sapo``): ℓ = −Â · f(ρ) (:func:`sapo_gates`),
    ρ = exp(clamp(log ρ, ±20)). Aggregated seq-mean-token-mean only (its declaration). TRL's loss_type="sapo" does
    not clamp (stapo.losses.trl_losses.trl_sapo_loss): a token with log ρ < −20 has gradient 0 here, ~ρ there."""
    lp = logps.float()
    ratio = clamped_ratio(cfg, lp, old_logps)
    adv = advantages.float().unsqueeze(-1).expand_as(lp)
    return PerToken(-sapo_gates(cfg, ratio, adv) * adv, ratio.detach(), torch.zeros_like(completion_mask), None)


@register_policy_loss("geo_mean")
def geo_mean_loss(cfg: ObjectiveConfig, *, logps: Tensor, old_logps: Tensor, advantages: Tensor,
                  completion_mask: Tensor, **_) -> PerToken:
    """GMPO (arXiv 2507.20673 Eq. 5; verl 0.9.1 ``compute_policy_loss_geo_mean``): per completion i,
    ℓ_i = −Â_i · exp(Σ_t m_it / (n_i + 1e-8)), m = sgn(Â) · min(sgn(Â) log ρ, sgn(Â) clamp(log ρ, −ε_low, ε_high))
    (log ρ unclamped otherwise). Every token of i carries ℓ_i, so seq-mean-token-mean (its only aggregation) is verl's
    mean of ℓ_i over the completions."""
    m = completion_mask.float()
    log_ratio = logps.float() - old_logps.float()
    adv = advantages.float().unsqueeze(-1).expand_as(log_ratio)
    sgn = torch.sign(adv)
    clipped = torch.clamp(log_ratio, -cfg.eps_low, cfg.eps_high)
    kept = sgn * torch.minimum(sgn * log_ratio, sgn * clipped)
    n = m.sum(-1)
    seq_ratio = torch.exp((kept * m).sum(-1) / (n + 1e-8))
    seq_adv = (adv * m).sum(-1) / (n + 1e-8)
    loss = (-seq_adv * seq_ratio).unsqueeze(-1).expand_as(log_ratio)
    return PerToken(loss, torch.exp(log_ratio).detach(), torch.zeros_like(completion_mask), None)


@register_policy_loss("gpg")
def gpg_loss(cfg: ObjectiveConfig, *, logps: Tensor, advantages: Tensor, completion_mask: Tensor, **_) -> PerToken:
    """GPG (arXiv 2504.02546 Eq. 5; verl 0.9.1 ``compute_policy_loss_gpg``): ℓ = −log π · Â (no ratio, no clip)."""
    lp = logps.float()
    loss = -lp * advantages.float().unsqueeze(-1).expand_as(lp)
    return PerToken(loss, torch.ones_like(lp), torch.zeros_like(completion_mask), None)


@register_policy_loss("dro")
def dro_loss(cfg: ObjectiveConfig, *, logps: Tensor, old_logps: Tensor, advantages: Tensor,
             completion_mask: Tensor, **_) -> PerToken:
    """DRO (verl 0.9.1 ``compute_policy_loss_dro``, "Direct Reward Optimization with a quadratic log-ratio
    penalty"): ℓ = −(log π · Â − β/2 · (log π − log π_old)²), β = dro_beta; log ρ unclamped. The penalty also acts
    where Â = 0."""
    lp = logps.float()
    log_ratio = lp - old_logps.float()
    adv = advantages.float().unsqueeze(-1).expand_as(lp)
    loss = -(lp * adv - 0.5 * cfg.dro_beta * log_ratio.square())
    return PerToken(loss, torch.exp(log_ratio).detach(), torch.zeros_like(completion_mask), None)
