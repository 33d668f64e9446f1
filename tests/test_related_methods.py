"""The related methods (Clip-Cov, KL-Cov, GSPO, CISPO) against verl 0.9.1's own functions, called as a peer.

verl is installed without its dependencies, and outside site-packages: ``make test`` runs ``pip install --no-deps
--target .venv/peers verl==0.9.1`` (its wheel also ships a top-level ``tests`` package, which in site-packages would
shadow this repository's ``tests``) and points ``STAPO_VERL_DIR`` there. Importing verl's package pulls ray and
more, so the fixture loads ``verl/trainer/ppo/core_algos.py`` and the real
``verl/utils/torch_functional.py`` (agg_loss's masked_sum) from the installed files, with the few modules they
import at the top stubbed in ``sys.modules`` for the duration of the load and restored after. The comparison: our
``policy_loss`` and verl's ``compute_policy_loss_<name>`` on the same random inputs, loss and gradient with respect
to the log-probs, ≤ 1e-6 relative, for each aggregation the method supports, several seeds and shapes; deliberately
broken variants must fail it (so the comparison can fail).
"""

from __future__ import annotations

import importlib.util
import math
import os
import sys
import types
from pathlib import Path

import pytest
import torch

from stapo.losses.policy import policy_loss, vanilla_loss
from stapo.losses.registry import POLICY_LOSSES, register_policy_loss
from stapo.study import get_objective

VERL_VERSION = "0.9.1"
TOLERANCE = 1e-6
VERL_FUNCTION = {"clip_cov": "compute_policy_loss_clip_cov", "kl_cov": "compute_policy_loss_kl_cov",
                 "gspo": "compute_policy_loss_gspo", "cispo": "compute_policy_loss_cispo"}
# aggregations each method is compared under ("token-mean-per-micro-batch" on one micro-batch is verl's token-mean)
AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "token-mean-per-micro-batch")
VERL_AGG = {"token-mean": "token-mean", "seq-mean-token-mean": "seq-mean-token-mean",
            "token-mean-per-micro-batch": "token-mean"}
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

    def __init__(self, *, clip_ratio_low: float, clip_ratio_high: float, **policy_loss):
        self.clip_ratio = clip_ratio_low
        self.clip_ratio_low, self.clip_ratio_high = clip_ratio_low, clip_ratio_high
        self.policy_loss = types.SimpleNamespace(**policy_loss)
        self.global_batch_info = {}  # one process: agg_loss normalises by this call's tokens / sequences

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


def _inputs(B: int, T: int, seed: int, noise: float) -> dict:
    """Random log-probs (a fifth rare, π < 0.002), old = new + noise, advantages [B] of both signs, masks with
    1..T tokens per row and random (finite) values in the padding."""
    g = torch.Generator().manual_seed(seed)
    probs = torch.rand(B, T, generator=g) * 0.9 + 0.05
    probs = torch.where(torch.rand(B, T, generator=g) < 0.2, torch.rand(B, T, generator=g) * 0.002, probs)
    logps = probs.log()
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    return dict(logps=logps, old_logps=logps + noise * torch.randn(B, T, generator=g),
                advantages=torch.randn(B, generator=g),
                completion_mask=(torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)).int())


def _ours(cfg, x: dict, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    logps = x["logps"].clone().requires_grad_(True)
    loss, _ = policy_loss(cfg, logps=logps, old_logps=x["old_logps"], advantages=x["advantages"],
                          entropies=torch.zeros_like(logps), completion_mask=x["completion_mask"],
                          generator=torch.Generator().manual_seed(seed))
    loss.backward()
    return loss.detach(), logps.grad


def _verl(core_algos, method: str, cfg, x: dict, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    config = ActorConfig(clip_ratio_low=cfg.eps_low, clip_ratio_high=cfg.eps_high, clip_cov_ratio=cfg.clip_cov_ratio,
                         clip_cov_lb=cfg.clip_cov_lb, clip_cov_ub=cfg.clip_cov_ub, kl_cov_ratio=cfg.kl_cov_ratio,
                         ppo_kl_coef=cfg.ppo_kl_coef)
    logps = x["logps"].clone().requires_grad_(True)
    mask = x["completion_mask"]
    advantages = x["advantages"].unsqueeze(-1).expand_as(logps).contiguous()  # verl's token-level advantages
    torch.manual_seed(seed)  # Clip-Cov's random choice: verl draws from the global generator
    loss, _ = getattr(core_algos, VERL_FUNCTION[method])(x["old_logps"], logps, advantages, mask,
                                                         loss_agg_mode=VERL_AGG[cfg.loss_agg_mode.value],
                                                         config=config)
    loss.backward()
    return loss.detach(), logps.grad


def _relative_differences(a, b) -> tuple[float, float]:
    (la, ga), (lb, gb) = a, b
    return (float((la - lb).abs() / lb.abs().clamp(min=1e-12)),
            float((ga - gb).abs().max() / gb.abs().max().clamp(min=1e-12)))


def max_relative_differences(core_algos, method: str, **overrides) -> tuple[float, float]:
    """The largest (loss, gradient) relative difference over AGGREGATIONS × SHAPES × SEEDS × two ratio spreads."""
    worst = (0.0, 0.0)
    for agg in AGGREGATIONS:
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
    loss, grad = _ours(cfg, x, 0)
    assert float(loss) == pytest.approx(float(-(x["advantages"].unsqueeze(-1) * x["logps"]).sum() / 6), rel=1e-6)
    torch.testing.assert_close(grad, (-x["advantages"] / 6).unsqueeze(-1).expand(2, 3))


# -------------------------------------------------------------- extreme ratios (issue 37: mutation testing)
# The random inputs above keep |log ρ| below ~1, where neither CISPO's ±20 clamp of log ρ nor GSPO's cap of the
# sequence log-ratio at 10 binds: a CISPO clamped at ±10, or a GSPO without its cap, passes test_equals_verl with a
# difference of exactly 0. These inputs put every token's log ρ near −30, −15, +15 or +30.

EXTREME_LOG_RATIOS = (-30.0, -15.0, 15.0, 30.0)


def _extreme_inputs(B: int, T: int, seed: int, log_ratio: float) -> dict:
    """:func:`_inputs` with every log ρ = log_ratio ± 0.5·N(0, 1)."""
    x = _inputs(B, T, seed, 0.5)
    return {**x, "old_logps": x["old_logps"] - log_ratio}


def extreme_relative_differences(core_algos, method: str, **overrides) -> dict[float, tuple[float, float]]:
    """Per log ρ region, the largest (loss, gradient) relative difference to verl over AGGREGATIONS × two shapes ×
    two seeds."""
    worst = {}
    for log_ratio in EXTREME_LOG_RATIOS:
        worst[log_ratio] = (0.0, 0.0)
        for agg in AGGREGATIONS:
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
