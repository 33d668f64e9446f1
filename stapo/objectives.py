"""The four token-level policy objectives of the STAPO paper, and related methods, as pure functions of tensors.

Each method's hyper-parameters are a ``stapo.study.ObjectiveConfig`` (the study's ``methods`` section, with the
paper's defaults); one entry point, :func:`policy_loss`, that every method goes through. No TRL import: the
trainer passes TRL's per-token tensors in and backpropagates the loss.

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
above: Clip-Cov, KL-Cov, GSPO and CISPO, each equal to verl 0.9.1's function (stapo/related_losses.py).

where the S2T ("spurious token") mask silences a token iff Â > 0 ∧ π(y_t) < τ_p ∧ H_t < τ_h, with τ_h the
q-quantile of the entropies of the candidate tokens {Â > 0, π(y_t) < τ_p}. Silenced and dropped tokens leave
both the numerator and the denominator.

Aggregation (``loss_agg_mode``, verl's names; the trainer applies the weights across micro-batches and ranks):
    "token-mean"                  (default, JustRL family) Σ kept ℓ / K, K the kept tokens of the whole optimiser
                                  step on every rank: one denominator (verl's engine-worker ``agg_loss`` with the
                                  global ``batch_num_tokens``, verl 0.9.1: a choice, the paper
                                  names no verl version). ``policy_loss`` gets K as
                                  ``token_normalizer``.
    "token-mean-per-micro-batch"  verl 0.4.0 (JustRL's own trainer, ``dp_actor.update_policy``): each micro-batch's
                                  loss is its own token-mean Σ_j kept ℓ / max(1, Σ_j kept), scaled by its share of
                                  the rank's sequences in the step (÷ gradient-accumulation steps with TRL's fixed
                                  micro-batch size); ranks are averaged, so a token of a short micro-batch weighs
                                  more than one of a long one. ``policy_loss`` returns the micro-batch's token-mean.
    "seq-mean-token-mean"         (grpo) mean over completions of each completion's token-mean.

Quantile scope (``quantile_scope``). The paper takes τ_h (and 20-Entropy its threshold) over "the mini-batch":
the 64 prompts × 8 completions of one optimiser step.
    "mini_batch"   (default) the thresholds are computed once per optimiser step, before its first micro-batch,
                   by :func:`step_thresholds` over every completion of the step on every rank; ``policy_loss``
                   then receives them as ``thresholds``. Statistics (p, H of the candidates) come from the rollout
                   policy π_old's no-grad forward (the one TRL runs per rollout batch), so they are fixed before
                   any gradient; each token is then tested with the CURRENT policy's p and H against them. For
                   the first optimiser step of a rollout batch π_old = π_θ, and the mask is exactly the paper's.
    "micro_batch"  the quantile is taken inside ``policy_loss`` over the call's tokens — one micro-batch —
                   gathered from every rank (TRL ``top_entropy_quantile`` semantics); an ablation of scope.
    "micro_batch_local_topk"  the 80/20 release (arXiv 2506.01939; Shenzhi-Wang/Beyond-the-80-20-Rule-RLVR,
                   ``core_algos.get_global_entropy_top_mask``): per micro-batch, on this rank only (no gather),
                   from the current policy's entropies. 20-Entropy keeps EXACTLY k = max(1, ⌈ρ·n⌉) of the n
                   completion tokens by top-k (ties broken by position, earliest first, where the release's
                   ``torch.topk`` leaves them unspecified); STAPO takes τ_h over this micro-batch's own candidates
                   (our local analogue; the release has no S2T). Requires "token-mean-per-micro-batch" (the release
                   normalises each micro-batch by its kept tokens; stapo.study checks it).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.distributed as dist
from torch import Tensor

from stapo.study.objective import ObjectiveConfig

__all__ = [
    "policy_loss",
    "kept_mask",
    "silence_mask",
    "ablation_silence_mask",
    "high_entropy_mask",
    "quantile",
    "Thresholds",
    "step_thresholds",
    "TOKEN_MASKS",
    "THRESHOLDS",
    "register_token_mask",
    "register_thresholds",
    "POLICY_LOSSES",
    "PerToken",
    "register_policy_loss",
]

# --------------------------------------------------------------------------------------------- quantiles


def _gather_across_ranks(values: Tensor) -> Tensor:
    """Concatenate a 1-D tensor of varying length from every rank (identity on a single process)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return values
    n = torch.tensor([values.numel()], device=values.device)
    sizes = [torch.zeros_like(n) for _ in range(dist.get_world_size())]
    dist.all_gather(sizes, n)
    longest = int(max(s.item() for s in sizes))
    padded = torch.zeros(longest, dtype=values.dtype, device=values.device)
    padded[: values.numel()] = values
    chunks = [torch.empty_like(padded) for _ in sizes]
    dist.all_gather(chunks, padded)
    return torch.cat([c[: int(s.item())] for c, s in zip(chunks, sizes)])


def quantile(values: Tensor, q: float) -> Tensor:
    """``torch.quantile(values, q)`` (linear interpolation) without torch.quantile's 16M-element limit.

    values: [N] (N ≥ 1), any float dtype; computed in fp32.
    """
    v = values.detach().float().sort().values
    pos = q * (v.numel() - 1)
    lo = int(pos)
    hi = min(lo + 1, v.numel() - 1)
    return v[lo] + (pos - lo) * (v[hi] - v[lo])


# ----------------------------------------------------------------------------------------------- masks


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


def _quantile_or_nan(pool: Tensor, q: float) -> float:
    return float(quantile(pool, q)) if pool.numel() else math.nan


# Registries (verl ``register_policy_loss`` style). A method's declaration (stapo/methods.py) names one token mask
# and, if its mask reads any, one threshold function. Uniform signatures, all tensors as keywords:
#   thresholds(cfg, *, logps, entropies, advantages, completion_mask, gather=True) -> Thresholds
#       over all the given tokens on every rank (it gathers: every rank calls it at the same time), or this rank's
#       alone with gather=False ("micro_batch_local_topk" scope);
#   token_mask(cfg, *, logps, entropies, advantages, completion_mask, thresholds, generator, candidates)
#       -> (kept, silenced)
#       Bool [B, T] each: the tokens that enter the loss, and those the mask silenced (reported as
#       silenced_fraction; all False for masks that only keep); ``thresholds`` is None for a mask declared without;
#       ``candidates`` are the call's S2T candidates when policy_loss computed them (None: compute if needed).
TOKEN_MASKS: dict[str, Callable[..., tuple[Tensor, Tensor]]] = {}
THRESHOLDS: dict[str, Callable[..., Thresholds]] = {}


def _registrar(table: dict, what: str, name: str):
    def register(fn):
        if name in table:
            raise ValueError(f"{what} {name!r} is registered twice")
        table[name] = fn
        return fn
    return register


def register_token_mask(name: str):
    """Register a token-mask function under ``name`` (the ``token_mask`` of a method's declaration)."""
    return _registrar(TOKEN_MASKS, "token mask", name)


def register_thresholds(name: str):
    """Register a step-threshold function under ``name`` (the ``thresholds`` of a method's declaration)."""
    return _registrar(THRESHOLDS, "thresholds", name)


def top_k_count(n: int, ratio: float) -> int:
    """How many of ``n`` tokens the 80/20 release keeps: max(1, ⌈n·ratio⌉) as it computes it,
    ``int(n * ratio + 0.9999)`` (so n·ratio within 1e-4 above an integer rounds down); 0 when n = 0."""
    return max(1, int(n * ratio + 0.9999)) if n > 0 else 0


@register_thresholds("top_entropy")
def top_entropy_thresholds(cfg: ObjectiveConfig, *, entropies: Tensor, completion_mask: Tensor, gather: bool = True,
                           **_) -> Thresholds:
    """20-Entropy's cut: the (1 − ρ)-quantile of all completion tokens' entropies; with ``gather=False`` (the
    80/20 release's local scope) the count k of this rank's tokens to keep by top-k instead."""
    pool = entropies.detach().float()[completion_mask.bool()]
    if not gather:
        return Thresholds(entropy_top_k=top_k_count(pool.numel(), cfg.top_entropy_ratio))
    return Thresholds(entropy_cut=_quantile_or_nan(_gather_across_ranks(pool), 1.0 - cfg.top_entropy_ratio))


@register_thresholds("s2t")
def s2t_thresholds(cfg: ObjectiveConfig, *, logps: Tensor, entropies: Tensor, advantages: Tensor,
                   completion_mask: Tensor, gather: bool = True, candidates: Tensor | None = None,
                   **_) -> Thresholds:
    """S2T's τ_h (q-quantile) and stapo_high's (1 − q)-quantile of the candidates' entropies (all ranks', or
    this rank's alone with ``gather=False``); ``candidates``: the call's, when already computed."""
    cand = _candidates(cfg, candidates, logps, advantages, completion_mask)
    pool = entropies.detach().float()[cand]
    return _s2t_thresholds(_gather_across_ranks(pool) if gather else pool, cfg.entropy_quantile)


def step_thresholds(
    cfg: ObjectiveConfig, *, logps: Tensor, entropies: Tensor, advantages: Tensor, completion_mask: Tensor,
) -> Thresholds:
    """The thresholds of one optimiser step over ALL its completions on every rank (paper: "the mini-batch").

    logps, entropies, completion_mask: [N, T] for this rank's N completions of the step (the trainer passes
    π_old's, from the no-grad forward of the rollout batch); advantages: [N]. Every rank must call it at the
    same time (it gathers). Cheap: one pass over [N, T] and a sort of the pools. Empty (all NaN) for a method
    declared without thresholds.
    """
    if cfg.thresholds is None:
        return Thresholds()
    return THRESHOLDS[cfg.thresholds](cfg, logps=logps, entropies=entropies, advantages=advantages,
                                      completion_mask=completion_mask.bool())


def _s2t_thresholds(pool: Tensor, q: float) -> Thresholds:
    """S2T's τ_h (q-quantile) and stapo_high's (1 − q)-quantile of the candidates' entropies ``pool`` [N]."""
    return Thresholds(tau_h=_quantile_or_nan(pool, q), tau_h_high=_quantile_or_nan(pool, 1.0 - q))


def high_entropy_mask(*, entropies: Tensor, completion_mask: Tensor, ratio: float, cut: float | None = None,
                      top_k: int | None = None) -> Tensor:
    """20-Entropy's kept-token mask: completion tokens whose entropy is in the top ``ratio`` fraction.

    kept = m ∧ (H ≥ cut), cut = quantile(H[m], 1 − ratio) over all ranks' completion tokens of the call (TRL
    ``get_high_entropy_mask`` semantics; ties at the threshold are kept), or the given ``cut`` (mini-batch scope,
    :func:`step_thresholds`). With ``top_k`` (the 80/20 release's local scope): exactly the ``top_k`` completion
    tokens of highest entropy in this call, no gather, ties broken by flat position (earliest kept).
    Returns Bool [B, T], True = kept.
    """
    m = completion_mask.bool()
    if top_k is not None:
        pos = m.flatten().nonzero().squeeze(-1)  # completion tokens, row-major
        order = entropies.detach().float().flatten()[pos].sort(descending=True, stable=True).indices
        kept = torch.zeros_like(m).flatten()
        kept[pos[order[:top_k]]] = True
        return kept.view_as(m)
    if cut is None:
        pool = _gather_across_ranks(entropies.detach()[m].float())
        if pool.numel() == 0:
            return torch.zeros_like(m)
        cut = quantile(pool, 1.0 - ratio)
    return m & (entropies.detach().float() >= cut)


def candidate_mask(*, logps: Tensor, advantages: Tensor, completion_mask: Tensor, tau_p: float) -> Tensor:
    """S2T candidates: completion tokens of positive-advantage responses with π(y_t) < τ_p. Bool [B, T]."""
    positive = (advantages > 0).unsqueeze(-1)  # [B, 1]
    rare = logps.detach().float().exp() < tau_p
    return completion_mask.bool() & positive & rare


def _candidates(cfg: ObjectiveConfig, candidates: Tensor | None, logps, advantages, completion_mask) -> Tensor:
    """The micro-batch's S2T candidates: those ``policy_loss`` computed once, else computed here."""
    if candidates is not None:
        return candidates
    return candidate_mask(logps=logps, advantages=advantages, completion_mask=completion_mask, tau_p=cfg.tau_p)


def silence_mask(
    *, logps: Tensor, entropies: Tensor, advantages: Tensor, completion_mask: Tensor, tau_p: float, q: float,
    gather: bool = True, tau_h: float | None = None, candidates: Tensor | None = None,
) -> Tensor:
    """STAPO's S2T mask (paper Eq. stapo_loss): True = silenced spurious token. Bool [B, T].

    silenced = candidates ∧ (H < τ_h), τ_h = quantile(H[candidates], q) over all ranks' candidates of the call
    (this rank's alone with ``gather=False``, for callers that run on one rank only), or the given ``tau_h``
    (mini-batch scope, :func:`step_thresholds`; NaN silences nothing). Strict inequality, so a lone candidate
    (or all-tied candidates) is never silenced, and no candidates means nothing is silenced. Probability and
    entropy are treated as constants (detached). ``candidates``: :func:`candidate_mask`'s, when already computed.
    """
    cand = candidate_mask(logps=logps, advantages=advantages, completion_mask=completion_mask,
                          tau_p=tau_p) if candidates is None else candidates
    if tau_h is None:
        pool = entropies.detach()[cand].float()
        pool = _gather_across_ranks(pool) if gather else pool
        if pool.numel() == 0:
            return torch.zeros_like(cand)
        tau_h = quantile(pool, q)
    return cand & (entropies.detach().float() < tau_h)


def ablation_silence_mask(
    variant: str, *, logps: Tensor, entropies: Tensor, advantages: Tensor, completion_mask: Tensor,
    tau_p: float, q: float, generator: torch.Generator | None = None, thresholds: Thresholds | None = None,
    candidates: Tensor | None = None,
) -> Tensor:
    """The paper's ablations of S2T (True = silenced), over the same candidate set:

    high    candidates ∧ H > quantile(H[cand], 1 − q): the high-entropy end, as many as S2T silences
    random  a uniformly random subset of candidates of the size S2T would silence on this rank
    full    every candidate
    The quantiles are the call's (gathered across ranks) or ``thresholds``' (mini-batch scope).
    """
    cand = candidate_mask(logps=logps, advantages=advantages, completion_mask=completion_mask,
                          tau_p=tau_p) if candidates is None else candidates
    if variant == "full":
        return cand
    h = entropies.detach().float()
    if thresholds is None:  # no candidates anywhere: NaN thresholds, nothing is silenced
        thresholds = _s2t_thresholds(_gather_across_ranks(h[cand]), q)
    if variant == "high":
        return cand & (h > thresholds.tau_h_high)
    if variant == "random":
        n_silence = int((cand & (h < thresholds.tau_h)).sum())
        idx = cand.flatten().nonzero().squeeze(-1)
        perm = torch.randperm(idx.numel(), generator=generator, device="cpu").to(idx.device)
        out = torch.zeros_like(cand).flatten()
        out[idx[perm[:n_silence]]] = True
        return out.view_as(cand)
    raise ValueError(f"unknown S2T ablation {variant!r}; expected high, random or full")


# The token masks of the declared methods (stapo/methods.py). Each keeps completion tokens only.

@register_token_mask("all")
def all_tokens(cfg: ObjectiveConfig, *, completion_mask: Tensor, **_) -> tuple[Tensor, Tensor]:
    """GRPO, JustRL: every completion token."""
    return completion_mask, torch.zeros_like(completion_mask)


@register_token_mask("high_entropy")
def top_entropy_tokens(cfg: ObjectiveConfig, *, entropies: Tensor, completion_mask: Tensor,
                       thresholds: Thresholds, **_) -> tuple[Tensor, Tensor]:
    """20-Entropy: the tokens at or above the step's entropy cut (NaN: no tokens, none kept)."""
    kept = high_entropy_mask(entropies=entropies, completion_mask=completion_mask, ratio=cfg.top_entropy_ratio,
                             cut=thresholds.entropy_cut, top_k=thresholds.entropy_top_k)
    return kept, torch.zeros_like(completion_mask)


def _s2t_kwargs(cfg: ObjectiveConfig, logps, entropies, advantages, completion_mask) -> dict:
    return dict(logps=logps, entropies=entropies, advantages=advantages, completion_mask=completion_mask,
                tau_p=cfg.tau_p, q=cfg.entropy_quantile)


@register_token_mask("s2t")
def s2t_tokens(cfg: ObjectiveConfig, *, logps, entropies, advantages, completion_mask, thresholds: Thresholds,
               candidates=None, **_) -> tuple[Tensor, Tensor]:
    """STAPO: all but the S2T-silenced tokens."""
    silenced = silence_mask(**_s2t_kwargs(cfg, logps, entropies, advantages, completion_mask), tau_h=thresholds.tau_h,
                            candidates=candidates)
    return completion_mask & ~silenced, silenced


def _ablation(variant: str):
    def mask(cfg: ObjectiveConfig, *, logps, entropies, advantages, completion_mask, thresholds=None,
             generator=None, candidates=None, **_) -> tuple[Tensor, Tensor]:
        if generator is None and variant == "random":
            generator = torch.Generator().manual_seed(cfg.seed)
        silenced = ablation_silence_mask(variant, generator=generator, thresholds=thresholds, candidates=candidates,
                                         **_s2t_kwargs(cfg, logps, entropies, advantages, completion_mask))
        return completion_mask & ~silenced, silenced
    mask.__doc__ = f"STAPO ablation: silence the S2T candidates by :func:`ablation_silence_mask` ({variant!r})."
    return mask


for _variant in ("high", "random", "full"):
    register_token_mask(f"s2t_{_variant}")(_ablation(_variant))


def kept_mask(
    cfg: ObjectiveConfig, *, logps: Tensor, entropies: Tensor, advantages: Tensor, completion_mask: Tensor,
    generator: torch.Generator | None = None, thresholds: Thresholds | None = None, candidates: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """(kept, silenced), Bool [B, T]: the tokens that enter ``cfg.method``'s loss, and those its mask silenced.

    thresholds: the optimiser step's (mini-batch scope); None computes them over the call (micro-batch scopes:
    gathered across ranks, or this rank's alone for "micro_batch_local_topk"), and only for a method declared
    with thresholds. candidates: the call's S2T candidates (:func:`candidate_mask`), computed once by
    ``policy_loss`` and reused by the thresholds and the mask (None: each computes them).
    """
    m = completion_mask.bool()
    tensors = dict(logps=logps, entropies=entropies, advantages=advantages, completion_mask=m)
    if cfg.thresholds is not None and thresholds is None:
        thresholds = THRESHOLDS[cfg.thresholds](cfg, **tensors, gather=cfg.quantile_scope.gathered,
                                                candidates=candidates)
    kept, silenced = TOKEN_MASKS[cfg.token_mask](cfg, **tensors, thresholds=thresholds, generator=generator,
                                                 candidates=candidates)
    return m & kept, m & silenced


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


class PerToken(NamedTuple):
    """A method's per-token loss of one micro-batch (all [B, T], fp32)."""

    loss: Tensor  # ℓ, aggregated by policy_loss over the kept tokens as loss_agg_mode says
    ratio: Tensor  # the importance ratio the clip-fraction metrics read (detached use only)
    dual: Tensor  # Bool: where the dual-clip cap c·|Â| binds
    detached: Tensor | None  # Bool: tokens whose gradient the loss itself removes, kept in the denominator


# Per-token losses (verl ``register_policy_loss`` style); a method's declaration names one ("vanilla" by default).
# Uniform signature: loss(cfg, *, logps, old_logps, advantages, completion_mask, generator) -> PerToken, with
# logps, old_logps [B, T] (padding already zeroed), advantages [B], completion_mask Bool [B, T].
POLICY_LOSSES: dict[str, Callable[..., PerToken]] = {}


def register_policy_loss(name: str):
    """Register a per-token loss under ``name`` (the ``loss`` of a method's declaration)."""
    return _registrar(POLICY_LOSSES, "policy loss", name)


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
    per_token, ratio, dual, detached = POLICY_LOSSES[cfg.loss](cfg, logps=logps, old_logps=old_logps,
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
    if token_normalizer is not None and not cfg.loss_agg_mode.step_normaliser:
        raise ValueError(f"token_normalizer is not defined for loss_agg_mode {cfg.loss_agg_mode.value!r}")
    if cfg.loss_agg_mode.per_sequence:
        per_seq = masked.sum(-1) / kept.sum(-1).clamp(min=1)
        loss = per_seq.sum() / max(1, per_seq.numel())
    else:
        denom = kept.sum().clamp(min=1) if token_normalizer is None else token_normalizer
        loss = masked.sum() / denom

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


# The related methods' losses register themselves here (imported last: they use the registry above).
from stapo import related_losses  # noqa: E402,F401
