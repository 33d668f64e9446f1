"""The token masks: which completion tokens of a micro-batch enter a method's loss, and the entropy thresholds they
read (registered in stapo.losses.registry by name; a method's declaration names its mask and thresholds).

    entropy20  k = m ∧ H ≥ quantile(H[m], 1 − ρ)                                    (arXiv 2506.01939 Eq. 6)
    stapo      k = m ∧ ¬S2T: S2T silences a token iff Â > 0 ∧ π(y_t) < τ_p ∧ H_t < τ_h, τ_h the q-quantile of the
               entropies of the candidate tokens {Â > 0, π(y_t) < τ_p}               (paper Eq. stapo_loss)
    ablations  stapo_high / stapo_random / stapo_full: other subsets of the same candidates (paper, Ablations)

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

import torch
import torch.distributed as dist
from torch import Tensor

from stapo.study.objective import ObjectiveConfig
from stapo.losses import registry
from stapo.losses.registry import Thresholds, register_thresholds, register_token_mask

__all__ = ["quantile", "candidate_mask", "silence_mask", "ablation_silence_mask", "high_entropy_mask", "top_k_count",
           "step_thresholds", "kept_mask"]

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




def _quantile_or_nan(pool: Tensor, q: float) -> float:
    return float(quantile(pool, q)) if pool.numel() else math.nan

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
    return registry.THRESHOLDS[cfg.thresholds](cfg, logps=logps, entropies=entropies, advantages=advantages,
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


# The token masks of the declared methods (stapo/study/methods.py). Each keeps completion tokens only.

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
        thresholds = registry.THRESHOLDS[cfg.thresholds](cfg, **tensors, gather=cfg.quantile_scope.gathered,
                                                candidates=candidates)
    kept, silenced = registry.TOKEN_MASKS[cfg.token_mask](cfg, **tensors, thresholds=thresholds, generator=generator,
                                                 candidates=candidates)
    return m & kept, m & silenced
