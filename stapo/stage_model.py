"""Seconds of one training step, stage by stage, the way the paper's verl runs it (colocated, synchronous).

One rollout step (a training step: prompts_per_generation x num_generations completions on W GPUs) costs

    rollout       vLLM decode, tensor parallel 1, each GPU its n = completions / W sequences; the step waits for
                  its longest response (the batch's expected maximum, on one GPU). A decode step reads the weights
                  and every in-flight sequence's KV cache: (2N + Σ ctx · kv_bytes) / (HBM · η_decode) + overhead;
                  sequences in flight are bounded by the KV cache (memory · vllm_gpu_memory_utilization − weights)
    old log-prob  a forward over the batch, 2N·T + 4·ΣL²·heads·head_dim·layers FLOPs, when TRL/verl needs π_old
                  (several optimiser steps per rollout batch) and once more for a KL reference
    update        6N·T + 12·ΣL²·heads·head_dim·layers FLOPs (verl's FlopsCounter; stapo.train.step_cost.update_flops),
                  × 4/3 with gradient checkpointing (the recomputed forward), over peak · update utilisation
    grad sync     per optimiser step, a ring reduce-scatter of fp32 gradients (4N bytes) over the slowest link
    weight sync   per rollout step, the bf16 weights gathered from the FSDP shards (2N bytes) and loaded into vLLM
    checkpoint    every save_steps, fp32 weights + Adam moments (12N bytes) over the nodes' storage

Response lengths are log-normal (shape ``length_sigma``) with the given mean, truncated at the budget. The rates
(stapo/reference/rates.yaml) name their source; :func:`calibrate` fits the forward utilisation and the decode
bandwidth efficiency to verl's published DAPO step on 64 H20 (the paper's GPU and count). Torch-free: ``stapo plan``
runs it in the fast tests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from statistics import NormalDist

import yaml

__all__ = ["RATES", "Gpu", "Shape", "Rates", "gpu", "shape", "rates", "lengths", "decode_seconds", "step_stages",
           "calibrate", "anchor_stages"]

RATES = Path(__file__).parent / "reference" / "rates.yaml"
_DATA = yaml.safe_load(RATES.read_text(encoding="utf-8"))
KV_DTYPE_BYTES = 2  # bf16 KV cache
ROLLOUT_MEMORY = 0.5  # vLLM's memory fraction when the recipe leaves it to the device default (stapo.vllm_settings)


@dataclass(frozen=True)
class Gpu:
    name: str
    peak_tflops: float
    hbm_tb_s: float
    memory_gib: float
    network_gb_s: float
    nvlink_gb_s: float


@dataclass(frozen=True)
class Shape:
    """What the FLOPs and the KV cache need of a model (rates.yaml ``models``)."""

    params_b: float
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    known: bool = True  # False: Qwen3-8B's layout scaled to params_b (a model rates.yaml does not list)

    @property
    def kv_bytes(self) -> int:
        """KV cache bytes per token: K and V, every layer."""
        return 2 * self.layers * self.kv_heads * self.head_dim * KV_DTYPE_BYTES

    @property
    def attention(self) -> float:
        """heads · head_dim · layers, the factor of ΣL² in the attention FLOPs."""
        return self.heads * self.head_dim * self.layers


@dataclass(frozen=True)
class Rates:
    """The efficiencies of the stage model, each with its source."""

    update_utilization: float
    forward_utilization: float
    decode_efficiency: float
    decode_overhead_s: float
    checkpoint_gb_s: float
    sources: dict = field(default_factory=dict)  # rate -> "source, date: quote"


def gpu(name: str) -> Gpu:
    """The GPU of rates.yaml whose name appears in ``name`` (``NVIDIA H200`` -> H200; H200 before H20)."""
    for key in sorted(_DATA["gpus"], key=len, reverse=True):
        if key.lower() in name.lower():
            return Gpu(key, **_DATA["gpus"][key])
    raise ValueError(f"GPU {name!r} not in {RATES.name}; expected one of {sorted(_DATA['gpus'])}")


def shape(spec: str, params_b: float | None = None) -> Shape:
    """The model's shape from rates.yaml, else Qwen3-8B's layout scaled to ``params_b`` (flagged ``known=False``)."""
    if spec in _DATA["models"]:
        return Shape(**_DATA["models"][spec])
    if params_b is None:
        raise ValueError(f"the shape of {spec!r} is unknown; give its parameters (--params MODEL=BILLIONS)")
    base = _DATA["models"]["Qwen/Qwen3-8B-Base"]
    scale = params_b / base["params_b"]
    return Shape(params_b, max(1, round(base["layers"] * scale ** (1 / 3))), base["heads"], base["kv_heads"],
                 base["head_dim"], known=False)


def lengths(mean: float, cap: int, n: int, sigma: float) -> list[float]:
    """n response lengths at the (i + 0.5) / n quantiles of a log-normal of this mean, truncated at ``cap``."""
    mu = math.log(mean) - sigma**2 / 2
    return [min(cap, math.exp(mu + sigma * NormalDist().inv_cdf((i + 0.5) / n))) for i in range(n)]


def batch_max(mean: float, cap: int, n: int, sigma: float) -> float:
    """The expected longest of n responses (the 1 − 1/(2n) quantile), truncated at ``cap``."""
    mu = math.log(mean) - sigma**2 / 2
    return min(cap, math.exp(mu + sigma * NormalDist().inv_cdf(1 - 1 / (2 * n))))


def decode_seconds(responses: list[float], prompt: float, sh: Shape, g: Gpu, memory_fraction: float,
                   rates: Rates) -> float:
    """One GPU's vLLM decode of ``responses`` (tokens each) to the last token: continuous batching, a new sequence
    admitted while the KV cache holds every in-flight sequence's final context (no preemption)."""
    weights = 2 * sh.params_b * 1e9
    kv_tokens = max(g.memory_gib * 2**30 * memory_fraction - weights, 0) / sh.kv_bytes
    bandwidth = g.hbm_tb_s * 1e12 * rates.decode_efficiency
    queue = sorted(responses, reverse=True)  # vLLM's FCFS order is the sampler's; longest first bounds the tail
    active: list[list[float]] = []  # [tokens done, tokens to go]
    seconds = 0.0
    while queue or active:
        while queue and (not active or sum(prompt + a[0] + a[1] for a in active) + prompt + queue[0] <= kv_tokens):
            active.append([0.0, queue.pop(0)])
        steps = min(a[1] for a in active)  # decode steps until the next sequence finishes
        context = sum(prompt + a[0] + steps / 2 for a in active)  # mean KV read over these steps
        seconds += steps * ((weights + context * sh.kv_bytes) / bandwidth + rates.decode_overhead_s)
        for a in active:
            a[0], a[1] = a[0] + steps, a[1] - steps
        active = [a for a in active if a[1] > 1e-9]
    return seconds


def _flops(sh: Shape, tokens: float, tokens_sq: float, passes: float) -> float:
    """Matmul + attention FLOPs of ``passes`` forward-equivalents (forward 1, forward + backward 3)."""
    return passes * (2 * sh.params_b * 1e9 * tokens + 4 * tokens_sq * sh.attention)


def step_stages(sh: Shape, g: Gpu, rates: Rates, *, gpus: int, nodes: int, completions: int, prompt: float,
                mean_response: float, cap: int, sigma: float, optimizer_steps: int, forwards: int,
                checkpointing: bool, memory_fraction: float, save_steps: int) -> dict[str, float]:
    """Seconds of each stage of one rollout step (module docstring); ``forwards``: no-grad forward passes over the
    batch (π_old, reference)."""
    n = max(1, completions // gpus)
    per_gpu = lengths(mean_response, cap, n, sigma)
    per_gpu[-1] = max(per_gpu[-1], batch_max(mean_response, cap, completions, sigma))
    seqs = [prompt + r for r in lengths(mean_response, cap, min(completions, 512), sigma)]
    scale = completions / len(seqs)
    tokens, tokens_sq = scale * sum(seqs), scale * sum(s * s for s in seqs)
    peak = gpus * g.peak_tflops * 1e12
    link = (g.network_gb_s if nodes > 1 else g.nvlink_gb_s) * 1e9
    ring = (gpus - 1) / gpus
    params = sh.params_b * 1e9
    return {
        "rollout": decode_seconds(per_gpu, prompt, sh, g, memory_fraction, rates),
        "old_log_prob": forwards * _flops(sh, tokens, tokens_sq, 1) / (peak * rates.forward_utilization),
        "update": _flops(sh, tokens, tokens_sq, 4 if checkpointing else 3) / (peak * rates.update_utilization),
        "grad_sync": optimizer_steps * 4 * params * ring / link,
        "weight_sync": 2 * params * ring / link + 2 * params / (g.hbm_tb_s * 1e12),
        "checkpoint": 12 * params / (nodes * rates.checkpoint_gb_s * 1e9) / save_steps,
    }


def rates(**override) -> Rates:
    """The shipped rates, the forward and decode ones calibrated on verl's anchor (:func:`calibrate`)."""
    r = _DATA["rates"]
    sources = {k: f"{v['source']}: {v.get('quote', '')}".rstrip(": ") for k, v in r.items() if "source" in v}
    base = Rates(update_utilization=r["update_utilization"]["value"], forward_utilization=1.0, decode_efficiency=1.0,
                 decode_overhead_s=r["decode_overhead_ms"]["value"] / 1000,
                 checkpoint_gb_s=r["checkpoint_gb_s"]["value"], sources=sources)
    return calibrate(replace(base, **override))


def _anchor_inputs(a: dict, mean_response: float, sigma: float) -> dict:
    return dict(gpus=a["gpus"], nodes=a["gpus"] // 8, completions=a["prompts"] * a["samples"],
                prompt=a["prompt_tokens"], mean_response=mean_response, cap=a["max_response"], sigma=sigma,
                optimizer_steps=1, forwards=1, checkpointing=True, memory_fraction=ROLLOUT_MEMORY, save_steps=10**9)


def anchor_response(base: Rates) -> float:
    """The verl anchor's mean response implied by its update time at ``base.update_utilization`` (bisection)."""
    a, sigma = _DATA["rates"]["verl_anchor"], _DATA["rates"]["length_sigma"]["value"]
    sh, g = shape(a["model"]), gpu("H20")
    lo, hi = 10.0, float(a["max_response"])
    for _ in range(60):
        mid = (lo + hi) / 2
        update = step_stages(sh, g, base, **_anchor_inputs(a, mid, sigma))["update"]
        lo, hi = (mid, hi) if update < a["update_s"] else (lo, mid)
    return lo


def calibrate(base: Rates) -> Rates:
    """Forward utilisation and decode efficiency such that the stage model reproduces verl's anchor step (64 H20,
    Qwen2.5-Math-7B DAPO) at the mean response its update time implies. Both stages scale as 1 / the rate, bar the
    decode overhead, so one evaluation at rate 1 fixes each."""
    a, sigma = _DATA["rates"]["verl_anchor"], _DATA["rates"]["length_sigma"]["value"]
    sh, g = shape(a["model"]), gpu("H20")
    mean = anchor_response(base)
    unit = replace(base, forward_utilization=1.0, decode_efficiency=1.0)
    at_one = step_stages(sh, g, unit, **_anchor_inputs(a, mean, sigma))
    memory_bound = step_stages(sh, g, replace(unit, decode_overhead_s=0.0), **_anchor_inputs(a, mean, sigma))["rollout"]
    overhead = at_one["rollout"] - memory_bound  # the decode steps' host time, which no bandwidth shortens
    decode = memory_bound / max(a["gen_s"] - overhead, 1e-9)
    sources = {**base.sources,
               "forward_utilization": f"calibrated: verl anchor old_log_prob {a['old_log_prob_s']} s at the implied "
                                      f"mean response {mean:,.0f} tokens",
               "decode_efficiency": f"calibrated: verl anchor gen {a['gen_s']} s at the implied mean response "
                                    f"{mean:,.0f} tokens"}
    return replace(base, forward_utilization=at_one["old_log_prob"] / a["old_log_prob_s"], decode_efficiency=decode,
                   sources=sources)


def anchor_stages(r: Rates) -> tuple[dict, dict, float]:
    """(modelled, published) stage seconds of verl's anchor step, and its implied mean response."""
    a, sigma = _DATA["rates"]["verl_anchor"], _DATA["rates"]["length_sigma"]["value"]
    mean = anchor_response(r)
    model = step_stages(shape(a["model"]), gpu("H20"), r, **_anchor_inputs(a, mean, sigma))
    return model, {"rollout": a["gen_s"], "old_log_prob": a["old_log_prob_s"], "update": a["update_s"],
                   "step": a["step_s"]}, mean


def nemo_check(r: Rates) -> tuple[float, float]:
    """(modelled, published) step seconds of NeMo-RL's Llama-3.1-8B GRPO step on 16 H100 (its mean response)."""
    a, sigma = _DATA["rates"]["nemo_rl_anchor"], _DATA["rates"]["length_sigma"]["value"]
    inputs = {**_anchor_inputs(a, a["mean_response"], sigma), "optimizer_steps": 4}
    stages = step_stages(shape(a["model"]), gpu(a["gpu"]), r, **inputs)
    return sum(stages.values()), a["step_s"]


def paper_response_mean() -> float:
    return float(_DATA["rates"]["paper_response_mean"]["value"])


def length_sigma() -> float:
    return float(_DATA["rates"]["length_sigma"]["value"])
