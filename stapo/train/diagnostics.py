"""The paper's token analysis, as cheap per-step statistics: which tokens get the largest gradients, and why.

Theory (paper, Sec. "Gradient analysis"). For one token with logits a, π = softmax(a), sampled y, the gradient of
the clipped surrogate J = min(ρÂ, clip(ρ)Â) with respect to the logits is w (e_y − π), w = ρÂ (0 when the clip
branch is active), hence

    ‖∇_a J‖² = w² (1 − 2π(y) + Σ_v π(v)²)                                                  (closed form)
    w² (1 − 2π(y) + e^{−H}) ≤ ‖∇_a J‖² ≤ w² (2 − 2π(y) − C_V H²),  C_V = (|V|−1) / (|V| (ln|V|)²)

so low-probability (small π(y)), low-entropy (large Σπ²) tokens receive the largest updates. The functions here
take the per-token tensors of a training step (log-probs, entropies, collision probabilities Σπ², ratios,
advantages; :class:`TokenDiagnostics` computes the collision probabilities) and summarise them per probability ×
entropy quadrant, with the thresholds of the S2T mask (τ_p and the candidates' q-quantile).

Shapes: logps, entropies, collision, ratio, completion_mask [B, T]; advantages [B].
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from torch import Tensor

from stapo.train import trl_compat
from stapo.core.atomic import append_line
from stapo.losses.masks import candidate_mask, quantile, silence_mask
from stapo.core.schedule import rollout_step

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
    completion_mask: Tensor, tau_p: float, q: float, eps_low: float, eps_high: float, candidates: Tensor | None = None,
) -> dict[str, float]:
    """Count and mean closed-form gradient norm ‖∇_a J‖ per probability × entropy quadrant.

    Population: completion tokens of positive-advantage responses. Split: p < τ_p ("lowp") vs ≥, and H < τ_h
    ("lowh") vs ≥, τ_h the q-quantile of the S2T candidates' entropies — so lowp_lowh is exactly the S2T-silenced
    set. Without candidates, τ_h falls back to the q-quantile of the population (reported as quadrant/tau_h).
    Keys: quadrant/<name>_count, quadrant/<name>_grad_norm (NaN for an empty quadrant), quadrant/tau_h.
    candidates: the S2T candidates as the objective computed them for this micro-batch (stapo.losses.policy
    ``policy_loss(tokens=...)``); None computes them (:func:`stapo.losses.masks.candidate_mask`). In the
    population, "lowp" is exactly the candidates, so τ_p is tested once.
    """
    m = completion_mask.bool()
    pop = m & (advantages > 0).unsqueeze(-1)
    cand = candidate_mask(logps=logps, advantages=advantages, completion_mask=m,
                          tau_p=tau_p) if candidates is None else candidates
    h = entropies.detach().float()
    pool = h[cand] if cand.any() else h[pop]
    tau_h = quantile(pool, q).item() if pool.numel() else float("nan")
    norm = grad_norm_sq(logps=logps.detach(), collision=collision.detach(), ratio=ratio.detach(),
                        advantages=advantages, eps_low=eps_low, eps_high=eps_high).clamp(min=0).sqrt()
    lowp = cand  # within the population (every quadrant below is ∧ pop), p < τ_p is being a candidate
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


# ------------------------------------------------------------------------------------ trainer-side recorder


class TokenDiagnostics:
    """Collects the statistics above during training, every ``every`` optimiser steps, and writes them.

    Cost, on diagnostics steps only: a forward hook keeps the backbone's last hidden states of the loss forward (a
    reference, no copy); from them the collision probability Σπ² of the positive-advantage completion tokens (the
    population; all other tokens are never needed) is recomputed without gradient through the LM head with TRL's
    chunked kernel (no [N, V] logits), and the top-5 alternatives at the (at most ``k``) example tokens come from the
    same hidden states. Log-probs and entropies are TRL's own. Every other step costs nothing.

    Distributed: every rank calls :meth:`observe` (under DeepSpeed ZeRO-3 reading the LM head is a collective
    gather, which all ranks must enter); only the ``writer`` (rank 0) computes and writes, from its own micro-batches
    (every rank sees an i.i.d. share of the step).

    Outputs (appended, one line per diagnostics step, fsynced):
        <out>/diagnostics.jsonl       step, quadrant/* (counts, mean ‖∇_a J‖, τ_h), entropy_q10 … entropy_q90
        <out>/silenced_examples.jsonl step + records of :func:`silenced_examples` (S2T's silenced tokens — the
                                      tokens it silences, or would silence under another method)
    """

    STATS_FILE, EXAMPLES_FILE = "diagnostics.jsonl", "silenced_examples.jsonl"
    FILES = (STATS_FILE, EXAMPLES_FILE)
    VOCAB_CHUNK = 32768  # vocabulary tile of the no-grad head pass (TRL's fused head uses the same)

    def __init__(self, out_dir, *, every: int, objective, tokenizer, temperature: float, k: int = 8,
                 writer: bool = True):
        self.out_dir, self.every, self.objective = Path(out_dir), every, objective
        self.tokenizer, self.temperature, self.k, self.writer = tokenizer, temperature, k, writer
        self._hidden: Tensor | None = None
        self._active = False
        self._window: dict | None = None
        self.tau_h: float | None = None  # the optimiser step's S2T threshold (mini-batch scope), set by the trainer
        self.steps_per_rollout = 1  # k optimiser steps per rollout step (stapo.core.schedule), set by the trainer

    # -- set-up -------------------------------------------------------------------------------------------

    def attach(self, model) -> None:
        """Hook the backbone (``model.base_model``) to keep its last hidden states while a diagnostics step runs."""
        text_config = model.config.get_text_config()
        # the no-grad head pass computes softmax(h·Wᵀ / T): models that soft-cap or rescale logits would differ
        for key in ("final_logit_softcapping", "logit_scale", "output_multiplier", "lm_head_multiplier",
                    "logits_scaling"):
            if getattr(text_config, key, None) not in (None, 1, 1.0):
                raise ValueError(f"token diagnostics: {type(model).__name__} sets {key}={getattr(text_config, key)}, "
                                 "which they do not support; set train.diagnostics_every: 0")

        def keep(module, args, output):
            if self._active:
                self._hidden = output.last_hidden_state.detach()

        model.base_model.register_forward_hook(keep)

    @property
    def active(self) -> bool:
        """Whether this optimiser step is observed (its forwards must be padded: the hidden states are [B, T, H])."""
        return self._active

    def begin_step(self, next_step: int) -> None:
        """Called before the micro-batches of optimiser step ``next_step`` (1-based)."""
        self._active = self.every > 0 and next_step % self.every == 0
        self._hidden = None

    # -- per micro-batch ------------------------------------------------------------------------------------

    def observe(self, *, model, inputs: dict, logps: Tensor, old_logps: Tensor, entropies: Tensor,
                candidates: Tensor | None = None) -> None:
        """Accumulate one micro-batch (call after TRL's per-token forward of the policy and the objective, on every
        rank). candidates: the objective's S2T candidates of this micro-batch (``policy_loss(tokens=...)``), reused
        for the quadrants and the silenced examples (None: computed here)."""
        if not self._active:
            return
        hidden, self._hidden = self._hidden, None
        prompt_len, t = inputs["prompt_ids"].size(1), logps.size(1)
        if hidden is None or hidden.shape[:2] != (logps.size(0), prompt_len + t):
            raise RuntimeError("token diagnostics: the policy's hidden states were not captured for this micro-batch")
        hidden = hidden[:, prompt_len - 1 : prompt_len - 1 + t]  # position i predicts completion token i
        head = model.get_output_embeddings()
        with trl_compat.gathered_lm_head(head):  # a collective under ZeRO-3: every rank enters
            if self.writer:
                self._record(head, hidden, inputs, logps.detach(), old_logps.detach(), entropies.detach(), candidates)

    @torch.no_grad()
    def _record(self, head, hidden: Tensor, inputs: dict, logps: Tensor, old_logps: Tensor, entropies: Tensor,
                candidates: Tensor | None = None):
        cfg, adv, mask = self.objective, inputs["advantages"], inputs["completion_mask"]
        pop = mask.bool() & (adv > 0).unsqueeze(-1)
        collision = torch.zeros_like(logps, dtype=torch.float32)  # only the population's entries are used
        if pop.any():
            collision[pop] = trl_compat.log_sum_sq_probs(hidden[pop], head.weight, head.bias,
                                                         inputs["completion_ids"][pop], self.temperature,
                                                         self.VOCAB_CHUNK).float().exp()
        stats = quadrant_stats(logps=logps, entropies=entropies, collision=collision,
                               ratio=torch.exp(logps - old_logps), advantages=adv, completion_mask=mask,
                               tau_p=cfg.tau_p, q=cfg.entropy_quantile, eps_low=cfg.eps_low, eps_high=cfg.eps_high,
                               candidates=candidates)
        w = self._window = self._window or {"counts": {}, "norm_sums": {}, "entropies": [], "examples": []}
        for name in QUADRANTS:
            n = stats[f"quadrant/{name}_count"]
            w["counts"][name] = w["counts"].get(name, 0.0) + n
            if n:
                w["norm_sums"][name] = w["norm_sums"].get(name, 0.0) + n * stats[f"quadrant/{name}_grad_norm"]
        w["entropies"].append(entropies[mask.bool()].float())
        if len(w["examples"]) < self.k:
            w["examples"] += self._examples(head, hidden, inputs, logps, entropies, self.k - len(w["examples"]),
                                            candidates)

    def _examples(self, head, hidden, inputs, logps, entropies, k, candidates=None) -> list[dict]:
        adv = inputs["advantages"]
        # S2T on this micro-batch alone: the writer only runs this, so no cross-rank gather (it would deadlock)
        sil = silence_mask(logps=logps, entropies=entropies, advantages=adv, completion_mask=inputs["completion_mask"],
                           tau_p=self.objective.tau_p, q=self.objective.entropy_quantile, gather=False,
                           tau_h=self.tau_h, candidates=candidates)
        if not sil.any():
            return []
        top_ids, top_logps = self._top_alternatives(head, hidden, sil, k)
        return silenced_examples(silenced=sil, completion_ids=inputs["completion_ids"], logps=logps,
                                 entropies=entropies, advantages=adv, top_ids=top_ids, top_logps=top_logps,
                                 tokenizer=self.tokenizer, k=k)

    def _top_alternatives(self, head, hidden: Tensor, sil: Tensor, k: int, top: int = 5):
        """Top-``top`` (ids, log-probs) [B, T, top] at the first ``k`` silenced positions (zeros elsewhere)."""
        b_sz, t_len = sil.shape
        ids = torch.zeros(b_sz, t_len, top, dtype=torch.long, device=sil.device)
        lps = torch.full((b_sz, t_len, top), float("-inf"), device=sil.device)
        picks = sil.nonzero()[:k]
        # the weight itself, not head(...): under ZeRO-3 the module's hooks would gather again, on this rank alone
        h = hidden[picks[:, 0], picks[:, 1]].to(head.weight.dtype)
        logits = torch.nn.functional.linear(h, head.weight, head.bias).float() / self.temperature
        top_lp, top_id = torch.log_softmax(logits, -1).topk(top)
        ids[picks[:, 0], picks[:, 1]], lps[picks[:, 0], picks[:, 1]] = top_id, top_lp
        return ids, lps

    # -- optimiser-step boundary ------------------------------------------------------------------------------

    def end_step(self, step: int) -> dict | None:
        """Write the step's line (and examples); return the line (None when nothing was recorded)."""
        w, self._window, self._active, self._hidden = self._window, None, False, None
        if w is None:
            return None
        row: dict = {"step": step, "rollout_step": rollout_step(step, self.steps_per_rollout)}
        for name in QUADRANTS:
            n = w["counts"].get(name, 0.0)
            row[f"quadrant/{name}_count"] = n
            row[f"quadrant/{name}_grad_norm"] = w["norm_sums"][name] / n if n else None
        h = torch.cat(w["entropies"])
        row.update(entropy_quantiles(h.view(1, -1), torch.ones(1, h.numel(), dtype=torch.bool)))
        append_line(self.out_dir / self.STATS_FILE, json.dumps(row))
        for ex in w["examples"]:
            append_line(self.out_dir / self.EXAMPLES_FILE, json.dumps({"step": step, **ex}, ensure_ascii=False))
        return row
