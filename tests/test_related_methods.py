"""verl 0.9.1's policy losses (Clip-Cov, KL-Cov, GSPO, CISPO, DPPO-TV/KL, SAPO, GMPO, GPG, DRO) against verl's own
functions, called as a peer.

verl is installed without its dependencies, and outside site-packages: ``make test`` runs ``pip install --no-deps
--target .venv/peers verl==0.9.1`` (its wheel also ships a top-level ``tests`` package, which in site-packages would
shadow this repository's ``tests``) and points ``STAPO_VERL_DIR`` there. Importing verl's package pulls ray and
more, so the fixture loads ``verl/trainer/ppo/core_algos.py`` and the real
``verl/utils/torch_functional.py`` (agg_loss's masked_sum) from the installed files, with the few modules they
import at the top stubbed in ``sys.modules`` for the duration of the load and restored after. The comparison: our
``policy_loss`` and verl's ``compute_policy_loss_<name>`` on the same random inputs, loss and gradient with respect
to the log-probs, ≤ 1e-6 relative, for each aggregation the method supports (verl's agg_loss checks our
aggregators too, seq-mean-token-sum and seq-mean-token-sum-norm included), several seeds and shapes, moderate and
extreme ratios; every branch, clamp and cap of each new loss is reached (``BRANCHES``, counted); deliberately broken
variants must fail it (so the comparison can fail), each by a measured amount.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
import sys
import types
from pathlib import Path

import pytest
import torch

from stapo.losses import related
from stapo.losses.policy import policy_loss, vanilla_loss
from stapo.losses.registry import POLICY_LOSSES, register_policy_loss
from stapo.study import get_objective
from stapo.study.methods import METHODS

from helpers.loss_inputs import EXTREME_LOG_RATIOS
from helpers.loss_inputs import extreme_inputs as _extreme_inputs, inputs as _inputs, ours as _ours
from helpers.loss_inputs import probability_inputs as _probability_inputs, relative_differences as _relative_differences

VERL_VERSION = "0.9.1"
TOLERANCE = 1e-6
VERL_FUNCTION = {m: f"compute_policy_loss_{m}" for m in ("clip_cov", "kl_cov", "gspo", "cispo", "dppo_tv", "dppo_kl",
                                                           "sapo", "geo_mean", "gpg", "dro")}
NEW = ("dppo_tv", "dppo_kl", "sapo", "geo_mean", "gpg", "dro")  # issue 43
# aggregations each method is compared under ("token-mean-per-micro-batch" on one micro-batch is verl's token-mean)
AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "token-mean-per-micro-batch", "seq-mean-token-sum",
                "seq-mean-token-sum-norm")
VERL_AGG = {**{a: a for a in AGGREGATIONS}, "token-mean-per-micro-batch": "token-mean"}
# where verl reads what our config calls otherwise: DPPO's trust region is verl's clip_ratio_low / _high, its
# importance-weight cap verl's clip_ratio_c
VERL_CLIP_RANGE = {"dppo_tv": ("dppo_delta_low", "dppo_delta_high"), "dppo_kl": ("dppo_delta_low", "dppo_delta_high")}
SHAPES = ((4, 9), (7, 33), (16, 64))
SEEDS = (0, 1, 2)


def _module(name: str, path: Path | None = None, **attrs) -> types.ModuleType:
    mod = types.ModuleType(name)
    if path is not None:
        mod.__path__ = [str(path)]
    mod.__dict__.update(attrs)
    return mod


def _load(name: str, path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


class ActorConfig:
    """What verl's policy losses read of its ``ActorConfig`` (verl/workers/config/actor.py)."""

    def __init__(self, *, clip_ratio_low: float, clip_ratio_high: float, clip_ratio_c: float, tau_pos: float,
                 tau_neg: float, loss_scale_factor: int | None = None, **policy_loss):
        self.clip_ratio = clip_ratio_low
        self.clip_ratio_low, self.clip_ratio_high, self.clip_ratio_c = clip_ratio_low, clip_ratio_high, clip_ratio_c
        self.tau_pos, self.tau_neg = tau_pos, tau_neg
        self.policy_loss = types.SimpleNamespace(**policy_loss)
        # one process: agg_loss normalises by this call's tokens / sequences (and the horizon, when given)
        self.global_batch_info = {} if loss_scale_factor is None else {"loss_scale_factor": loss_scale_factor}

    def get(self, key, default=None):
        return getattr(self, key, default)


@pytest.fixture(scope="module")
def core_algos():
    """verl 0.9.1's ``verl.trainer.ppo.core_algos`` module, loaded from the installed files (module docstring)."""
    given = os.environ.get("STAPO_VERL_DIR")
    root = Path(given or Path(sys.prefix) / "peers") / "verl"
    if not root.is_dir():
        if given:  # make test asks for it: a missing peer is a failure, not a skip
            pytest.fail(f"STAPO_VERL_DIR={given}: no verl/ there (pip install --no-deps --target {given} "
                        f"verl=={VERL_VERSION})")
        spec = importlib.util.find_spec("verl")  # a pip-installed verl: locate it without running its __init__
        if spec is None or not spec.submodule_search_locations:
            pytest.skip(f"verl {VERL_VERSION} is not installed (make test installs it: pip install --no-deps "
                        f"--target .venv/peers verl=={VERL_VERSION})")
        root = Path(spec.submodule_search_locations[0])
    assert (root / "version" / "version").read_text().strip() == VERL_VERSION
    stubs = {
        "verl": _module("verl", root),
        "verl.utils": _module("verl.utils", root / "utils", as_torch_index=None, group_mean_std=None),
        "verl.utils.device": _module("verl.utils.device", get_device_name=lambda: "cpu",
                                     get_torch_device=lambda: torch.cpu),
        "verl.utils.import_utils": _module("verl.utils.import_utils", deprecated=lambda *a, **k: (lambda f: f)),
        "verl.trainer": _module("verl.trainer", root / "trainer"),
        "verl.trainer.ppo": _module("verl.trainer.ppo", root / "trainer" / "ppo"),
        "verl.trainer.config": _module("verl.trainer.config", AlgoConfig=type("AlgoConfig", (), {})),
        "verl.workers": _module("verl.workers", root / "workers"),
        "verl.workers.config": _module("verl.workers.config", ActorConfig=ActorConfig),
        "tensordict": _module("tensordict", TensorDict=dict),
    }
    if importlib.util.find_spec("omegaconf") is None:
        stubs["omegaconf"] = _module("omegaconf", DictConfig=type("DictConfig", (), {}))
    loaded = ("verl.utils.torch_functional", "verl.trainer.ppo.core_algos")
    saved = {name: sys.modules.get(name) for name in (*stubs, *loaded)}
    sys.modules.update(stubs)
    try:
        stubs["verl.utils"].torch_functional = _load(loaded[0], root / "utils" / "torch_functional.py")
        yield _load(loaded[1], root / "trainer" / "ppo" / "core_algos.py")
    finally:
        for name, mod in saved.items():
            if mod is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = mod


def _actor_config(method: str, cfg) -> ActorConfig:
    """verl's ActorConfig with ``cfg``'s values where verl reads them."""
    low, high = VERL_CLIP_RANGE.get(method, ("eps_low", "eps_high"))
    return ActorConfig(clip_ratio_low=getattr(cfg, low), clip_ratio_high=getattr(cfg, high),
                       clip_ratio_c=cfg.dppo_is_cap if method in VERL_CLIP_RANGE else cfg.clip_ratio_c,
                       tau_pos=cfg.sapo_tau_pos, tau_neg=cfg.sapo_tau_neg,
                       loss_scale_factor=cfg.loss_scale_factor if "loss_scale_factor" in cfg.loss_agg_mode.params
                       else None,
                       clip_cov_ratio=cfg.clip_cov_ratio, clip_cov_lb=cfg.clip_cov_lb, clip_cov_ub=cfg.clip_cov_ub,
                       kl_cov_ratio=cfg.kl_cov_ratio, ppo_kl_coef=cfg.ppo_kl_coef, dro_beta=cfg.dro_beta)


def _verl(core_algos, method: str, cfg, x: dict, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    config = _actor_config(method, cfg)
    logps = x["logps"].clone().requires_grad_(True)
    mask = x["completion_mask"]
    advantages = x["advantages"].unsqueeze(-1).expand_as(logps).contiguous()  # verl's token-level advantages
    torch.manual_seed(seed)  # Clip-Cov's random choice: verl draws from the global generator
    loss, _ = getattr(core_algos, VERL_FUNCTION[method])(x["old_logps"], logps, advantages, mask,
                                                         loss_agg_mode=VERL_AGG[cfg.loss_agg_mode.value],
                                                         config=config)
    loss.backward()
    return loss.detach(), logps.grad


def aggregations(method: str) -> tuple[str, ...]:
    """The aggregations ``method`` is compared under: AGGREGATIONS, or the one its source defines (only_agg)."""
    only = METHODS[method].only_agg
    return AGGREGATIONS if only is None else (only,)


def max_relative_differences(core_algos, method: str, **overrides) -> tuple[float, float]:
    """The largest (loss, gradient) relative difference over its aggregations × SHAPES × SEEDS × two ratio
    spreads."""
    worst = (0.0, 0.0)
    for agg in aggregations(method):
        cfg = get_objective(method, loss_agg_mode=agg, **overrides)
        for (B, T) in SHAPES:
            for seed in SEEDS:
                for noise in (0.2, 1e-4):  # GSPO's 3e-4 trust region clips every sequence at the wider spread
                    x = _inputs(B, T, seed, noise)
                    diff = _relative_differences(_ours(cfg, x, seed), _verl(core_algos, method, cfg, x, seed))
                    worst = tuple(max(w, d) for w, d in zip(worst, diff))
    return worst


@pytest.mark.parametrize("method, overrides", [
    ("clip_cov", {}), ("clip_cov", {"clip_cov_ratio": 0.2}),  # the default detaches 1 token: also many
    ("kl_cov", {}), ("kl_cov", {"kl_cov_ratio": 0.2}),
    ("gspo", {}), ("gspo", {"eps_low": 0.2, "eps_high": 0.28}),
    ("cispo", {}), ("cispo", {"eps_low": 0.2, "eps_high": 0.28}),
    ("dppo_tv", {}), ("dppo_tv", {"dppo_delta_low": 0.05, "dppo_delta_high": 0.1, "dppo_is_cap": 20.0}),
    ("dppo_kl", {}), ("dppo_kl", {"dppo_delta_low": 0.01, "dppo_delta_high": 0.05}),
    ("sapo", {}), ("sapo", {"sapo_tau_pos": 0.5, "sapo_tau_neg": 2.0}),
    ("geo_mean", {}), ("geo_mean", {"eps_low": 0.05, "eps_high": 0.4}),
    ("gpg", {}), ("gpg", {"loss_scale_factor": 50}),  # a given Dr. GRPO horizon (verl's loss_scale_factor)
    ("dro", {}), ("dro", {"dro_beta": 1.0}),
])
def test_equals_verl(core_algos, method, overrides):
    loss_diff, grad_diff = max_relative_differences(core_algos, method, **overrides)
    assert loss_diff <= TOLERANCE and grad_diff <= TOLERANCE, (method, overrides, loss_diff, grad_diff)


@pytest.fixture
def broken_loss(monkeypatch):
    """Register a deliberately wrong loss under a method's name for one test."""
    def install(name: str, fn):
        monkeypatch.setitem(POLICY_LOSSES, name, fn)
    return install


def _no_stop_gradient_cispo(cfg, *, logps, old_logps, advantages, **_):
    ratio = torch.exp(torch.clamp(logps.float() - old_logps.float(), -20, 20))
    weight = torch.clamp(ratio, 1 - cfg.eps_low, 1 + cfg.eps_high)  # gradient through the weight: wrong
    loss = -weight * advantages.float().unsqueeze(-1) * logps.float()
    return POLICY_LOSSES["vanilla"](cfg, logps=logps, old_logps=old_logps, advantages=advantages)._replace(loss=loss)


@pytest.mark.parametrize("method, wrong, overrides", [
    ("gspo", vanilla_loss, {"eps_low": 0.2, "eps_high": 0.28}),  # token-level ratio instead of the sequence's
    ("clip_cov", vanilla_loss, {"clip_cov_ratio": 0.2}),  # no covariance detach
    ("kl_cov", vanilla_loss, {"kl_cov_ratio": 0.2}),  # clipped surrogate, no |log ρ| penalty
    ("cispo", _no_stop_gradient_cispo, {}),
])
def test_broken_variants_fail_the_comparison(core_algos, broken_loss, method, wrong, overrides):
    broken_loss(method, wrong)
    loss_diff, grad_diff = max_relative_differences(core_algos, method, **overrides)
    assert max(loss_diff, grad_diff) > 1e-3, (method, loss_diff, grad_diff)


def test_clip_cov_detached_tokens_stay_in_the_denominator():
    """Clip-Cov is a loss, not a mask: a detached token contributes 0 to the sum and 1 to the count."""
    cfg = get_objective("clip_cov", clip_cov_ratio=0.5, clip_cov_lb=-1e9, clip_cov_ub=1e9)
    x = _inputs(3, 8, 0, 0.0)  # on-policy: nothing is clipped, every token is eligible
    own = POLICY_LOSSES["clip_cov"](cfg, logps=x["logps"], old_logps=x["old_logps"], advantages=x["advantages"],
                                    completion_mask=x["completion_mask"].bool(),
                                    generator=torch.Generator().manual_seed(0))
    n = int(x["completion_mask"].sum())
    assert int(own.detached.sum()) == int(0.5 * n)
    loss, metrics = _ours(cfg, x, 0)[0], policy_loss(cfg, entropies=torch.zeros_like(x["logps"]),
                                                      generator=torch.Generator().manual_seed(0), **x)[1]
    kept = x["completion_mask"].bool() & ~own.detached
    expected = (-x["advantages"].unsqueeze(-1).expand_as(x["logps"]))[kept].sum() / n  # ratio 1
    assert float(loss) == pytest.approx(float(expected), rel=1e-6)
    assert metrics["kept_fraction"] == 1.0 and metrics["silenced_fraction"] == pytest.approx(int(0.5 * n) / n)


def test_a_new_loss_is_one_declaration_and_its_function(monkeypatch):
    """README "Add a method", the loss kind: a REINFORCE loss −Â·log π, declared and registered, trains through
    policy_loss with the shared aggregation."""
    import stapo.study.methods
    import stapo.study.objective as objective_module
    from stapo import study

    monkeypatch.setattr(stapo.study.methods, "METHODS", dict(stapo.study.methods.METHODS))
    monkeypatch.setattr(objective_module, "METHODS", stapo.study.methods.METHODS)
    monkeypatch.setattr("stapo.losses.registry.POLICY_LOSSES", dict(POLICY_LOSSES))

    @register_policy_loss("reinforce")
    def reinforce(cfg, *, logps, old_logps, advantages, completion_mask, **_):
        loss = -advantages.float().unsqueeze(-1) * logps.float()
        return vanilla_loss(cfg, logps=logps, old_logps=old_logps, advantages=advantages)._replace(loss=loss)

    stapo.study.methods.declare("reinforce", label="REINFORCE", loss="reinforce")
    cfg = study.parse({"study": "s", "methods": {"rf": {"objective": "reinforce"}}}, required=()).methods["rf"]
    x = _inputs(2, 3, 0, 0.0)
    x["completion_mask"] = torch.ones(2, 3, dtype=torch.int)
    loss, grad, _ = _ours(cfg, x, 0)
    assert float(loss) == pytest.approx(float(-(x["advantages"].unsqueeze(-1) * x["logps"]).sum() / 6), rel=1e-6)
    torch.testing.assert_close(grad, (-x["advantages"] / 6).unsqueeze(-1).expand(2, 3))


# -------------------------------------------------------------- extreme ratios (issue 37: mutation testing)
# The random inputs above keep |log ρ| below ~1, where neither CISPO's ±20 clamp of log ρ nor GSPO's cap of the
# sequence log-ratio at 10 binds: a CISPO clamped at ±10, or a GSPO without its cap, passes test_equals_verl with a
# difference of exactly 0. These inputs put every token's log ρ near −30, −15, +15 or +30.

def extreme_relative_differences(core_algos, method: str, **overrides) -> dict[float, tuple[float, float]]:
    """Per log ρ region, the largest (loss, gradient) relative difference to verl over AGGREGATIONS × two shapes ×
    two seeds."""
    worst = {}
    for log_ratio in EXTREME_LOG_RATIOS:
        worst[log_ratio] = (0.0, 0.0)
        for agg in aggregations(method):
            cfg = get_objective(method, loss_agg_mode=agg, **overrides)
            for (B, T) in SHAPES[:2]:
                for seed in SEEDS[:2]:
                    x = _extreme_inputs(B, T, seed, log_ratio)
                    diff = _relative_differences(_ours(cfg, x, seed), _verl(core_algos, method, cfg, x, seed))
                    worst[log_ratio] = tuple(max(w, d) for w, d in zip(worst[log_ratio], diff))
    return worst


@pytest.mark.parametrize("method", list(VERL_FUNCTION))
def test_equals_verl_at_extreme_ratios(core_algos, method):
    worst = extreme_relative_differences(core_algos, method)
    assert all(max(d) <= TOLERANCE for d in worst.values()), (method, worst)


@pytest.mark.parametrize("method, change", [
    ("cispo", "log_ratio_clip 10"),  # CISPO's log ρ clamped at ±10 instead of ±20
    ("gspo", "no cap"),  # GSPO's sequence log-ratio without its cap at 10
])
def test_clamps_that_only_extreme_ratios_reach_fail_the_comparison(core_algos, monkeypatch, method, change):
    """The two changes the moderate inputs cannot see (difference 0 there) differ from verl by far more than the
    tolerance at the extreme ratios: CISPO where log ρ < −10 (its weight e^−10 instead of ρ), GSPO where a
    sequence's log-ratio exceeds 10 with Â < 0 (e^15 instead of e^10)."""
    import stapo.losses.related

    overrides = {"log_ratio_clip": 10.0} if change == "log_ratio_clip 10" else {}
    if change == "no cap":
        monkeypatch.setattr(stapo.losses.related, "GSPO_LOG_RATIO_MAX", float("inf"))
    moderate = max_relative_differences(core_algos, method, **overrides)
    worst = extreme_relative_differences(core_algos, method, **overrides)
    print(f"{method} with {change}: moderate inputs (loss, gradient) {moderate}; extreme, by log ρ: {worst}")
    assert max(max(d) for d in worst.values()) > 1.0, (method, change, worst)


def test_cispo_clamps_log_ratio_at_20_hand_computed():
    """CISPO (ε_low = 1, ε_high = 4: weight clip(ρ, 0, 5)), one response, Â = +1, log ρ = −15, −30, +15, +30 →
    clamped to −15, −20, 15, 20: weights e^−15, e^−20, 5, 5; ℓ = −w·Â·log π with log π = −15, −30, −2, −2.
    token-mean: loss (15e^−15 + 30e^−20 + 10 + 10) / 4, ∂loss/∂log π = −w / 4, ratio_mean (e^−15 + e^−20 + e^15 +
    e^20) / 4 (the clamped ratios)."""
    logps = torch.tensor([[-15.0, -30.0, -2.0, -2.0]], requires_grad=True)
    x = dict(old_logps=torch.tensor([[0.0, 0.0, -17.0, -32.0]]), advantages=torch.tensor([1.0]),
             completion_mask=torch.ones(1, 4, dtype=torch.int), entropies=torch.zeros(1, 4))
    loss, m = policy_loss(get_objective("cispo"), logps=logps, **x)
    e = math.exp
    assert loss.item() == pytest.approx((15 * e(-15) + 30 * e(-20) + 20) / 4, rel=1e-6)
    assert m["ratio_mean"] == pytest.approx((e(-15) + e(-20) + e(15) + e(20)) / 4, rel=1e-5)
    loss.backward()
    torch.testing.assert_close(logps.grad, torch.tensor([[-e(-15) / 4, -e(-20) / 4, -1.25, -1.25]]), rtol=1e-5,
                               atol=0.0)


def test_gspo_caps_the_sequence_log_ratio_at_10_hand_computed():
    """GSPO (seq-mean-token-mean, ε 3e-4 / 4e-4), Â = −1 on both responses, so ℓ = s (the unclipped branch).
    Response 0: log ρ = 14, 16, mean 15 → capped at 10: s = e^10, zero gradient (the cap binds). Response 1:
    log ρ = 12, 4 and a padded position, mean 8 (the cap is on the sequence, not the 12): s = e^8, ∂ℓ/∂log π_t =
    s / 2 tokens / 2 responses. loss (e^10 + e^8) / 2; ratio_mean the same (two tokens each)."""
    logps = torch.full((2, 3), -1.0, requires_grad=True)
    x = dict(old_logps=torch.tensor([[-15.0, -17.0, -1.0], [-13.0, -5.0, -99.0]]),
             advantages=torch.tensor([-1.0, -1.0]), completion_mask=torch.tensor([[1, 1, 0], [1, 1, 0]]),
             entropies=torch.zeros(2, 3))
    loss, m = policy_loss(get_objective("gspo"), logps=logps, **x)
    e = math.exp
    assert loss.item() == pytest.approx((e(10) + e(8)) / 2, rel=1e-5)
    assert m["ratio_mean"] == pytest.approx((e(10) + e(8)) / 2, rel=1e-5)
    loss.backward()
    torch.testing.assert_close(logps.grad, torch.tensor([[0.0, 0.0, 0.0], [e(8) / 4, e(8) / 4, 0.0]]), rtol=1e-5,
                               atol=0.0)


@pytest.mark.parametrize("lb, ub, detached", [(1.0, 5.0, 0), (0.0, 1.0, 0), (0.5, 1.5, 1)])
def test_clip_cov_bounds_are_strict(lb, ub, detached):
    """Two on-policy tokens (ratio 1, nothing clipped), Â = +1, −1, log π = −1, −3: covariance (Â − 0)(log π + 2) =
    1 for both, exactly. A bound equal to it excludes them (lb < cov < ub, verl's); inside (0.5, 1.5) one of the
    two (max(1, ⌊0.5·2⌋)) is detached. ℓ = −Â: gradient −Â / 2 per token, 0 for the detached one."""
    cfg = get_objective("clip_cov", clip_cov_ratio=0.5, clip_cov_lb=lb, clip_cov_ub=ub)
    logps = torch.tensor([[-1.0], [-3.0]], requires_grad=True)
    loss, m = policy_loss(cfg, logps=logps, old_logps=logps.detach(), advantages=torch.tensor([1.0, -1.0]),
                          entropies=torch.zeros(2, 1), completion_mask=torch.ones(2, 1, dtype=torch.int),
                          generator=torch.Generator().manual_seed(0))
    loss.backward()
    assert m["silenced_fraction"] == detached / 2 and m["kept_fraction"] == 1.0
    assert logps.grad.flatten().tolist() in ([[-0.5, 0.5]] if not detached else [[0.0, 0.5], [-0.5, 0.0]])


# ------------------------------------------- issue 43: verl's other losses, at inputs that reach every branch
# DPPO reads probabilities (its trust region is on π − π_old, or their binary KL): these inputs keep both in (0, 1)
# and mix old probabilities close to the new (inside the region), anywhere in (0, 1) (outside it), and below e^−21
# (ρ > e^20: log ρ clamped, the importance weight capped), with new ones below e^−21 too (log ρ < −20).


def probability_relative_differences(core_algos, method: str, **overrides) -> tuple[float, float]:
    worst = (0.0, 0.0)
    for agg in aggregations(method):
        cfg = get_objective(method, loss_agg_mode=agg, **overrides)
        for (B, T) in SHAPES:
            for seed in SEEDS:
                x = _probability_inputs(B, T, seed)
                diff = _relative_differences(_ours(cfg, x, seed), _verl(core_algos, method, cfg, x, seed))
                worst = tuple(max(w, d) for w, d in zip(worst, diff))
    return worst


def all_input_sets():
    """Every input set the comparisons use: moderate (two spreads), extreme log ρ, probabilities."""
    for (B, T) in SHAPES:
        for seed in SEEDS:
            yield from (_inputs(B, T, seed, 0.2), _inputs(B, T, seed, 1e-4), _probability_inputs(B, T, seed))
            if (B, T) != SHAPES[-1] and seed != SEEDS[-1]:
                yield from (_extreme_inputs(B, T, seed, r) for r in EXTREME_LOG_RATIOS)


def _region(cfg, lp, old, pos):
    """DPPO's trust-region tests, each side (stapo.losses.related, written again from verl's definitions)."""
    p, po = lp.exp(), old.exp()
    kl = po * (old - lp) + (1 - po) * torch.log((1.0 - po + 1e-8) / (1.0 - p + 1e-8))
    return {"tv": torch.where(pos, p - po <= cfg.dppo_delta_high, p - po >= -cfg.dppo_delta_low),
            "kl": torch.where(pos, kl <= cfg.dppo_delta_high, kl <= cfg.dppo_delta_low),
            "kl_saved": torch.where(pos, p <= po, p >= po)}


# per method: the branches, clamps and caps of its loss, as Bool [B, T] of (cfg, log π, log π_old, Â [B, 1])
BRANCHES = {
    "dppo_tv": lambda c, lp, old, a: {
        f"Â{'>0' if s else '≤0'} {where}": ((a > 0) == s) & (inside == _region(c, lp, old, a > 0)["tv"])
        for s in (True, False) for where, inside in (("inside", True), ("outside", False))} | {
        "ρ > C (weight capped)": (lp - old).clamp(-20, 20).exp() > c.dppo_is_cap, "log ρ > 20": lp - old > 20,
        "log ρ < −20": lp - old < -20},
    "dppo_kl": lambda c, lp, old, a: {
        f"Â{'>0' if s else '≤0'} {what}": ((a > 0) == s) & hit
        for s in (True, False) for r in [_region(c, lp, old, torch.full_like(a, s, dtype=torch.bool))]
        for what, hit in (("KL ≤ δ", r["kl"]), ("KL > δ, saved by the direction", ~r["kl"] & r["kl_saved"]),
                          ("KL > δ, dropped", ~r["kl"] & ~r["kl_saved"]))} | {
        "ρ > C (weight capped)": (lp - old).clamp(-20, 20).exp() > c.dppo_is_cap, "log ρ > 20": lp - old > 20,
        "log ρ < −20": lp - old < -20},
    "sapo": lambda c, lp, old, a: {"Â>0 (τ_pos)": (a > 0).expand_as(lp), "Â≤0 (τ_neg)": (a <= 0).expand_as(lp),
                                   "log ρ > 20": lp - old > 20, "log ρ < −20": lp - old < -20},
    "geo_mean": lambda c, lp, old, a: {
        "Â>0, log ρ > ε_high (clipped)": (a > 0) & (lp - old > c.eps_high),
        "Â>0, log ρ < −ε_low (kept)": (a > 0) & (lp - old < -c.eps_low),
        "Â<0, log ρ < −ε_low (clipped)": (a < 0) & (lp - old < -c.eps_low),
        "Â<0, log ρ > ε_high (kept)": (a < 0) & (lp - old > c.eps_high),
        "inside [−ε_low, ε_high]": (lp - old).abs() <= min(c.eps_low, c.eps_high)},
    "gpg": lambda c, lp, old, a: {"Â>0": (a > 0).expand_as(lp), "Â<0": (a < 0).expand_as(lp)},
    "dro": lambda c, lp, old, a: {"Â>0": (a > 0).expand_as(lp), "Â<0": (a < 0).expand_as(lp),
                                  "|log ρ| > 20 (no clamp)": (lp - old).abs() > 20},
}


def branch_counts(method: str) -> dict[str, int]:
    """How many completion tokens of all the input sets fall in each of ``method``'s BRANCHES."""
    cfg, counts = get_objective(method), {}
    for x in all_input_sets():
        m = x["completion_mask"].bool()
        for name, hit in BRANCHES[method](cfg, x["logps"], x["old_logps"], x["advantages"].unsqueeze(-1)).items():
            counts[name] = counts.get(name, 0) + int((hit & m).sum())
    return counts


@pytest.mark.parametrize("method", NEW)
def test_new_losses_equal_verl_where_every_branch_is_reached(core_algos, method):
    counts = branch_counts(method)
    print(f"{method} branches (tokens): {counts}")
    assert all(n > 0 for n in counts.values()), (method, counts)
    diff = probability_relative_differences(core_algos, method)
    assert max(diff) <= TOLERANCE, (method, diff)


def _dppo_without_region(cfg, *, logps, old_logps, advantages, completion_mask, **_):
    return related._dppo(cfg, logps, old_logps, advantages, completion_mask, lambda *a: torch.ones_like(a[0]).bool())


def _dppo_cap_20(cfg, **kw):  # verl's fallback when clip_ratio_c is absent, where verl reads it as 3
    return related.dppo_tv_loss(dataclasses.replace(cfg, dppo_is_cap=20.0), **kw)


def _sapo_one_temperature(cfg, **kw):
    return related.sapo_loss(dataclasses.replace(cfg, sapo_tau_neg=cfg.sapo_tau_pos), **kw)


def _geo_mean_symmetric_clip(cfg, *, logps, old_logps, advantages, completion_mask, **_):
    m, lr = completion_mask.float(), logps.float() - old_logps.float()
    ratio = torch.exp((torch.clamp(lr, -cfg.eps_low, cfg.eps_high) * m).sum(-1) / (m.sum(-1) + 1e-8))
    loss = (-advantages.float() * ratio).unsqueeze(-1).expand_as(lr)
    return related.gpg_loss(cfg, logps=logps, advantages=advantages, completion_mask=completion_mask)._replace(
        loss=loss)


def _gpg_ratio(cfg, *, logps, old_logps, advantages, completion_mask, **_):
    loss = -torch.exp(logps.float() - old_logps.float()) * advantages.float().unsqueeze(-1)
    return related.gpg_loss(cfg, logps=logps, advantages=advantages, completion_mask=completion_mask)._replace(
        loss=loss)


def _dro_full_beta(cfg, *, logps, old_logps, advantages, completion_mask, **_):
    lp = logps.float()
    loss = -(lp * advantages.float().unsqueeze(-1) - cfg.dro_beta * (lp - old_logps.float()).square())
    return related.gpg_loss(cfg, logps=logps, advantages=advantages, completion_mask=completion_mask)._replace(
        loss=loss)


BROKEN = {  # method -> (what is wrong, the wrong loss registered under its name)
    "dppo_tv": ("no trust region (every token keeps its gradient)", _dppo_without_region),
    "dppo_kl": ("the TV region instead of the binary KL's", related.dppo_tv_loss),
    "sapo": ("τ_pos for every token (τ_neg never used)", _sapo_one_temperature),
    "geo_mean": ("log ρ clipped to [−ε_low, ε_high] whatever Â's sign", _geo_mean_symmetric_clip),
    "gpg": ("−Â·ρ instead of −Â·log π", _gpg_ratio),
    "dro": ("the penalty β (log ρ)² instead of β/2 (log ρ)²", _dro_full_beta),
}


@pytest.mark.parametrize("method", NEW)
def test_broken_new_losses_fail_by_a_measured_amount(core_algos, broken_loss, method):
    """Each broken variant differs from verl by more than 1e-3 (relative, loss or gradient) on some input set;
    DPPO's cap at verl's fallback 20 instead of clip_ratio_c is seen only where ρ > 3 (the probability inputs)."""
    what, wrong = BROKEN[method]
    broken_loss(method, wrong)
    figures = {"moderate": max_relative_differences(core_algos, method),
               "probabilities": probability_relative_differences(core_algos, method)}
    print(f"{method} broken ({what}): (loss, gradient) relative difference to verl {figures}")
    assert max(max(d) for d in figures.values()) > 1e-3, (method, figures)


def test_dppo_cap_at_the_fallback_fails_only_where_rho_exceeds_it(core_algos, broken_loss):
    broken_loss("dppo_tv", _dppo_cap_20)
    moderate = max_relative_differences(core_algos, "dppo_tv")
    probabilities = probability_relative_differences(core_algos, "dppo_tv")
    print(f"dppo_tv with cap 20 for 3: moderate {moderate}, probabilities {probabilities}")
    assert max(moderate) <= TOLERANCE < 1e-3 < max(probabilities), (moderate, probabilities)
