"""The four objectives against hand-computed values, masks against their definitions, gradients against masks."""

import math
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from stapo.study.names import MAIN_METHODS
from stapo.losses.masks import (
    ablation_silence_mask,
    candidate_mask,
    high_entropy_mask,
    kept_mask,
    quantile,
    silence_mask,
    step_thresholds,
    top_k_count,
)
from stapo.losses.aggregation import aggregation
from stapo.losses.policy import policy_loss
from stapo.losses.registry import POLICY_LOSSES, THRESHOLDS, TOKEN_MASKS, Thresholds
from stapo.study.methods import METHODS as DECLARED
from stapo.study import OBJECTIVES as METHODS, ObjectiveConfig, get_objective
from stapo.study.objective import AGG_MODES, SCOPES


def _inputs(logps, advantages, mask, entropies=None, old_logps=None):
    logps = torch.tensor(logps, dtype=torch.float32, requires_grad=True)
    old = logps.detach().clone() if old_logps is None else torch.tensor(old_logps, dtype=torch.float32)
    ent = torch.ones_like(old) if entropies is None else torch.tensor(entropies, dtype=torch.float32)
    return dict(
        logps=logps,
        old_logps=old,
        advantages=torch.tensor(advantages, dtype=torch.float32),
        entropies=ent,
        completion_mask=torch.tensor(mask),
    )


# ------------------------------------------------------------------------------------------- registry


def test_registry_has_paper_defaults():
    assert MAIN_METHODS == ("grpo", "entropy20", "justrl", "stapo")
    assert set(METHODS) >= set(MAIN_METHODS) | {"stapo_high", "stapo_random", "stapo_full"}
    g = METHODS["grpo"]
    assert (g.eps_low, g.eps_high, g.kl_beta) == (0.2, 0.2, 0.04)
    for name in ("justrl", "entropy20", "stapo"):
        c = METHODS[name]
        assert (c.eps_low, c.eps_high, c.kl_beta) == (0.2, 0.28, 0.0)
    s = METHODS["stapo"]
    assert (s.tau_p, s.entropy_quantile) == (0.002, 0.75)
    assert METHODS["entropy20"].top_entropy_ratio == 0.2


@pytest.mark.parametrize(
    "kwargs, key",
    [
        (dict(method="ppo"), "method"),
        (dict(method="stapo", tau_p=0.0), "tau_p"),
        (dict(method="stapo", tau_p=1.5), "tau_p"),
        (dict(method="stapo", entropy_quantile=1.0), "entropy_quantile"),
        (dict(method="entropy20", top_entropy_ratio=0.0), "top_entropy_ratio"),
        (dict(method="grpo", kl_beta=-1.0), "kl_beta"),
    ],
)
def test_config_validation_names_the_key(kwargs, key):
    with pytest.raises(ValueError, match=key):
        ObjectiveConfig(**kwargs)


def test_verl_loss_details_per_method():
    """JustRL's script: clip_ratio_c 10, token-mean; GRPO: verl's default c = 3, seq-mean-token-mean; verl clamps."""
    for name in ("justrl", "entropy20", "stapo", "stapo_high", "stapo_random", "stapo_full"):
        c = METHODS[name]
        assert (c.clip_ratio_c, c.loss_agg_mode, c.quantile_scope) == (10.0, "token-mean", "mini_batch")
    g = METHODS["grpo"]
    assert (g.clip_ratio_c, g.loss_agg_mode) == (3.0, "seq-mean-token-mean")
    assert (g.log_ratio_clip, g.kl_log_ratio_clip, g.kl_clip) == (20.0, 20.0, 10.0)
    assert get_objective("grpo", kl_beta=0.0).clip_ratio_c == 3.0  # overrides keep the method's defaults
    for kwargs, key in [(dict(clip_ratio_c=1.0), "clip_ratio_c"), (dict(loss_agg_mode="seq-sum"), "loss_agg_mode"),
                        (dict(quantile_scope="batch"), "quantile_scope"), (dict(kl_clip=0.0), "kl_clip")]:
        with pytest.raises(ValueError, match=key):
            get_objective("stapo", **kwargs)


def test_get_objective_overrides():
    cfg = get_objective("stapo", tau_p=0.01)
    assert cfg.tau_p == 0.01 and cfg.eps_high == 0.28
    with pytest.raises(ValueError, match="unknown method"):
        get_objective("dapo")


# ------------------------------------------------------------------------------------ hand-computed losses


def test_justrl_token_mean_ratio_one():
    # ratio 1 → ℓ = −Â per token; tokens: seq0 two (Â=+1), seq1 one (Â=−1): (−1 −1 +1) / 3.
    x = _inputs([[-1.0, -2.0, -3.0], [-1.0, -1.0, -1.0]], [1.0, -1.0], [[1, 1, 0], [1, 0, 0]])
    loss, metrics = policy_loss(METHODS["justrl"], **x)
    assert loss.item() == pytest.approx(-1.0 / 3.0)
    assert metrics["kept_fraction"] == 1.0 and metrics["silenced_fraction"] == 0.0
    assert metrics["ratio_mean"] == pytest.approx(1.0)


@pytest.mark.parametrize(
    "ratio, adv, expected",
    [
        (1.5, 1.0, -1.28),  # upper clip binds for Â > 0 (ε_high = 0.28)
        (0.5, 1.0, -0.5),  # no clip: min picks the unclipped 0.5
        (0.5, -1.0, 0.8),  # lower clip binds for Â < 0 (ε_low = 0.2)
        (1.5, -1.0, 1.5),  # min picks the unclipped −1.5
        (1.1, 2.0, -2.2),  # inside the trust region
    ],
)
def test_clipped_surrogate_single_token(ratio, adv, expected):
    x = _inputs([[math.log(ratio)]], [adv], [[1]], old_logps=[[0.0]])
    loss, _ = policy_loss(METHODS["justrl"], **x)
    assert loss.item() == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize(
    "logp, old_logp, adv, c, expected",
    [
        # rare token sampled at π_old = 1e-6 whose probability rose to 0.5: ρ = 5e5. Â < 0: the dual clip caps
        # −min(ρÂ, clip(ρ)Â) = ρ|Â| = 5e5 at c·|Â|.
        (math.log(0.5), math.log(1e-6), -1.0, 10.0, 10.0),
        (math.log(0.5), math.log(1e-6), -2.0, 3.0, 6.0),
        # same token, Â > 0: the upper clip binds (ρ > 1.28), no dual clip for positive advantages
        (math.log(0.5), math.log(1e-6), 1.0, 10.0, -1.28),
        # ρ = 5 < c = 10: the dual clip does not bind, the plain loss ρ|Â| = 5 remains
        (math.log(5e-6), math.log(1e-6), -1.0, 10.0, 5.0),
        # ρ = 5 > c = 3: capped at 3
        (math.log(5e-6), math.log(1e-6), -1.0, 3.0, 3.0),
        # probability fell: ρ = 0.01, Â < 0: the lower clip binds at 0.8, far below c
        (math.log(1e-8), math.log(1e-6), -1.0, 10.0, 0.8),
    ],
)
def test_dual_clip_hand_computed(logp, old_logp, adv, c, expected):
    x = _inputs([[logp]], [adv], [[1]], old_logps=[[old_logp]])
    cfg = get_objective("justrl", clip_ratio_c=c)
    loss, m = policy_loss(cfg, **x)
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    loss.backward()
    ratio = math.exp(logp - old_logp)
    capped = adv < 0 and ratio * abs(adv) > c * abs(adv)
    assert m["clip_fraction_dual"] == (1.0 if capped else 0.0)
    if capped or expected in (-1.28, 0.8):  # every clip leaves zero gradient beyond it (verl)
        assert x["logps"].grad.item() == 0.0
    else:
        assert x["logps"].grad.item() == pytest.approx(-adv * ratio, rel=1e-5)


def test_log_ratio_is_clamped_at_20():
    # log ρ = 30 would overflow to e^30 ≈ 1e13; verl clamps it to 20 before exp, so Â < 0 with c = 1e12 gives
    # e^20·|Â| (the cap c|Â| = 1e12 > e^20 ≈ 4.85e8 does not bind)
    x = _inputs([[0.0]], [-1.0], [[1]], old_logps=[[-30.0]])
    loss, m = policy_loss(get_objective("justrl", clip_ratio_c=1e12), **x)
    assert loss.item() == pytest.approx(math.exp(20.0), rel=1e-5)
    assert m["ratio_mean"] == pytest.approx(math.exp(20.0), rel=1e-5)


def test_kl_clamps_as_verl_low_var_kl():
    # δ = log π_ref − log π: δ = 25 is clamped to 20, e^20 − 20 − 1 ≈ 4.85e8 is clamped to 10; δ = −30 is
    # clamped to −20: e^−20 + 20 − 1 ≈ 19 > 10 → 10; δ = 2: e^2 − 3 = 4.389 (no clamp)
    logps = [[-26.0, 0.0, -3.0]]
    ref = torch.tensor([[-1.0, -30.0, -1.0]])
    x = _inputs(logps, [0.0], [[1, 1, 1]])
    cfg = METHODS["grpo"]
    loss, m = policy_loss(cfg, ref_logps=ref, **x)
    k3 = [10.0, 10.0, math.exp(2.0) - 3.0]
    assert m["kl_mean"] == pytest.approx(sum(k3) / 3, rel=1e-6)
    assert loss.item() == pytest.approx(0.04 * sum(k3) / 3, rel=1e-6)
    loss.backward()
    g = x["logps"].grad[0]
    assert g[0] == 0 and g[1] == 0 and g[2] != 0  # clamped values carry no gradient


def test_clip_fractions():
    # ratios 1.5 (Â>0: high clip), 0.5 (Â<0: low clip), 1.0, 1.0
    x = _inputs(
        [[math.log(1.5), 0.0], [math.log(0.5), 0.0]], [1.0, -1.0], [[1, 1], [1, 1]], old_logps=[[0.0, 0.0], [0.0, 0.0]]
    )
    _, m = policy_loss(METHODS["justrl"], **x)
    assert m["clip_fraction_high"] == 0.25 and m["clip_fraction_low"] == 0.25 and m["clip_fraction"] == 0.5
    assert m["ratio_mean"] == pytest.approx((1.5 + 0.5 + 2.0) / 4)


def test_grpo_sequence_mean_of_token_means():
    x = _inputs([[-1.0, -2.0, -3.0], [-1.0, -1.0, -1.0]], [1.0, -1.0], [[1, 1, 0], [1, 0, 0]])
    cfg = get_objective("grpo", kl_beta=0.0)
    loss, _ = policy_loss(cfg, **x)
    assert loss.item() == pytest.approx(((-1 - 1) / 2 + 1 / 1) / 2)  # 0, unlike justrl's −1/3


def test_grpo_kl_term():
    logps = [[-1.0, -2.0], [-0.5, -0.5]]
    ref = torch.tensor([[-1.5, -2.0], [-0.5, 0.0]])
    x = _inputs(logps, [0.0, 0.0], [[1, 1], [1, 0]])  # Â = 0: only the KL term remains
    loss, m = policy_loss(METHODS["grpo"], ref_logps=ref, **x)
    def k3(d):
        return math.exp(d) - d - 1
    seq0 = (k3(-0.5) + k3(0.0)) / 2
    seq1 = k3(0.0)
    assert loss.item() == pytest.approx(0.04 * (seq0 + seq1) / 2, rel=1e-6)
    assert m["kl_mean"] == pytest.approx((k3(-0.5) + 0 + 0) / 3, rel=1e-6)


def test_grpo_kl_without_reference_is_an_error():
    x = _inputs([[-1.0]], [1.0], [[1]])
    with pytest.raises(ValueError, match="ref_logps"):
        policy_loss(METHODS["grpo"], **x)


def test_grpo_rejects_token_normalizer():
    x = _inputs([[-1.0]], [1.0], [[1]])
    with pytest.raises(ValueError, match="token_normalizer"):
        policy_loss(get_objective("grpo", kl_beta=0.0), token_normalizer=4, **x)


def test_entropy20_keeps_top_fifth():
    ent = [[0.1 * (i + 1) for i in range(10)]]  # 0.1 … 1.0; quantile(0.8) = 0.8 + 0.2·0.1 = 0.82
    adv = [1.0]
    x = _inputs([[-1.0] * 10], adv, [[1] * 10], entropies=ent)
    loss, m = policy_loss(METHODS["entropy20"], **x)
    assert m["kept_fraction"] == pytest.approx(0.2)
    assert loss.item() == pytest.approx(-1.0)  # mean over the 2 kept tokens of −Â
    loss.backward()
    g = x["logps"].grad[0]
    assert torch.all(g[:8] == 0) and torch.all(g[8:] != 0)


def test_stapo_hand_computed():
    # One positive response: 5 rare candidates (p = e^-8 ≈ 3.4e-4 < 0.002) with H 0.1…0.5, 3 common tokens.
    # τ_h = quantile([.1,.2,.3,.4,.5], .75) = 0.4 → 3 silenced; 5 tokens kept. A negative response: 2 rare tokens,
    # never candidates.
    rare, common = -8.0, -0.1
    logps = [[rare] * 5 + [common] * 3, [rare, rare] + [common] * 6]
    ent = [[0.1, 0.2, 0.3, 0.4, 0.5, 0.05, 0.05, 0.05], [0.01] * 8]
    adv = [1.0, -0.5]
    x = _inputs(logps, adv, [[1] * 8, [1] * 8], entropies=ent)
    loss, m = policy_loss(METHODS["stapo"], **x)
    # kept: 5 tokens of response 0 (ℓ = −1 each), 8 of response 1 (ℓ = +0.5 each): (−5 + 4) / 13
    assert loss.item() == pytest.approx((-5 + 4) / 13)
    assert m["silenced_fraction"] == pytest.approx(3 / 16)
    assert m["candidate_fraction"] == pytest.approx(5 / 16)
    assert m["kept_fraction"] == pytest.approx(13 / 16)
    loss.backward()
    g = x["logps"].grad
    assert torch.all(g[0, :3] == 0)
    assert torch.all(g[0, 3:] != 0) and torch.all(g[1] != 0)


def test_stapo_denominator_excludes_silenced_tokens():
    torch.manual_seed(0)
    x = _random_batch(B=6, T=40, rare_fraction=0.3)
    loss_s, m = policy_loss(METHODS["stapo"], **x)
    sil = silence_mask(
        logps=x["logps"], entropies=x["entropies"], advantages=x["advantages"],
        completion_mask=x["completion_mask"], tau_p=0.002, q=0.75,
    )
    assert sil.sum() > 0
    kept = x["completion_mask"].bool() & ~sil
    ratio = torch.exp(x["logps"] - x["old_logps"])
    adv = x["advantages"].unsqueeze(-1)
    ell = -torch.minimum(ratio * adv, ratio.clamp(0.8, 1.28) * adv)
    expected = ell[kept].sum() / kept.sum()
    assert loss_s.item() == pytest.approx(expected.item(), rel=1e-6)
    assert loss_s.item() != pytest.approx((ell[x["completion_mask"].bool()].sum() / kept.sum()).item())


def _random_batch(B, T, rare_fraction=0.2, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    probs = torch.rand(B, T, generator=g) * 0.9 + 0.05
    rare = torch.rand(B, T, generator=g) < rare_fraction
    probs = torch.where(rare, torch.rand(B, T, generator=g) * 0.002, probs)
    logps = probs.log()
    old = logps + 0.2 * torch.randn(B, T, generator=g)
    ent = torch.rand(B, T, generator=g) * 3
    lengths = torch.randint(T // 2, T + 1, (B,), generator=g)
    mask = (torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)).int()
    adv = torch.randn(B, generator=g)
    adv[0], adv[1] = 1.0, -1.0  # at least one of each sign
    return dict(
        logps=logps.to(dtype).requires_grad_(True), old_logps=old.to(dtype), advantages=adv.to(dtype),
        entropies=ent.to(dtype), completion_mask=mask,
    )


@pytest.mark.parametrize("method", sorted(METHODS))
def test_masked_tokens_get_exactly_zero_gradient(method):
    x = _random_batch(B=5, T=30, rare_fraction=0.3, seed=1)
    ref = x["logps"].detach() + 0.1
    loss, _ = policy_loss(METHODS[method], ref_logps=ref if method == "grpo" else None, **x)
    loss.backward()
    g = x["logps"].grad
    m = x["completion_mask"].bool()
    assert torch.all(g[~m] == 0)
    if method == "stapo":
        sil = silence_mask(logps=x["logps"], entropies=x["entropies"], advantages=x["advantages"],
                           completion_mask=m, tau_p=0.002, q=0.75)
        assert sil.any() and torch.all(g[sil] == 0)
    if method == "entropy20":
        kept = high_entropy_mask(entropies=x["entropies"], completion_mask=m, ratio=0.2)
        assert torch.all(g[m & ~kept] == 0)
        ratio = torch.exp(x["logps"] - x["old_logps"]).detach()
        in_region = (ratio > 0.8) & (ratio < 1.28)  # outside it, the clipped branch has zero gradient
        assert torch.all(g[kept & in_region] != 0) and (kept & in_region).sum() > 5


def test_nan_in_padding_does_not_leak():
    x = _random_batch(B=2, T=6, seed=3)
    with torch.no_grad():
        x["logps"][:, -1] = float("nan")
        x["entropies"][:, -1] = float("nan")
    x["completion_mask"][:, -1] = 0
    for method in ("justrl", "stapo", "entropy20"):
        x["logps"].grad = None
        loss, m = policy_loss(METHODS[method], **x)
        loss.backward()
        assert torch.isfinite(loss) and math.isfinite(m["entropy_mean"])
        assert torch.all(x["logps"].grad[:, -1] == 0)


# ------------------------------------------------------------------------------------------ edge cases


def test_no_candidates_means_nothing_silenced():
    x = _inputs([[-0.1, -0.2], [-0.1, -0.3]], [1.0, -1.0], [[1, 1], [1, 1]])
    loss_s, m = policy_loss(METHODS["stapo"], **x)
    loss_j, _ = policy_loss(METHODS["justrl"], **x)
    assert m["candidate_fraction"] == 0 and m["silenced_fraction"] == 0
    assert loss_s.item() == loss_j.item()


def test_single_candidate_is_not_silenced():
    x = _inputs([[-9.0, -0.1]], [1.0], [[1, 1]], entropies=[[0.01, 2.0]])
    _, m = policy_loss(METHODS["stapo"], **x)
    assert m["candidate_fraction"] == 0.5 and m["silenced_fraction"] == 0.0


def test_ties_at_the_quantile():
    # All candidates share one entropy: τ_h equals it and H < τ_h is false for all → none silenced.
    x = _inputs([[-9.0] * 6], [1.0], [[1] * 6], entropies=[[0.3] * 6])
    _, m = policy_loss(METHODS["stapo"], **x)
    assert m["candidate_fraction"] == 1.0 and m["silenced_fraction"] == 0.0
    # 20-Entropy keeps every tied token (≥).
    _, m = policy_loss(METHODS["entropy20"], **x)
    assert m["kept_fraction"] == 1.0


def test_all_tokens_silenced_gives_finite_zero_loss(monkeypatch):
    # Within one process the highest-entropy candidate always survives (H < τ_h is strict), so every token of a
    # rank can be silenced only when other ranks contribute higher-entropy candidates: simulate that gather.
    import stapo.losses.masks as obj

    monkeypatch.setattr(obj, "_gather_across_ranks", lambda v: torch.cat([v, torch.full((20,), 5.0)]))
    x = _inputs([[-9.0, -9.0, -9.0, -0.1]], [1.0], [[1, 1, 1, 0]], entropies=[[0.1, 0.2, 0.3, 0.0]])
    loss, m = policy_loss(METHODS["stapo"], **x)
    assert m["silenced_fraction"] == 1.0 and m["kept_fraction"] == 0.0
    assert loss.item() == 0.0 and loss.grad_fn is not None
    loss.backward()
    assert torch.all(x["logps"].grad == 0)


def test_all_masked_and_empty_batches():
    for B, T in ((2, 3), (0, 4), (3, 0)):
        x = _random_batch(B=max(B, 2), T=max(T, 2))
        x = {k: (v[:B, :T] if v.dim() == 2 else v[:B]) for k, v in x.items()}
        x["logps"] = x["logps"].detach().requires_grad_(True)
        x["completion_mask"] = torch.zeros_like(x["completion_mask"])
        for method, cfg in METHODS.items():
            ref = x["logps"].detach() if method == "grpo" else None
            loss, m = policy_loss(cfg, ref_logps=ref, **x)
            assert loss.item() == 0.0 and loss.grad_fn is not None, (method, B, T)
            loss.backward()
            assert m["kept_fraction"] == 0.0


def test_batch_of_one():
    x = _random_batch(B=2, T=50, rare_fraction=0.5, seed=4)
    x = {k: v[:1] for k, v in x.items()}
    x["logps"] = x["logps"].detach().requires_grad_(True)
    for cfg in METHODS.values():
        loss, _ = policy_loss(cfg, ref_logps=x["logps"].detach(), **x)
        assert torch.isfinite(loss)


def test_bf16_inputs():
    x = _random_batch(B=4, T=20, rare_fraction=0.3, seed=5, dtype=torch.bfloat16)
    for method, cfg in METHODS.items():
        x["logps"].grad = None
        loss, m = policy_loss(cfg, ref_logps=x["logps"].detach() if method == "grpo" else None, **x)
        loss.backward()
        assert loss.dtype == torch.float32 and torch.isfinite(loss)
        assert x["logps"].grad.dtype == torch.bfloat16 and torch.isfinite(x["logps"].grad.float()).all()


def test_token_normalizer_splits_a_step_into_micro_batches():
    # Two micro-batches normalised by the step's kept-token count sum to the loss of the joint batch (justrl).
    x = _random_batch(B=6, T=25, seed=6)
    full, _ = policy_loss(METHODS["justrl"], **x)
    n_kept = x["completion_mask"].sum()
    parts = []
    for sl in (slice(0, 2), slice(2, 6)):
        part = {k: v[sl] for k, v in x.items()}
        parts.append(policy_loss(METHODS["justrl"], token_normalizer=n_kept, **part)[0])
    assert (parts[0] + parts[1]).item() == pytest.approx(full.item(), rel=1e-6)
    # stapo: the normaliser replaces Σ kept
    loss, m = policy_loss(METHODS["stapo"], **x)
    loss7, _ = policy_loss(METHODS["stapo"], token_normalizer=7.0, **x)
    n_kept_stapo = round(m["kept_fraction"] * float(x["completion_mask"].sum()))
    assert loss7.item() * 7.0 == pytest.approx(loss.item() * n_kept_stapo, rel=1e-5)


def test_entropy_mean_is_over_all_completion_tokens():
    x = _random_batch(B=3, T=10, seed=7)
    m = x["completion_mask"].bool()
    expected = x["entropies"][m].mean().item()
    for cfg in METHODS.values():
        _, metrics = policy_loss(cfg, ref_logps=x["logps"].detach(), **x)
        assert metrics["entropy_mean"] == pytest.approx(expected, rel=1e-6)


# --------------------------------------------------------------------------------- masks vs definitions


def test_quantile_matches_torch():
    g = torch.Generator().manual_seed(0)
    for n in (1, 2, 7, 100):
        v = torch.rand(n, generator=g)
        for q in (0.0, 0.2, 0.75, 0.8, 1.0):
            assert quantile(v, q).item() == pytest.approx(torch.quantile(v, q).item(), abs=1e-7)


def _trl_high_entropy_mask(entropies, mask, threshold):
    """TRL 1.16 GRPOTrainer.get_high_entropy_mask, called unbound with a stub accelerator (single process)."""
    from types import SimpleNamespace

    from trl import GRPOTrainer

    stub = SimpleNamespace(accelerator=SimpleNamespace(
        gather=lambda t: t, pad_across_processes=lambda t, **kw: t, num_processes=1))
    return GRPOTrainer.get_high_entropy_mask(stub, entropies, mask, threshold)


def test_high_entropy_mask_equals_trl():
    g = torch.Generator().manual_seed(0)
    for seed in range(5):
        ent = torch.rand(4, 33, generator=g) * 2
        mask = (torch.rand(4, 33, generator=g) > 0.2).int()
        ours = high_entropy_mask(entropies=ent, completion_mask=mask, ratio=0.2)
        theirs = _trl_high_entropy_mask(ent, mask, 1 - 0.2)  # TRL passes 1 - top_entropy_quantile
        assert torch.equal(ours, theirs.bool() & mask.bool()), seed


def test_silence_mask_definition_random():
    x = _random_batch(B=8, T=64, rare_fraction=0.25, seed=9)
    m = x["completion_mask"].bool()
    sil = silence_mask(logps=x["logps"], entropies=x["entropies"], advantages=x["advantages"],
                       completion_mask=m, tau_p=0.002, q=0.75)
    cand = m & (x["advantages"] > 0).unsqueeze(-1) & (x["logps"].detach().exp() < 0.002)
    tau_h = torch.quantile(x["entropies"][cand], 0.75)
    assert torch.equal(sil, cand & (x["entropies"] < tau_h))
    # about a quarter of candidates fall under their 0.75-quantile… minus the strictness
    assert 0.70 <= sil.sum().item() / cand.sum().item() <= 0.76


# ----------------------------------------------------------------------------------------- distributed


def _dist_worker(rank, world, port, path):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    x = _random_batch(B=8, T=40, rare_fraction=0.3, seed=11)
    local = {k: v[rank * 4 : (rank + 1) * 4] for k, v in x.items()}
    sil = silence_mask(logps=local["logps"], entropies=local["entropies"], advantages=local["advantages"],
                       completion_mask=local["completion_mask"], tau_p=0.002, q=0.75)
    kept = high_entropy_mask(entropies=local["entropies"], completion_mask=local["completion_mask"], ratio=0.2)
    tensors = {k: local[k] for k in ("logps", "entropies", "advantages", "completion_mask")}
    local_scope = {m: kept_mask(_local_topk(m), **tensors) for m in ("entropy20", "stapo")}
    torch.save({"sil": sil, "kept": kept, "local_scope": local_scope}, f"{path}/rank{rank}.pt")
    dist.destroy_process_group()


def test_quantiles_are_global_under_distributed(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_dist_worker, args=(2, port, str(tmp_path)), nprocs=2, join=True)
    parts = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    x = _random_batch(B=8, T=40, rare_fraction=0.3, seed=11)
    sil = silence_mask(logps=x["logps"], entropies=x["entropies"], advantages=x["advantages"],
                       completion_mask=x["completion_mask"], tau_p=0.002, q=0.75)
    kept = high_entropy_mask(entropies=x["entropies"], completion_mask=x["completion_mask"], ratio=0.2)
    assert torch.equal(torch.cat([p["sil"] for p in parts]), sil)
    assert torch.equal(torch.cat([p["kept"] for p in parts]), kept)
    # and the per-rank local quantile would differ: the test can tell the two scopes apart
    local = silence_mask(logps=x["logps"][:4], entropies=x["entropies"][:4], advantages=x["advantages"][:4],
                         completion_mask=x["completion_mask"][:4], tau_p=0.002, q=0.75)
    local_k = high_entropy_mask(entropies=x["entropies"][:4], completion_mask=x["completion_mask"][:4], ratio=0.2)
    assert not (torch.equal(local, sil[:4]) and torch.equal(local_k, kept[:4]))
    # "micro_batch_local_topk": each rank's masks are its own half's alone (no gather), unlike the above
    for r, part in enumerate(parts):
        half = {k: x[k][r * 4:(r + 1) * 4] for k in ("logps", "entropies", "advantages", "completion_mask")}
        for method in ("entropy20", "stapo"):
            alone = kept_mask(_local_topk(method), **half)
            assert all(torch.equal(a, b) for a, b in zip(part["local_scope"][method], alone)), (r, method)
    assert not torch.equal(parts[0]["local_scope"]["entropy20"][0], kept[:4])
    assert not torch.equal(parts[0]["local_scope"]["stapo"][1], sil[:4])


# ------------------------------------------------------------------------------------- S2T ablations


def _masks(x, variant, seed=0):
    common = dict(logps=x["logps"], entropies=x["entropies"], advantages=x["advantages"],
                  completion_mask=x["completion_mask"], tau_p=0.002, q=0.75)
    s2t = silence_mask(**common)
    abl = ablation_silence_mask(variant, generator=torch.Generator().manual_seed(seed), **common)
    cand = candidate_mask(logps=x["logps"], advantages=x["advantages"], completion_mask=x["completion_mask"],
                          tau_p=0.002)
    return s2t, abl, cand


def test_ablation_high_silences_the_high_entropy_end_same_size():
    x = _random_batch(B=8, T=64, rare_fraction=0.25, seed=12)
    s2t, high, cand = _masks(x, "high")
    assert high.sum() == s2t.sum() > 10  # continuous entropies: both quantile cuts leave 75 % of candidates
    assert not (high & ~cand).any()
    assert x["entropies"][high].mean() > x["entropies"][s2t].mean()


def test_ablation_random_same_size_seeded():
    x = _random_batch(B=8, T=64, rare_fraction=0.25, seed=13)
    s2t, r1, cand = _masks(x, "random", seed=1)
    _, r1b, _ = _masks(x, "random", seed=1)
    _, r2, _ = _masks(x, "random", seed=2)
    assert r1.sum() == s2t.sum() and not (r1 & ~cand).any()
    assert torch.equal(r1, r1b) and not torch.equal(r1, r2)


def test_ablation_full_silences_every_candidate():
    x = _random_batch(B=8, T=64, rare_fraction=0.25, seed=14)
    _, full, cand = _masks(x, "full")
    assert torch.equal(full, cand)
    _, m = policy_loss(METHODS["stapo_full"], **x)
    assert m["silenced_fraction"] == pytest.approx(m["candidate_fraction"])


@pytest.mark.parametrize("method", ["stapo_high", "stapo_random", "stapo_full"])
def test_ablation_losses_drop_silenced_tokens(method):
    x = _random_batch(B=6, T=40, rare_fraction=0.3, seed=15)
    loss, m = policy_loss(METHODS[method], **x)
    assert 0 < m["silenced_fraction"] <= m["candidate_fraction"]
    assert m["kept_fraction"] == pytest.approx(1 - m["silenced_fraction"])
    loss.backward()
    assert (x["logps"].grad == 0).sum() >= round(m["silenced_fraction"] * x["completion_mask"].sum().item())


# ------------------------------------------------------------------------------ mini-batch threshold scope


def _split(x, sizes):
    out, start = [], 0
    for n in sizes:
        out.append({k: (v[start:start + n] if v.dim() else v) for k, v in x.items()})
        start += n
    return out


@pytest.mark.parametrize("method", ["stapo", "entropy20", "stapo_high", "stapo_random"])
def test_mini_batch_thresholds_make_micro_batches_equal_one_batch(method):
    """Thresholds fixed per optimiser step: the masks of 4 micro-batches equal the mask of the whole mini-batch
    in one call; per-micro-batch quantiles (the old scope) give a different mask."""
    cfg = METHODS[method]
    x = _random_batch(B=16, T=48, rare_fraction=0.3, seed=21)
    whole_kept, _ = kept_mask(cfg, logps=x["logps"], entropies=x["entropies"], advantages=x["advantages"],
                              completion_mask=x["completion_mask"])
    t = step_thresholds(cfg, logps=x["logps"], entropies=x["entropies"], advantages=x["advantages"],
                        completion_mask=x["completion_mask"])
    parts = _split(x, [4, 4, 4, 4])
    per_scope = [kept_mask(cfg, logps=p["logps"], entropies=p["entropies"], advantages=p["advantages"],
                           completion_mask=p["completion_mask"], thresholds=t)[0] for p in parts]
    micro = [kept_mask(cfg, logps=p["logps"], entropies=p["entropies"], advantages=p["advantages"],
                       completion_mask=p["completion_mask"])[0] for p in parts]
    if method == "stapo_random":  # a random subset: compare sizes per micro-batch
        sizes = [int((~k & p["completion_mask"].bool()).sum()) for k, p in zip(per_scope, parts)]
        s2t = [silence_mask(logps=p["logps"], entropies=p["entropies"], advantages=p["advantages"],
                            completion_mask=p["completion_mask"], tau_p=cfg.tau_p, q=cfg.entropy_quantile,
                            tau_h=t.tau_h).sum().item() for p in parts]
        assert sizes == s2t
        return
    assert torch.equal(torch.cat(per_scope), whole_kept)
    assert not torch.equal(torch.cat(micro), whole_kept)


def test_step_thresholds_values_and_empty_pools():
    x = _inputs([[math.log(1e-4)] * 4 + [-0.1] * 2], [1.0], [[1] * 6], entropies=[[0.1, 0.2, 0.3, 0.4, 5.0, 6.0]])
    t = step_thresholds(METHODS["stapo"], **{k: v for k, v in x.items() if k != "old_logps"})
    assert t.tau_h == pytest.approx(0.325) and t.tau_h_high == pytest.approx(0.175)  # candidates: the 4 rare
    assert math.isnan(t.entropy_cut)
    e = step_thresholds(METHODS["entropy20"], **{k: v for k, v in x.items() if k != "old_logps"})
    assert e.entropy_cut == pytest.approx(float(torch.quantile(torch.tensor([.1, .2, .3, .4, 5., 6.]), 0.8)))
    # no candidates (negative advantage): τ_h is NaN and nothing is silenced
    y = _inputs([[math.log(1e-4)] * 3], [-1.0], [[1] * 3], entropies=[[0.1, 0.2, 0.3]])
    t = step_thresholds(METHODS["stapo"], **{k: v for k, v in y.items() if k != "old_logps"})
    assert math.isnan(t.tau_h)
    _, m = policy_loss(METHODS["stapo"], thresholds=t, **y)
    assert m["silenced_fraction"] == 0.0 and m["kept_fraction"] == 1.0
    # a precomputed τ_h silences candidates in a micro-batch that holds ONE candidate (per-call scope cannot)
    z = _inputs([[math.log(1e-4), -0.1]], [1.0], [[1, 1]], entropies=[[0.2, 1.0]])
    _, m_call = policy_loss(METHODS["stapo"], **z)
    _, m_step = policy_loss(METHODS["stapo"], thresholds=Thresholds(tau_h=0.5), **z)
    assert m_call["silenced_fraction"] == 0.0 and m_step["silenced_fraction"] == 0.5


# ------------------------------------------------------------------- the contract of every declared method


class _ReadProbe:
    """Thresholds that record which fields a token mask reads."""

    def __init__(self, real: Thresholds):
        self._real, self.read = real, set()

    def __getattr__(self, name):
        self.read.add(name)
        return getattr(self._real, name)


def _gradient_contract(cfg, decl, x, real, *, live_required):
    """Masked tokens and the loss's own detached ones get exactly zero gradient; kept ones inside its clip region
    (read from its ratio) do not. Returns (metrics, kept)."""
    m = x["completion_mask"].bool()
    tensors = {k: x[k] for k in ("logps", "entropies", "advantages", "completion_mask")}
    ref = x["logps"].detach() + 0.1 if cfg.kl_beta > 0 else None
    loss, metrics = policy_loss(cfg, ref_logps=ref, thresholds=real if decl.thresholds else None, **x)
    loss.backward()
    g = x["logps"].grad
    kept, _ = kept_mask(cfg, thresholds=real if decl.thresholds else None, **tensors)
    assert torch.all(g[~kept] == 0)
    own = POLICY_LOSSES[decl.loss](cfg, logps=x["logps"].detach(), old_logps=x["old_logps"],
                                   advantages=x["advantages"], completion_mask=m)
    ratio = own.ratio if decl.loss != "vanilla" else torch.exp(x["logps"] - x["old_logps"]).detach()
    live = kept & (ratio > 1 - cfg.eps_low) & (ratio < 1 + cfg.eps_high) & (x["advantages"] != 0).unsqueeze(-1)
    if own.detached is not None:
        assert torch.all(g[own.detached] == 0)
        live &= ~own.detached
    assert torch.all(g[live] != 0) and (live.any() or not live_required)
    return metrics, kept


@pytest.mark.parametrize("method", list(DECLARED))
def test_every_declared_method_keeps_its_contract(method):
    """Runs over stapo/study/methods.py: a new declaration is checked here without editing this test."""
    decl, cfg = DECLARED[method], get_objective(method)
    assert decl.token_mask in TOKEN_MASKS, f"{method}: token mask {decl.token_mask!r} is not registered"
    assert decl.thresholds is None or decl.thresholds in THRESHOLDS
    assert decl.loss in POLICY_LOSSES, f"{method}: loss {decl.loss!r} is not registered"
    assert decl.label and decl.key == method
    x = _random_batch(B=6, T=24, rare_fraction=0.4, seed=7)
    m = x["completion_mask"].bool()
    tensors = {k: x[k] for k in ("logps", "entropies", "advantages", "completion_mask")}
    # needs-thresholds ⇔ reads them (declared, never inferred)
    real = step_thresholds(cfg, **tensors)
    probe = _ReadProbe(real)
    kept, silenced = TOKEN_MASKS[decl.token_mask](cfg, **{**tensors, "completion_mask": m}, thresholds=probe,
                                                   generator=None)
    assert bool(probe.read) == (decl.thresholds is not None), (method, probe.read)
    assert kept.dtype == silenced.dtype == torch.bool and kept.shape == silenced.shape == m.shape
    assert not (kept & silenced).any() and not (silenced & ~m).any()
    # masked tokens get exactly zero gradient, kept ones (inside the clip region) do not
    metrics, kept = _gradient_contract(cfg, decl, x, real, live_required=decl.loss == "vanilla")
    if decl.loss != "vanilla":  # its own trust region may clip every random ratio (GSPO: 3e-4): also on-policy
        on_policy = {**x, "logps": x["logps"].detach().clone().requires_grad_(True),
                     "old_logps": x["logps"].detach().clone()}
        _gradient_contract(cfg, decl, on_policy, real, live_required=True)
    assert metrics["kept_fraction"] == pytest.approx(float(kept.sum() / m.sum()))
    # finite zero loss with a graph on empty and all-masked batches
    for B, T in ((3, 4), (0, 4), (3, 0)):
        y = {k: (v.detach()[:B, :T] if v.dim() == 2 else v[:B]) for k, v in x.items()}
        y["logps"] = y["logps"].clone().requires_grad_(True)
        y["completion_mask"] = torch.zeros_like(y["completion_mask"])
        loss, _ = policy_loss(cfg, ref_logps=y["logps"].detach() if cfg.kl_beta > 0 else None, **y)
        assert loss.item() == 0.0 and loss.grad_fn is not None, (method, B, T)


def test_a_new_method_is_one_declaration_and_its_mask(monkeypatch):
    """README "Add a method": low-probability isolation (drop positive-advantage tokens with π < 0.1)."""
    import stapo.study.methods
    import stapo.losses.registry as obj
    from stapo.study import names
    from stapo import study

    monkeypatch.setattr(stapo.study.methods, "METHODS", dict(stapo.study.methods.METHODS))
    monkeypatch.setattr(obj, "TOKEN_MASKS", dict(obj.TOKEN_MASKS))
    import stapo.study.objective as objective_module

    monkeypatch.setattr(objective_module, "METHODS", stapo.study.methods.METHODS)

    @obj.register_token_mask("low_prob_positive")
    def low_prob_positive(cfg, *, logps, advantages, completion_mask, **_):
        drop = completion_mask & (advantages > 0).unsqueeze(-1) & (logps.detach().exp() < 0.1)
        return completion_mask & ~drop, drop

    stapo.study.methods.declare("lpi", label="Low-p isolation", token_mask="low_prob_positive")
    parsed = study.parse({"study": "s", "methods": {"lpi": {"objective": "lpi"},
                                                     "lpi_b": {"objective": "lpi", "label": "LPI (b)"}}},
                         required=())
    cfg = parsed.methods["lpi"]
    assert (cfg.token_mask, cfg.uses_thresholds) == ("low_prob_positive", False)
    assert parsed.label("methods", "lpi_b") == "LPI (b)"
    x = _inputs([[math.log(0.05), -0.1], [math.log(0.05), -0.1]], [1.0, -1.0], [[1, 1], [1, 1]])
    loss, metrics = policy_loss(cfg, **x)
    loss.backward()
    assert metrics["silenced_fraction"] == 0.25 and x["logps"].grad[0, 0] == 0 and x["logps"].grad[1, 0] != 0
    assert names.METHODS.get("lpi") is None  # names are derived at import: the study labels a runtime addition


# ------------------------------------------------ named protocols: verl 0.4 aggregation, the 80/20 release's scope


def _local_topk(method: str, **overrides) -> ObjectiveConfig:
    return get_objective(method, loss_agg_mode="token-mean-per-micro-batch", quantile_scope="micro_batch_local_topk",
                         **overrides)


def test_protocol_names_are_in_the_schema_and_validated():
    from stapo import study

    props = study.study_schema()["properties"]["methods"]["additionalProperties"]["properties"]
    assert props["loss_agg_mode"]["enum"] == list(AGG_MODES) == [
        "token-mean", "token-mean-per-micro-batch", "seq-mean-token-mean", "seq-mean-token-sum",
        "seq-mean-token-sum-norm"]
    # a method whose source defines one aggregation (verl's sapo and geo_mean ignore loss_agg_mode) refuses others
    assert METHODS["sapo"].loss_agg_mode == METHODS["geo_mean"].loss_agg_mode == "seq-mean-token-mean"
    with pytest.raises(ValueError, match=r"^loss_agg_mode: geo_mean aggregates as seq-mean-token-mean only"):
        get_objective("geo_mean", loss_agg_mode="token-mean")
    assert props["quantile_scope"]["enum"] == list(SCOPES) == ["mini_batch", "micro_batch", "micro_batch_local_topk"]
    assert (METHODS["stapo"].loss_agg_mode, METHODS["stapo"].quantile_scope) == ("token-mean", "mini_batch")
    # the release's scope normalises per micro-batch: any other aggregation is refused, naming the key
    for agg in ("token-mean", "seq-mean-token-mean"):
        with pytest.raises(ValueError, match=r"^quantile_scope: .*token-mean-per-micro-batch"):
            get_objective("entropy20", loss_agg_mode=agg, quantile_scope="micro_batch_local_topk")
    assert _local_topk("stapo").quantile_scope == "micro_batch_local_topk"
    # its loss is the call's own token-mean: a step normaliser is refused
    x = _inputs([[-1.0]], [1.0], [[1]])
    with pytest.raises(ValueError, match="token_normalizer"):
        policy_loss(get_objective("justrl", loss_agg_mode="token-mean-per-micro-batch"), token_normalizer=4, **x)


def test_token_mean_per_micro_batch_hand_computed():
    """verl 0.4 (JustRL's trainer): Σ_j (B_j / B) · token-mean_j, not the step's global token-mean.

    Ratio 1, so ℓ = −Â per token. Micro-batch 1: A (3 tokens, Â = +1), B (1 token, Â = −1): (−3 + 1) / 4 = −0.5.
    Micro-batch 2: C (1 token, Â = +2), D (1 token, Â = +1): (−2 − 1) / 2 = −1.5. Two sequences each of the rank's
    four: weights 1/2 → −1.0. The global token-mean of the same step: (−2 − 3) / 6 = −5/6.
    """
    cfg = get_objective("justrl", loss_agg_mode="token-mean-per-micro-batch")
    mb1 = _inputs([[-1.0, -1.0, -1.0], [-1.0, 0.0, 0.0]], [1.0, -1.0], [[1, 1, 1], [1, 0, 0]])
    mb2 = _inputs([[-1.0], [-1.0]], [2.0, 1.0], [[1], [1]])
    l1, _ = policy_loss(cfg, **mb1)
    l2, _ = policy_loss(cfg, **mb2)
    assert (l1.item(), l2.item()) == (pytest.approx(-0.5), pytest.approx(-1.5))
    step = l1 * 2 / 4 + l2 * 2 / 4  # what the trainer back-propagates (÷ gradient_accumulation_steps = 2)
    assert step.item() == pytest.approx(-1.0)
    step.backward()
    # d/dlogp of −ρÂ at ρ = 1 is −Â, divided by the micro-batch's 4 (or 2) tokens and weighted 1/2
    torch.testing.assert_close(mb1["logps"].grad, torch.tensor([[-0.125, -0.125, -0.125], [0.125, 0.0, 0.0]]))
    torch.testing.assert_close(mb2["logps"].grad, torch.tensor([[-0.5], [-0.25]]))
    # the default protocol on the same step: one denominator, 6 tokens
    glob = [policy_loss(METHODS["justrl"], token_normalizer=6, **{**mb, "logps": mb["logps"].detach()})[0]
            for mb in (mb1, mb2)]
    assert sum(glob).item() == pytest.approx(-5 / 6)
    # entropy20 with the release's scope: the denominator is the micro-batch's KEPT tokens. n = 4 → k = 1, the
    # highest entropy (A's second token, ℓ = −1); n = 2 → k = 1 (D's, ℓ = −1): −1 · 1/2 + −1 · 1/2 = −1
    e1 = _inputs([[-1.0] * 3, [-1.0, 0.0, 0.0]], [1.0, -1.0], [[1, 1, 1], [1, 0, 0]],
                 entropies=[[0.1, 0.9, 0.2], [0.3, 5.0, 5.0]])
    e2 = _inputs([[-1.0], [-1.0]], [2.0, 1.0], [[1], [1]], entropies=[[0.4], [0.6]])
    (k1, m1), (k2, m2) = (policy_loss(_local_topk("entropy20"), **e) for e in (e1, e2))
    assert (k1.item(), k2.item(), m1["kept_fraction"], m2["kept_fraction"]) == (-1.0, -1.0, 0.25, 0.5)


def test_top_k_count_is_the_release_ceiling():
    """k = max(1, ⌈n·ρ⌉) computed as the release does, int(n·ρ + 0.9999)."""
    assert [top_k_count(n, 0.2) for n in (0, 1, 3, 5, 6, 10, 11)] == [0, 1, 1, 1, 2, 2, 3]
    assert top_k_count(7, 1.0) == 7
    assert top_k_count(20001, 0.00005) == 1  # n·ρ = 1.00005: the release's +0.9999 rounds down (⌈·⌉ would be 2)


def test_local_topk_keeps_exactly_k_tokens_of_the_micro_batch():
    cfg = _local_topk("entropy20")

    def kept(entropies, mask=None, adv=None):
        mask = mask or [[1] * len(row) for row in entropies]
        x = _inputs([[-1.0] * len(r) for r in entropies], adv or [1.0] * len(entropies), mask, entropies=entropies)
        return kept_mask(cfg, **{k: v for k, v in x.items() if k != "old_logps"})[0].int().tolist()

    # n = 5, ρ = 0.2 → k = ⌈1.0⌉ = 1: the 0.9 only
    assert kept([[0.9, 0.1, 0.5, 0.7, 0.3]]) == [[1, 0, 0, 0, 0]]
    # n = 6 over two padded rows (padding's entropy 9.9 never counts) → k = ⌈1.2⌉ = 2: the 0.8 and the 0.6
    assert kept([[0.2, 0.8, 0.4, 9.9], [0.6, 0.1, 0.3, 9.9]], mask=[[1, 1, 1, 0], [1, 1, 1, 0]]) == [
        [0, 1, 0, 0], [1, 0, 0, 0]]
    # ties: exactly k = 1 of the three 0.5s (the earliest), where the quantile cut keeps all three
    assert kept([[0.5, 0.1, 0.5, 0.5, 0.1]]) == [[1, 0, 0, 0, 0]]
    x = _inputs([[-1.0] * 5], [1.0], [[1] * 5], entropies=[[0.5, 0.1, 0.5, 0.5, 0.1]])
    _, m = policy_loss(get_objective("entropy20", quantile_scope="micro_batch"), **x)
    assert m["kept_fraction"] == pytest.approx(3 / 5)
    # its loss: advantages +1 and −0.5 at ratio 1, kept (0, 1) ℓ = −1 and (1, 0) ℓ = +0.5 → (−1 + 0.5) / 2
    y = _inputs([[-1.0] * 4] * 2, [1.0, -0.5], [[1, 1, 1, 0], [1, 1, 1, 0]],
                entropies=[[0.2, 0.8, 0.4, 9.9], [0.6, 0.1, 0.3, 9.9]])
    loss, metrics = policy_loss(cfg, **y)
    assert loss.item() == pytest.approx(-0.25) and metrics["kept_fraction"] == pytest.approx(2 / 6)
    loss.backward()
    torch.testing.assert_close(y["logps"].grad, torch.tensor([[0.0, -0.5, 0.0, 0.0], [0.25, 0.0, 0.0, 0.0]]))


def test_local_scope_never_gathers_across_ranks(monkeypatch):
    """A fake second rank holding high-entropy tokens and low-entropy candidates moves the gathered
    ("micro_batch") thresholds; the release's local scope never calls the gather and keeps its own."""
    import stapo.losses.masks as obj

    calls, other = [], {"H": 10.0}  # the other rank's 20 values

    def other_rank_too(values):
        calls.append(values.numel())
        return torch.cat([values, torch.full((20,), other["H"])])

    monkeypatch.setattr(obj, "_gather_across_ranks", other_rank_too)
    # entropy20: n = 5 → k = 1 locally; gathered with 20 tokens of entropy 10 the cut is 10: nothing of ours
    x = _inputs([[-1.0] * 5], [1.0], [[1] * 5], entropies=[[0.9, 0.1, 0.5, 0.7, 0.3]])
    t = {k: v for k, v in x.items() if k != "old_logps"}
    assert kept_mask(_local_topk("entropy20"), **t)[0].int().tolist() == [[1, 0, 0, 0, 0]] and calls == []
    assert kept_mask(get_objective("entropy20", quantile_scope="micro_batch"), **t)[0].sum() == 0 and calls == [5]
    # stapo: 5 local candidates (p = e^-8 < τ_p, Â > 0) with H 0.1 … 0.5 → local τ_h = 0.4: 3 silenced. Gathered
    # with 20 candidates of H 0.01 the τ_h is 0.01: none silenced.
    calls.clear()
    other["H"] = 0.01
    s = _inputs([[-8.0] * 5], [1.0], [[1] * 5], entropies=[[0.1, 0.2, 0.3, 0.4, 0.5]])
    t = {k: v for k, v in s.items() if k != "old_logps"}
    _, silenced = kept_mask(_local_topk("stapo"), **t)
    assert silenced.int().tolist() == [[1, 1, 1, 0, 0]] and calls == []
    _, silenced = kept_mask(get_objective("stapo", quantile_scope="micro_batch"), **t)
    assert silenced.sum() == 0 and calls == [5]


# ----------------------------------------------- aggregation and scope: enums that carry their behaviour


def test_aggregation_and_scope_are_enums_with_their_behaviour():
    """YAML strings parse into the enums; the trainer, objectives and diagnostics read their attributes; what a run
    records (json, yaml.safe_dump) is the plain string."""
    import json

    import yaml

    from stapo.study.objective import AggMode, QuantileScope

    cfg = _local_topk("entropy20")
    assert cfg.loss_agg_mode is AggMode.TOKEN_MEAN_PER_MICRO_BATCH
    assert cfg.quantile_scope is QuantileScope("micro_batch_local_topk")
    assert cfg.loss_agg_mode == "token-mean-per-micro-batch" and f"{cfg.loss_agg_mode}" == "token-mean-per-micro-batch"
    assert [m.trl_loss_type for m in AggMode] == ["dapo", "bnpo", "grpo", "luspo", "dr_grpo"]
    assert [aggregation(m).step_normaliser for m in AggMode] == [True, False, False, False, False]
    assert [m.params for m in AggMode] == [(), (), (), (), ("loss_scale_factor",)]
    assert [s.per_step for s in QuantileScope] == [True, False, False]
    assert [s.gathered for s in QuantileScope] == [True, True, False]
    assert list(AGG_MODES) == [m.value for m in AggMode] and list(SCOPES) == [s.value for s in QuantileScope]
    recorded = cfg.as_dict()
    assert type(recorded["loss_agg_mode"]) is str and type(recorded["quantile_scope"]) is str
    assert yaml.safe_load(yaml.safe_dump(recorded)) == recorded
    assert json.loads(json.dumps({"m": cfg.loss_agg_mode})) == {"m": "token-mean-per-micro-batch"}
    # a loss's own parameters are recorded for its method alone: the others' records stay as they were
    assert "clip_cov_ratio" not in METHODS["stapo"].as_dict() and "clip_cov_ratio" in METHODS["clip_cov"].as_dict()
    assert "ppo_kl_coef" in METHODS["kl_cov"].as_dict() and "kl_cov_ratio" not in METHODS["clip_cov"].as_dict()
    # an aggregation's own parameter likewise: Dr. GRPO's horizon only where seq-mean-token-sum-norm reads it
    assert "loss_scale_factor" in METHODS["dr_grpo"].as_dict() and "loss_scale_factor" not in METHODS["stapo"].as_dict()
    assert "loss_scale_factor" in get_objective("stapo", loss_agg_mode="seq-mean-token-sum-norm").as_dict()
    assert METHODS["dr_grpo"].with_horizon(48).loss_scale_factor == 48 and METHODS["stapo"].with_horizon(48) is METHODS[
        "stapo"]


def test_every_objective_field_documents_itself():
    """TRL style: each field's documentation is its metadata["help"] (the schema generator reads it)."""
    import dataclasses

    for f in dataclasses.fields(ObjectiveConfig):
        assert len(f.metadata.get("help", "")) > 20, f.name


# --------------------------------------- clamps, caps, ties and plumbing (issue 37: what mutation testing found)
# Every expected value below is written by hand from the definitions (docstrings of stapo/losses/masks.py, policy.py).


def test_log_ratio_clamp_binds_below_minus_20():
    """log ρ = −30 is clamped to −20 (zero gradient there); log ρ = −15 is not. Â = +1, ε_low = 0.2: the min picks
    the unclipped −ρ for both, so ℓ = (−e^−20 − e^−15) / 2 and ∂ℓ/∂logp = (0, −e^−15 / 2)."""
    x = _inputs([[-30.0, -15.0]], [1.0], [[1, 1]], old_logps=[[0.0, 0.0]])
    loss, m = policy_loss(METHODS["justrl"], **x)
    assert loss.item() == pytest.approx(-(math.exp(-20) + math.exp(-15)) / 2, rel=1e-5)
    assert m["ratio_mean"] == pytest.approx((math.exp(-20) + math.exp(-15)) / 2, rel=1e-5)
    loss.backward()
    assert x["logps"].grad[0, 0].item() == 0.0
    assert x["logps"].grad[0, 1].item() == pytest.approx(-math.exp(-15) / 2, rel=1e-5)


def test_clip_and_dual_clip_boundaries_and_fractions():
    """One token per row, ratios exact in fp32 (e^ln 2 = 2 etc.); ε_low = 0.5, ε_high = 1, c = 2, so the bounds are
    0.5, 2 and the cap 2|Â|. A ratio AT a bound is not clipped, a loss AT the cap is not capped (strict, verl's
    torch.gt); Â = 0 is neither side. Hand-computed ℓ per row (ρ, Â → ℓ):
      2, −1 → 2 (at the cap)   0.5, −1 → 0.5 (at the low bound)   2, +1 → −2 (at the high bound)
      0.25, 0 → 0   4, 0 → 0   0.25, +0.5 → −0.125 (low side, Â > 0)   4, −1 → 2 (capped: dual)
      0.25, −1 → 0.5 (low clip)   4, +1 → −2 (high clip)
    Σ ℓ = 0.875 over 9 tokens; one low, one high, one dual clip."""
    ratios = [2.0, 0.5, 2.0, 0.25, 4.0, 0.25, 4.0, 0.25, 4.0]
    adv = [-1.0, -1.0, 1.0, 0.0, 0.0, 0.5, -1.0, -1.0, 1.0]
    x = _inputs([[math.log(r)] for r in ratios], adv, [[1]] * 9, old_logps=[[0.0]] * 9)
    cfg = get_objective("justrl", eps_low=0.5, eps_high=1.0, clip_ratio_c=2.0)
    loss, m = policy_loss(cfg, **x)
    assert loss.item() == pytest.approx(0.875 / 9, rel=1e-6)
    assert (m["clip_fraction_low"], m["clip_fraction_high"]) == (pytest.approx(1 / 9), pytest.approx(1 / 9))
    assert m["clip_fraction"] == pytest.approx(2 / 9) and m["clip_fraction_dual"] == pytest.approx(1 / 9)
    assert m["kl_mean"] == 0.0 and m["ratio_mean"] == pytest.approx(sum(ratios) / 9, rel=1e-6)


@pytest.mark.parametrize("kl_clip, delta, k3", [
    (100.0, -30.0, math.exp(-20) + 20 - 1),  # δ clamped at −20: 19 (unclamped it would be 29)
    (1e12, 25.0, math.exp(20) - 20 - 1),  # δ clamped at +20: 4.85e8 (unclamped 7.2e10)
    (1e12, -15.0, math.exp(-15) + 15 - 1),  # inside ±20: no clamp
])
def test_k3_log_ratio_clamp_each_side(kl_clip, delta, k3):
    """verl low_var_kl clamps δ = log π_ref − log π to ±20 before k3 = e^δ − δ − 1; with a kl_clip above k3 the δ
    clamp alone decides (zero gradient where it binds)."""
    x = _inputs([[-5.0]], [0.0], [[1]])
    cfg = get_objective("grpo", kl_clip=kl_clip)
    loss, m = policy_loss(cfg, ref_logps=torch.tensor([[-5.0 + delta]]), **x)
    assert m["kl_mean"] == pytest.approx(k3, rel=1e-5) and loss.item() == pytest.approx(0.04 * k3, rel=1e-5)
    loss.backward()
    assert (x["logps"].grad.item() == 0.0) == (abs(delta) > 20)


def test_without_kl_weight_the_reference_never_reaches_the_loss():
    """kl_beta = 0 with ref_logps given (reported as kl_mean only): a NaN in the reference log-probs shows in kl_mean
    and nowhere in the loss or its gradient. Ratio 1, Â = +1, −1: ℓ = (−1 + 1) / 2 = 0, ∂ℓ/∂logp = (−1/2, +1/2)."""
    x = _inputs([[-1.0], [-2.0]], [1.0, -1.0], [[1], [1]])
    loss, m = policy_loss(METHODS["justrl"], ref_logps=torch.tensor([[float("nan")], [-2.0]]), **x)
    loss.backward()
    assert loss.item() == 0.0 and math.isnan(m["kl_mean"])
    assert x["logps"].grad.flatten().tolist() == [-0.5, 0.5]


def test_candidates_need_a_positive_advantage_and_a_probability_strictly_below_tau_p():
    """τ_p = 0.5: p = 0.5 exactly is not a candidate (strict <), p = 0.25 is; Â = 0 makes no candidates."""
    logps = torch.tensor([[math.log(0.5), math.log(0.25), 0.0], [math.log(0.25)] * 3])
    cand = candidate_mask(logps=logps, advantages=torch.tensor([1.0, 0.0]), completion_mask=torch.tensor(
        [[1, 1, 0], [1, 1, 1]]), tau_p=0.5)
    assert cand.tolist() == [[False, True, False], [False, False, False]]


def _ablation_batch() -> dict:
    """Six S2T candidates (p = 1e-4, Â > 0) with H 0.1 … 0.6 at flat positions 0-5 of a [2, 4] batch, one common
    token (H 0.05) and one padding position (H 9). q = 0.75: τ_h = 0.4 + 0.75·0.1 = 0.475, the 0.25-quantile
    0.2 + 0.25·0.1 = 0.225."""
    rare = math.log(1e-4)
    return _inputs([[rare] * 4, [rare, rare, -0.1, rare]], [1.0, 0.5], [[1, 1, 1, 1], [1, 1, 1, 0]],
                   entropies=[[0.1, 0.2, 0.3, 0.4], [0.5, 0.6, 0.05, 9.0]])


def _subset(flat: list[int]) -> list[list[bool]]:
    out = [[False] * 4 for _ in range(2)]
    for i in flat:
        out[i // 4][i % 4] = True
    return out


def _first_of_permutation(seed: int, k: int) -> list[int]:
    """stapo_random's choice transcribed: the first k of randperm over the 6 candidates (flat positions 0-5)."""
    return torch.randperm(6, generator=torch.Generator().manual_seed(seed))[:k].tolist()


def test_ablation_masks_built_at_call_time():
    """The three S2T ablation masks, built by their factory now (the registered ones are built at import, out of the
    tests' reach), on :func:`_ablation_batch` with the call's own thresholds: high silences H > 0.225 (4), random 4
    of the 6 (as many as H < 0.475) chosen by the config's seed, full all 6. Padding is never kept."""
    import stapo.losses.masks as obj

    x = _ablation_batch()
    tensors = {k: x[k] for k in ("logps", "entropies", "advantages")}
    m = x["completion_mask"].bool()
    cfg = get_objective("stapo_random", seed=3)
    want = {"high": [2, 3, 4, 5], "random": _first_of_permutation(3, 4), "full": [0, 1, 2, 3, 4, 5]}
    with torch.random.fork_rng():
        torch.manual_seed(12345)  # a mask that fell back to the global generator would draw another subset
        for variant, flat in want.items():
            mask = obj._ablation(variant)
            assert f"({variant!r})" in mask.__doc__
            kept, silenced = mask(cfg, **tensors, completion_mask=m)
            assert silenced.tolist() == _subset(flat), variant
            assert kept.tolist() == [[not s and bool(v) for s, v in zip(*r)] for r in zip(_subset(flat), m.tolist())]
            assert torch.equal(kept, TOKEN_MASKS[f"s2t_{variant}"](cfg, **tensors, completion_mask=m)[0]), variant


def test_ablation_masks_use_the_given_thresholds_generator_and_candidates():
    """Given step thresholds τ_h = 0.2 and 0.25-quantile 0.5 (both equal to a candidate's H: strict inequalities
    leave that one alone): high silences H > 0.5 (the 0.6 only), random as many as H < 0.2 (one) drawn by the given
    generator (seed 5, not the config's 0); given candidates replace the call's (full silences exactly them)."""
    import stapo.losses.masks as obj

    x = _ablation_batch()
    tensors = {k: x[k] for k in ("logps", "entropies", "advantages")}
    m = x["completion_mask"].bool()
    cfg, t = METHODS["stapo_random"], Thresholds(tau_h=0.2, tau_h_high=0.5)
    kw = dict(**tensors, completion_mask=m, thresholds=t)
    assert obj._ablation("high")(cfg, **kw)[1].tolist() == _subset([5])
    random = obj._ablation("random")(cfg, **kw, generator=torch.Generator().manual_seed(5))[1]
    assert random.tolist() == _subset(_first_of_permutation(5, 1))
    assert ablation_silence_mask("random", **tensors, completion_mask=m, tau_p=0.002, q=0.75, thresholds=t,
                                 generator=torch.Generator().manual_seed(5)).tolist() == random.tolist()
    given = torch.tensor([[False, True, False, False], [False, False, True, False]])
    assert obj._ablation("full")(cfg, **kw, candidates=given)[1].tolist() == given.tolist()
    assert ablation_silence_mask("full", **tensors, completion_mask=m, tau_p=0.002, q=0.75,
                                 candidates=given).tolist() == given.tolist()
    with pytest.raises(ValueError, match=r"^unknown S2T ablation 'half'; expected high, random or full$"):
        ablation_silence_mask("half", **tensors, completion_mask=m, tau_p=0.002, q=0.75)


def test_kept_mask_and_policy_loss_pass_the_generator_on():
    """stapo_random with a caller's generator (seed 5): kept_mask and policy_loss silence the subset that generator
    draws, not the one of the config's seed (0). Step thresholds τ_h = 0.475 (:func:`_ablation_batch`): 4 of 6."""
    x = _ablation_batch()
    t = Thresholds(tau_h=0.475, tau_h_high=0.225)
    want = _subset(_first_of_permutation(5, 4))
    assert want != _subset(_first_of_permutation(0, 4))
    _, silenced = kept_mask(METHODS["stapo_random"], **{k: x[k] for k in ("logps", "entropies", "advantages",
                                                                        "completion_mask")},
                            thresholds=t, generator=torch.Generator().manual_seed(5))
    assert silenced.tolist() == want
    tokens = {}
    policy_loss(METHODS["stapo_random"], thresholds=t, generator=torch.Generator().manual_seed(5), tokens=tokens, **x)
    assert tokens["silenced"].tolist() == want


@pytest.mark.parametrize("method, scope, silenced", [
    ("stapo", "mini_batch", [0, 1, 2]), ("stapo", "micro_batch", [0, 1, 2]), ("stapo_high", "micro_batch", [2, 3, 4]),
    ("stapo_random", "micro_batch", None), ("stapo_full", "mini_batch", [0, 1, 2, 3, 4])])
def test_policy_loss_finds_the_candidates_once_and_reports_its_tokens(monkeypatch, method, scope, silenced):
    """policy_loss computes the S2T candidates once and hands them to the thresholds and the mask (none recomputes
    them), and fills ``tokens``. The batch of test_stapo_hand_computed: candidates the 5 rare tokens of response 0
    (H 0.1 … 0.5); stapo silences the 3 below τ_h = 0.4, stapo_high the 3 above the 0.25-quantile 0.2, stapo_random
    3 of the 5, stapo_full all 5."""
    import stapo.losses.masks
    import stapo.losses.policy

    calls = []
    find = stapo.losses.masks.candidate_mask
    for module in (stapo.losses.masks, stapo.losses.policy):  # policy_loss's call, and any the masks would make
        monkeypatch.setattr(module, "candidate_mask", lambda **kw: calls.append(1) or find(**kw))
    rare, common = -8.0, -0.1
    x = _inputs([[rare] * 5 + [common] * 3, [rare, rare] + [common] * 6],
                [1.0, -0.5], [[1] * 8, [1] * 8], entropies=[[0.1, 0.2, 0.3, 0.4, 0.5, 0.05, 0.05, 0.05], [0.01] * 8])
    tokens = {}
    policy_loss(get_objective(method, quantile_scope=scope), tokens=tokens, **x)
    assert len(calls) == 1
    assert tokens["candidates"].tolist() == [[True] * 5 + [False] * 3, [False] * 8]
    if silenced is None:  # random: three of the candidates
        assert int(tokens["silenced"].sum()) == 3 and not (tokens["silenced"] & ~tokens["candidates"]).any()
    else:
        assert tokens["silenced"].tolist() == [[i in silenced for i in range(8)], [False] * 8]
    assert torch.equal(tokens["kept"], ~tokens["silenced"])


def test_registries_refuse_a_second_registration_and_fill_their_own_table():
    """Each registrar adds to its own table under the given name, and refuses a name already there, saying which."""
    import stapo.losses.registry as obj

    for table, register, what, taken in ((obj.TOKEN_MASKS, obj.register_token_mask, "token mask", "all"),
                                        (obj.THRESHOLDS, obj.register_thresholds, "thresholds", "s2t"),
                                        (obj.POLICY_LOSSES, obj.register_policy_loss, "policy loss", "vanilla")):
        before = dict(table)
        with pytest.raises(ValueError, match=rf"^{what} '{taken}' is registered twice$"):
            register(taken)(lambda: None)
        assert table == before

        def new():
            pass

        try:
            assert register("issue37_probe")(new) is new and table["issue37_probe"] is new
            assert [t for t in (obj.TOKEN_MASKS, obj.THRESHOLDS, obj.POLICY_LOSSES) if "issue37_probe" in t] == [table]
        finally:
            table.pop("issue37_probe", None)


class _OtherRanks:
    """torch.distributed as rank 0 sees it in a group whose other ranks hold ``others`` (1-D tensors), for
    stapo.losses.masks' gather. all_gather fills slot r with rank r's tensor: first the sizes, then the values
    padded to the caller's length; like the real collective it needs every slot of the caller's shape and dtype, and a
    caller's tensor long enough for every rank's values."""

    def __init__(self, others: list):
        self.others, self.gathers = others, 0

    def is_available(self):
        return True

    def is_initialized(self):
        return True

    def get_world_size(self):
        return 1 + len(self.others)

    def all_gather(self, slots, tensor):
        assert len(slots) == self.get_world_size()
        assert all(s.shape == tensor.shape and s.dtype == tensor.dtype for s in slots)
        self.gathers += 1
        if self.gathers == 1:
            theirs = [torch.tensor([len(o)]) for o in self.others]
        else:
            assert all(len(o) <= tensor.numel() for o in self.others), "a slot shorter than a rank's values"
            theirs = [torch.cat([o, o.new_zeros(tensor.numel() - len(o))]) for o in self.others]
        for slot, value in zip(slots, [tensor] + theirs):
            slot.copy_(value)


@pytest.mark.parametrize("others, expected", [
    ([], [0.1, 0.2, 0.3]),
    ([[5.0, 6.0, 7.0, 8.0, 9.0]], [0.1, 0.2, 0.3, 5.0, 6.0, 7.0, 8.0, 9.0]),  # a longer rank: padding, trimmed
    ([[5.0, 6.0, 7.0, 8.0, 9.0], [4.0]], [0.1, 0.2, 0.3, 5.0, 6.0, 7.0, 8.0, 9.0, 4.0]),
    ([[], [4.0]], [0.1, 0.2, 0.3, 4.0]),  # a rank with nothing to give
])
def test_gather_across_ranks_concatenates_every_rank(monkeypatch, others, expected):
    """The gather behind the "micro_batch" quantiles, against fake ranks: the values of every rank in rank order,
    each without its padding, in the caller's dtype (float64 here); one process: the tensor itself."""
    import stapo.losses.masks as obj

    fake = _OtherRanks([torch.tensor(o, dtype=torch.float64) for o in others])
    monkeypatch.setattr(obj, "dist", fake)
    ours = torch.tensor([0.1, 0.2, 0.3], dtype=torch.float64)
    got = obj._gather_across_ranks(ours)
    assert got.dtype == torch.float64 and got.tolist() == expected
    assert (got is ours) == (not others) and fake.gathers == (2 if others else 0)


def test_thresholds_and_silence_mask_gather_unless_told_not_to(monkeypatch):
    """Four candidates here with H 0.1 … 0.4, and another rank's four with H 0.9: gathered (the default of
    step_thresholds and silence_mask), τ_h = quantile([.1 .2 .3 .4 .9 .9 .9 .9], 0.75) = 0.9 (all four of ours
    silenced) and the 0.25-quantile 0.2 + 0.75·0.1 = 0.275; this rank's alone (gather=False) τ_h = 0.325, three."""
    import stapo.losses.masks as obj

    monkeypatch.setattr(obj, "_gather_across_ranks", lambda v: torch.cat([v, torch.full((4,), 0.9)]))
    x = _inputs([[math.log(1e-4)] * 4], [1.0], [[1] * 4], entropies=[[0.1, 0.2, 0.3, 0.4]])
    t = {k: x[k] for k in ("logps", "entropies", "advantages", "completion_mask")}
    got = step_thresholds(METHODS["stapo"], **t)
    assert (got.tau_h, got.tau_h_high) == (pytest.approx(0.9), pytest.approx(0.275))
    s2t = dict(t, tau_p=0.002, q=0.75)
    assert silence_mask(**s2t).tolist() == [[True] * 4]
    assert silence_mask(**s2t, gather=False).tolist() == [[True, True, True, False]]


def test_empty_and_single_pools_at_call_scope():
    """Quantiles over the call ("micro_batch" scope) with nothing to take them over: no candidates silence
    nothing, no completion tokens keep nothing; a single completion token is its own cut and is kept."""
    x = _inputs([[math.log(1e-4)] * 3], [-1.0], [[1, 1, 0]], entropies=[[0.1, 0.2, 0.3]])  # Â < 0: no candidates
    t = {k: x[k] for k in ("logps", "entropies", "advantages", "completion_mask")}
    assert silence_mask(**t, tau_p=0.002, q=0.75).tolist() == [[False] * 3]
    none = high_entropy_mask(entropies=x["entropies"], completion_mask=torch.zeros(1, 3, dtype=torch.int), ratio=0.2)
    assert none.tolist() == [[False] * 3]
    one = high_entropy_mask(entropies=x["entropies"], completion_mask=torch.tensor([[0, 1, 0]]), ratio=0.2)
    assert one.tolist() == [[False, True, False]]


def test_top_k_breaks_ties_by_position_among_many():
    """The release's local scope keeps exactly k tokens; among tied entropies the earliest (a stable sort: an
    unstable one reorders ties from about 100 elements on). H = i mod 3 over 200 tokens, ρ = 0.2: k = 40 of the 67
    tokens with H = 2, at positions 2, 5, …, 119."""
    ent = torch.tensor([[float(i % 3) for i in range(200)]])
    kept = high_entropy_mask(entropies=ent, completion_mask=torch.ones(1, 200, dtype=torch.int), ratio=0.2, top_k=40)
    assert kept[0].nonzero().flatten().tolist() == list(range(2, 120, 3))
