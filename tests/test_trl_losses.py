"""TRL 1.16's loss types beside verl's (dr_grpo, luspo, vespo, sapo) against TRL's own trainer on the same inputs; and
where verl's SAPO and CISPO differ from TRL's, by how much.

TRL's loss types are branches inside ``GRPOTrainer._compute_loss`` (trl/trainer/grpo_trainer.py), not functions: the
comparison calls that method unbound on a stand-in for the trainer that carries what it reads (its GRPOConfig
fields at TRL's own defaults unless the method's config sets them, one process, no vLLM, no KL, no entropy mask),
whose ``_get_per_token_logps_and_entropies`` hands back the test's log-probs as a leaf tensor: TRL's loss and its
gradient with respect to the log-probs against our ``policy_loss``'s, ≤ 1e-6 relative (float32; the loss relative to
its scale, as tests/test_related_methods.py), over moderate, extreme and probability inputs (tests/helpers/
loss_inputs.py), with the branches, clamps and caps each reaches counted; a deliberately broken variant of each
must differ from TRL by a measured amount above 1e-3.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from stapo.losses import aggregation as aggregation_module
from stapo.losses import related, trl_losses
from stapo.losses.aggregation import SeqMeanTokenMean
from stapo.losses.policy import vanilla_loss
from stapo.losses.registry import POLICY_LOSSES
from stapo.study import get_objective
from stapo.study.objective import AggMode

from helpers.loss_inputs import EXTREME_LOG_RATIOS, extreme_inputs, inputs, ours, probability_inputs, \
    relative_differences

TRL_VERSION = "1.16"
TOLERANCE = 1e-6
SHAPES = ((4, 9), (7, 33), (16, 64))
SEEDS = (0, 1, 2)
# method -> (TRL loss_type, importance_sampling_level)
TRL_LOSS = {"dr_grpo": ("dr_grpo", "token"), "luspo": ("luspo", "sequence"), "vespo": ("vespo", "token"),
            "sapo_trl": ("sapo", "token"), "sapo": ("sapo", "token"), "cispo": ("cispo", "token")}
TRL_METHODS = ("dr_grpo", "luspo", "vespo", "sapo_trl")  # equal to TRL; verl's sapo and cispo are compared below
HORIZON_EXTRA = 7  # max_completion_length = the padded length + 7: Dr. GRPO's constant is not the batch's length


def _trl_defaults() -> dict:
    from trl import GRPOConfig

    return {f.name: f.default for f in dataclasses.fields(GRPOConfig)}


def _trainer(method: str, cfg, logps: torch.Tensor, max_completion_length: int):
    """A stand-in for GRPOTrainer of ``method`` with ``cfg``'s values where TRL reads them (module docstring)."""
    from trl import GRPOTrainer

    loss_type, level = TRL_LOSS[method]
    trl = _trl_defaults()
    args = SimpleNamespace(delta=trl["delta"], steps_per_generation=1, use_bias_correction_kl=False,
                           sapo_temperature_pos=cfg.sapo_tau_pos, sapo_temperature_neg=cfg.sapo_tau_neg,
                           vespo_k_pos=cfg.vespo_k_pos, vespo_lambda_pos=cfg.vespo_lambda_pos,
                           vespo_k_neg=cfg.vespo_k_neg, vespo_lambda_neg=cfg.vespo_lambda_neg)
    # cispo's epsilon_high is TRL's ε_max, the ratio's bound itself (ours: 1 + eps_high)
    high = 1 + cfg.eps_high if loss_type == "cispo" else cfg.eps_high
    accelerator = SimpleNamespace(num_processes=1, gather=lambda t: t, gather_for_metrics=lambda t: t,
                                  reduce=lambda t, reduction="sum": t)
    return SimpleNamespace(
        args=args, loss_type=loss_type, importance_sampling_level=level, epsilon_low=cfg.eps_low, epsilon_high=high,
        beta=0.0, top_entropy_quantile=1.0, off_policy_mask_threshold=None, aux_loss_enabled=False, use_vllm=False,
        _entropy_bonus_enabled=False, max_completion_length=max_completion_length,
        current_gradient_accumulation_steps=1, model=SimpleNamespace(training=True), accelerator=accelerator,
        _metrics=defaultdict(lambda: defaultdict(list)), get_gamma_weights=GRPOTrainer.get_gamma_weights,
        _get_per_token_logps_and_entropies=lambda *a, **k: (logps, torch.zeros_like(logps), None))


def _trl(method: str, cfg, x: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """TRL's loss and gradient (w.r.t. the log-probs) of one micro-batch: GRPOTrainer._compute_loss, unbound."""
    from trl import GRPOTrainer

    logps = x["logps"].clone().requires_grad_(True)
    B, T = logps.shape
    mask = x["completion_mask"]
    batch = dict(prompt_ids=torch.zeros(B, 1, dtype=torch.long), prompt_mask=torch.ones(B, 1, dtype=torch.long),
                 completion_ids=torch.zeros(B, T, dtype=torch.long), completion_mask=mask,
                 advantages=x["advantages"], old_per_token_logps=x["old_logps"], num_items_in_batch=mask.sum())
    loss = GRPOTrainer._compute_loss(_trainer(method, cfg, logps, T + HORIZON_EXTRA), None, batch)
    loss.backward()
    return loss.detach(), logps.grad


def input_sets():
    """(name, inputs, seed): moderate (two spreads), extreme log ρ, probabilities."""
    for (B, T) in SHAPES:
        for seed in SEEDS:
            yield "moderate", inputs(B, T, seed, 0.2), seed
            yield "moderate", inputs(B, T, seed, 1e-4), seed
            yield "probabilities", probability_inputs(B, T, seed), seed
            if (B, T) != SHAPES[-1] and seed != SEEDS[-1]:
                yield from (("extreme", extreme_inputs(B, T, seed, r), seed) for r in EXTREME_LOG_RATIOS)


def differences(method: str, **overrides) -> dict[str, tuple[float, float]]:
    """Per input family, the largest (loss, gradient) relative difference of ours to TRL's."""
    worst: dict[str, tuple[float, float]] = {}
    for name, x, seed in input_sets():
        cfg = get_objective(method, **overrides)
        if "loss_scale_factor" in cfg.loss_agg_mode.params and "loss_scale_factor" not in overrides:
            cfg = cfg.with_horizon(x["logps"].size(1) + HORIZON_EXTRA)  # what the study's plan sets: TRL's L
        diff = relative_differences(ours(cfg, x, seed), _trl(method, cfg, x))
        worst[name] = tuple(max(w, d) for w, d in zip(worst.get(name, (0.0, 0.0)), diff))
    return worst


def _sequence_log_ratio(lr, m, mean: bool):
    s = (lr * m).sum(-1, keepdim=True)
    return s / m.sum(-1, keepdim=True).clamp(min=1) if mean else s


def _ppo_branches(c, lr, a):
    """The clipped surrogate's branches (TRL: no dual clip, so Â < 0 with ρ > 10 is unclipped and uncapped)."""
    lo, hi = lr.exp() < 1 - c.eps_low, lr.exp() > 1 + c.eps_high
    return {"Â>0, ρ > 1+ε (clipped)": (a > 0) & hi, "Â>0, ρ < 1−ε (unclipped)": (a > 0) & lo,
            "Â<0, ρ < 1−ε (clipped)": (a < 0) & lo, "Â<0, ρ > 1+ε (unclipped)": (a < 0) & hi,
            "Â<0, ρ > 10 (no dual clip)": (a < 0) & (lr > torch.log(torch.tensor(10.0))),
            "inside the clip range": ~lo & ~hi}


# per method: its branches, clamps and caps, as Bool [B, T] of (cfg, log ρ, mask, Â [B, 1])
BRANCHES = {
    "dr_grpo": lambda c, lr, m, a: _ppo_branches(c, lr, a),
    "luspo": lambda c, lr, m, a: {k: v.expand_as(lr) for k, v in _ppo_branches(
        c, _sequence_log_ratio(lr, m, True), a).items()} | {
        "sequence log-ratio > 10 (verl's GSPO cap, not TRL's)": (_sequence_log_ratio(lr, m, True) > 10).expand_as(lr)},
    "vespo": lambda c, lr, m, a: {
        "Â≥0 (k_pos, λ_pos)": (a >= 0).expand_as(lr), "Â<0 (k_neg, λ_neg)": (a < 0).expand_as(lr),
        "token |log ρ| > 20 (clamped)": lr.abs() > 20,
        "log w > 20 (clamped)": (_sequence_log_ratio(lr.clamp(-20, 20), m, False) > 20).expand_as(lr),
        "log w < log 1e-8 (clamped)": (_sequence_log_ratio(lr.clamp(-20, 20), m, False) < -18.42).expand_as(lr),
        "|log w| < 1 (a weight that counts)": (_sequence_log_ratio(lr.clamp(-20, 20), m, False).abs() < 1).expand_as(
            lr)},
    "sapo_trl": lambda c, lr, m, a: {"Â>0 (τ_pos)": (a > 0).expand_as(lr), "Â≤0 (τ_neg)": (a <= 0).expand_as(lr),
                                     "|log ρ| > 20 (verl clamps, TRL does not)": lr.abs() > 20},
}


def branch_counts(method: str) -> dict[str, int]:
    cfg, counts = get_objective(method), {}
    for _, x, _ in input_sets():
        m = x["completion_mask"].bool()
        lr = x["logps"] - x["old_logps"]
        for name, hit in BRANCHES[method](cfg, lr, m.float(), x["advantages"].unsqueeze(-1)).items():
            counts[name] = counts.get(name, 0) + int((hit & m).sum())
    return counts


@pytest.mark.parametrize("method", TRL_METHODS)
def test_equals_trl_where_every_branch_is_reached(method):
    counts = branch_counts(method)
    worst = differences(method)
    print(f"{method}: branches (tokens) {counts}; (loss, gradient) relative difference to TRL {worst}")
    assert all(n > 0 for n in counts.values()), (method, counts)
    assert all(max(d) <= TOLERANCE for d in worst.values()), (method, worst)


@pytest.mark.parametrize("method, overrides", [
    ("dr_grpo", {"eps_low": 0.2, "eps_high": 0.28}), ("luspo", {"eps_low": 0.2, "eps_high": 0.28}),
    ("vespo", {"vespo_k_pos": 1.0, "vespo_lambda_pos": 0.5, "vespo_k_neg": 0.5, "vespo_lambda_neg": 4.0}),
    ("sapo_trl", {"sapo_tau_pos": 0.5, "sapo_tau_neg": 2.0}),
])
def test_equals_trl_off_defaults(method, overrides):
    worst = differences(method, **overrides)
    assert all(max(d) <= TOLERANCE for d in worst.values()), (method, overrides, worst)


# ------------------------------------------------------------------------------------- broken variants

class _SeqMeanTokenMeanAs(SeqMeanTokenMean):
    def __init__(self, mode):
        self.mode = mode


def _vespo_mean_log_ratio(cfg, *, logps, old_logps, advantages, completion_mask, **_):
    """VESPO's weight of the length-normalised (GSPO's) log-ratio instead of the sequence's sum."""
    lp, m = logps.float(), completion_mask.float()
    n = m.sum(-1, keepdim=True).clamp(min=1)
    adv = advantages.float().unsqueeze(-1)
    phi = trl_losses.vespo_weights(cfg, lp - old_logps.float(), m / n, adv)  # Σ_t (log ρ_t / n): the mean
    return trl_losses.vespo_loss(cfg, logps=logps, old_logps=old_logps, advantages=advantages,
                                 completion_mask=completion_mask)._replace(loss=-phi * adv * lp)


def _break(monkeypatch, change: str) -> dict:
    """Apply one broken variant; returns the config overrides it needs."""
    if change == "normaliser: the padded length, not max_completion_length":
        return {"loss_scale_factor": None}  # ours then divides by T, TRL by T + HORIZON_EXTRA
    if change == "verl's dual-clipped surrogate":
        monkeypatch.setitem(POLICY_LOSSES, "ppo_clip", vanilla_loss)
    elif change == "normaliser: each completion's token-mean, not its token-sum":
        mode = AggMode.SEQ_MEAN_TOKEN_SUM
        monkeypatch.setitem(aggregation_module._AGGREGATORS, mode, _SeqMeanTokenMeanAs(mode))
    elif change == "verl's GSPO (log s capped at 10)":
        monkeypatch.setitem(POLICY_LOSSES, "sequence_clip", related.gspo_loss)
    elif change == "φ of the mean log-ratio, not the sum":
        monkeypatch.setitem(POLICY_LOSSES, "vespo", _vespo_mean_log_ratio)
    elif change == "τ_pos for every token":
        monkeypatch.setitem(POLICY_LOSSES, "trl_sapo", lambda cfg, **kw: trl_losses.trl_sapo_loss(
            dataclasses.replace(cfg, sapo_tau_neg=cfg.sapo_tau_pos), **kw))
    elif change == "verl's SAPO (log ρ clamped at ±20)":
        monkeypatch.setitem(POLICY_LOSSES, "trl_sapo", related.sapo_loss)
    return {}


@pytest.mark.parametrize("method, change", [
    ("dr_grpo", "normaliser: the padded length, not max_completion_length"),
    ("dr_grpo", "verl's dual-clipped surrogate"),
    ("luspo", "normaliser: each completion's token-mean, not its token-sum"),
    ("luspo", "verl's GSPO (log s capped at 10)"),
    ("vespo", "φ of the mean log-ratio, not the sum"),
    ("sapo_trl", "τ_pos for every token"),
    ("sapo_trl", "verl's SAPO (log ρ clamped at ±20)"),
])
def test_broken_variants_differ_from_trl_by_a_measured_amount(monkeypatch, method, change):
    overrides = _break(monkeypatch, change)
    worst = differences(method, **overrides)
    print(f"{method} broken ({change}): (loss, gradient) relative difference to TRL {worst}")
    assert max(max(d) for d in worst.values()) > 1e-3, (method, change, worst)


@pytest.mark.parametrize("method", ["sapo", "cispo"])
def test_verls_form_differs_from_trl_only_where_every_log_ratio_is_beyond_20(method):
    """verl's SAPO and CISPO against TRL's loss_type of the same name: equal (≤ 1e-6) on the moderate and
    probability inputs; where every token of a call has log ρ near −30 (the extreme inputs), verl's clamp at −20
    zeroes SAPO's gradient (TRL's: ~e^−30) and weighs CISPO by e^−20 (TRL: e^−30), a measured difference."""
    worst = differences(method)
    print(f"verl's {method} vs TRL's: (loss, gradient) relative difference {worst}")
    assert max(max(worst["moderate"]), max(worst["probabilities"])) <= TOLERANCE < max(worst["extreme"]), worst


def test_trl_sapo_gradient_is_nan_beyond_float32_exp_as_trls():
    """At log ρ = 90 exp overflows float32: TRL's sapo gradient is NaN, and so is sapo_trl's (TRL's form, to the
    NaN); verl's (its clamp at 20) is the saturated gate's 0."""
    x = dict(logps=torch.tensor([[-1.0, -1.0]]), old_logps=torch.tensor([[-91.0, -1.5]]),
             advantages=torch.tensor([1.0]), completion_mask=torch.ones(1, 2, dtype=torch.int))
    trl_loss, trl_grad = _trl("sapo_trl", get_objective("sapo_trl"), x)
    loss, grad, _ = ours(get_objective("sapo_trl"), x, 0)
    assert torch.isnan(trl_grad[0, 0]) and torch.isnan(grad[0, 0]) and torch.isclose(trl_loss, loss)
    _, verl_form, _ = ours(get_objective("sapo"), x, 0)
    assert verl_form[0, 0] == 0.0 and torch.isfinite(verl_form).all()
