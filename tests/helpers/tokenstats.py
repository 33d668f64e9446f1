"""Per-token statistics of a categorical policy from its logits, in bounded memory (a test and benchmark helper).

The trainer takes log-probs and entropies from TRL and ``stapo.train.diagnostics`` computes collision probabilities
itself; this chunked kernel and its naive reference serve tests/test_diagnostics.py (per-token statistics of known
logits) and benchmarks/bench_objectives.py (memory of chunked vs naive statistics). Imported as
``helpers.tokenstats`` (pytest puts tests/ on sys.path).

For logits a [N, V] (already at the sampling temperature after division by ``temperature``) and labels y [N]:

    logp_t = log π(y_t)                      log-prob of the sampled token
    H_t    = −Σ_v π(v) log π(v)              entropy (the quantity STAPO thresholds and the paper plots)
    C_t    = Σ_v π(v)²                       collision probability; paper: ‖∇_a J‖² = w²(1 − 2π(y) + C)

The work is chunked over N: at most ``chunk_size`` rows of full-vocabulary temporaries exist at a time, in the
forward pass and in the backward pass (which recomputes the softmax per chunk instead of saving it). With
V = 151,936 (Qwen3) a naive ``log_softmax`` keeps two extra copies of the logits alive; this keeps ~3 chunks.

Gradients (per row, with π = softmax(a), ∂/∂a_j):
    ∂logp/∂a_j = 1[j = y] − π_j
    ∂H/∂a_j    = −π_j (log π_j + H)
    ∂C/∂a_j    = 2 π_j (π_j − C)
and ∂/∂logits = ∂/∂a / temperature.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["TokenStats", "token_stats", "naive_token_stats"]

DEFAULT_CHUNK = 128


@dataclass
class TokenStats:
    """logps, entropies, collision: each [N], fp32 (fp64 for fp64 logits)."""

    logps: Tensor
    entropies: Tensor
    collision: Tensor


def _fp(x: Tensor) -> Tensor:
    """Compute in fp32 (fp64 stays fp64, so autograd.gradcheck can check the backward)."""
    return x if x.dtype == torch.float64 else x.float()


def _chunk_stats(logits: Tensor, labels: Tensor, temperature: float):
    logp_all = torch.log_softmax(_fp(logits) / temperature, dim=-1)  # [c, V]
    p = logp_all.exp()
    logp = logp_all.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    entropy = -(p * logp_all).sum(-1)
    collision = (p * p).sum(-1)
    return logp, entropy, collision, logp_all, p


class _ChunkedTokenStats(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: Tensor, labels: Tensor, temperature: float, chunk_size: int):
        n = logits.shape[0]
        out = torch.empty(3, n, dtype=_fp(logits[:0]).dtype, device=logits.device)
        for s in range(0, n, chunk_size):
            logp, entropy, collision, _, _ = _chunk_stats(logits[s : s + chunk_size], labels[s : s + chunk_size],
                                                          temperature)
            out[0, s : s + chunk_size] = logp
            out[1, s : s + chunk_size] = entropy
            out[2, s : s + chunk_size] = collision
        ctx.save_for_backward(logits, labels, out)
        ctx.temperature, ctx.chunk_size = temperature, chunk_size
        return out[0], out[1], out[2]

    @staticmethod
    def backward(ctx, g_logp: Tensor | None, g_ent: Tensor | None, g_coll: Tensor | None):
        logits, labels, out = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return None, None, None, None
        t, c = ctx.temperature, ctx.chunk_size
        zeros = torch.zeros_like(out[0])
        g_logp = zeros if g_logp is None else g_logp.to(out.dtype)
        g_ent = zeros if g_ent is None else g_ent.to(out.dtype)
        g_coll = zeros if g_coll is None else g_coll.to(out.dtype)
        grad = torch.empty_like(logits)
        for s in range(0, logits.shape[0], c):
            sl = slice(s, s + c)
            logp_all = torch.log_softmax(_fp(logits[sl]) / t, dim=-1)
            p = logp_all.exp()
            h, coll = out[1, sl].unsqueeze(-1), out[2, sl].unsqueeze(-1)
            # ∂/∂a = g_logp (onehot − π) − g_H π (log π + H) + g_C 2π (π − C); three [c, V] buffers in all.
            g = p * (-g_logp[sl].unsqueeze(-1))
            g.sub_(logp_all.add_(h).mul_(p).mul_(g_ent[sl].unsqueeze(-1)))
            g.add_(logp_all.copy_(p).sub_(coll).mul_(p).mul_(2.0 * g_coll[sl].unsqueeze(-1)))
            g.scatter_add_(-1, labels[sl].unsqueeze(-1), g_logp[sl].unsqueeze(-1))
            del logp_all, p
            grad[sl] = g.div_(t).to(grad.dtype)
        return grad, None, None, None


def token_stats(
    logits: Tensor, labels: Tensor, *, temperature: float = 1.0, chunk_size: int = DEFAULT_CHUNK
) -> TokenStats:
    """Log-prob of ``labels``, entropy and collision probability of softmax(logits / temperature), chunked.

    logits: [N, V] (any float dtype; computed in fp32); labels: [N] int. Differentiable w.r.t. logits.
    """
    if logits.dim() != 2 or labels.shape != logits.shape[:1]:
        raise ValueError(f"expected logits [N, V] and labels [N], got {tuple(logits.shape)} and {tuple(labels.shape)}")
    if temperature <= 0:
        raise ValueError(f"temperature: must be > 0, got {temperature}")
    logp, entropy, collision = _ChunkedTokenStats.apply(logits, labels.long(), float(temperature), int(chunk_size))
    return TokenStats(logp, entropy, collision)


def naive_token_stats(logits: Tensor, labels: Tensor, *, temperature: float = 1.0) -> TokenStats:
    """Reference implementation: one full-size log_softmax (what the chunked version must equal)."""
    logp, entropy, collision, _, _ = _chunk_stats(logits, labels.long(), temperature)
    return TokenStats(logp, entropy, collision)
