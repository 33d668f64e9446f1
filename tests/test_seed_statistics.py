"""Across-seed statistics (stapo.report.seed_statistics): a hand-computed 3-seed case, the bootstrap against the exact
enumeration of its distribution, and paired differences with a known effect."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from stapo.report.seed_statistics import paired_difference, per_problem, seed_cell, two_stage_bootstrap

# 3 seeds x 2 problems x 2 samples; per-problem accuracies [[1, 0], [.5, 0], [1, .5]]
CORRECT = np.array([[[1, 1], [0, 0]],
                    [[1, 0], [0, 0]],
                    [[1, 1], [1, 0]]])


def test_hand_computed_cell():
    cell = seed_cell(CORRECT)
    assert per_problem(CORRECT).tolist() == [[1.0, 0.0], [0.5, 0.0], [1.0, 0.5]]
    assert cell.mean == pytest.approx(50.0)               # (1 + 0 + .5 + 0 + 1 + .5) / 6
    assert cell.seed_means == pytest.approx((50.0, 25.0, 75.0)) and cell.n_seeds == 3
    assert cell.lo < cell.mean < cell.hi


def test_bootstrap_matches_the_exact_two_stage_distribution():
    """All 3^3 seed draws x 2^2 problem draws are equally likely: the bootstrap's quantiles and mean are theirs."""
    values = per_problem(CORRECT)
    exact = np.array([values[list(s)][:, list(p)].mean()
                      for s in itertools.product(range(3), repeat=3) for p in itertools.product(range(2), repeat=2)])
    assert exact.size == 108 and exact.mean() == pytest.approx(0.5)
    boot = two_stage_bootstrap(values, iters=40_000, seed=1)
    assert boot.mean() == pytest.approx(exact.mean(), abs=0.005)
    assert boot.std() == pytest.approx(exact.std(), rel=0.03)
    for q in (2.5, 25, 50, 75, 97.5):  # discrete distribution: compare the CDF at each exact quantile
        x = np.percentile(exact, q, method="inverted_cdf")
        assert (boot <= x).mean() == pytest.approx((exact <= x).mean(), abs=0.01), q
    cell = seed_cell(CORRECT, iters=40_000, seed=1)
    lo, hi = np.percentile(exact, [2.5, 97.5], method="inverted_cdf")
    assert cell.lo == pytest.approx(100 * lo, abs=2.0) and cell.hi == pytest.approx(100 * hi, abs=2.0)


def test_seed_spread_widens_the_interval():
    """Same problems, same overall mean: seeds that disagree give a wider CI than seeds that agree."""
    rng = np.random.default_rng(0)
    base = (rng.random((1, 100, 4)) < 0.5).astype(float)
    agree = np.repeat(base, 3, axis=0)
    disagree = agree.copy()
    disagree[0] = 1.0
    disagree[2] = 0.0
    assert seed_cell(agree).half_width < seed_cell(disagree).half_width / 2
    assert seed_cell(agree).seed_means == pytest.approx((100 * base.mean(),) * 3)


def _method(rng, p_correct: np.ndarray, seeds: int = 3, samples: int = 4) -> np.ndarray:
    return (rng.random((seeds, p_correct.size, samples)) < p_correct[None, :, None]).astype(float)


def test_paired_difference_finds_a_known_effect_and_its_sign():
    rng = np.random.default_rng(0)
    difficulty = rng.uniform(0.1, 0.7, size=300)  # per-problem solve rates of B
    b = _method(rng, difficulty)
    a = _method(rng, difficulty + 0.10)           # A solves every problem 10 points more often
    d = paired_difference(a, b)
    assert d.n_seeds == 3 and d.n_problems == 300
    assert d.lo < 10.0 < d.hi and d.excludes_zero and d.lo > 0
    back = paired_difference(b, a)
    assert back.mean == pytest.approx(-d.mean) and back.hi < 0 and back.excludes_zero


def test_paired_difference_without_an_effect_includes_zero():
    rng = np.random.default_rng(1)
    difficulty = rng.uniform(0.1, 0.7, size=300)
    d = paired_difference(_method(rng, difficulty), _method(rng, difficulty))
    assert d.lo < 0 < d.hi and not d.excludes_zero and abs(d.mean) < 3


def test_paired_difference_needs_the_same_seeds_and_problems():
    with pytest.raises(ValueError, match="same seeds and problems"):
        paired_difference(np.zeros((3, 5, 2)), np.zeros((2, 5, 2)))
    with pytest.raises(ValueError, match=r"\[seeds, problems, samples\]"):
        seed_cell(np.zeros((3, 5)))
