"""Across-seed statistics of a study: a cell's mean over seeds with a CI over seeds AND problems, and paired
method differences.

RL on LLMs is seed-sensitive and the paper reports single runs; these answer "is method A's gain over B real?".

Shapes (S seeds, P problems, N samples per problem):
    correct   [S, P, N]  0/1 per sample, one evaluation per seed (the same P problems for every seed)
    values    [S, P]     per-problem accuracy of each seed (mean over its N samples)

Two-stage (hierarchical) percentile bootstrap: each replicate draws S seeds with replacement, then P problems with
replacement (the same problems for every drawn seed, since every seed is evaluated on the same problems), and takes
the mean of ``values`` over the drawn (seed, problem) cells. Seed-to-seed spread (training noise) and
problem-to-problem spread (benchmark sampling) both widen the interval; with one seed it is the usual
problem bootstrap of ``stapo.eval.scoring.bootstrap_ci``.

Paired difference of methods A and B: d[s, p] = A[s, p] − B[s, p], paired on (seed, problem) — seed s of both
methods shares the data order and sampling seed, and both are graded on problem p — bootstrapped the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["SeedCell", "PairedDifference", "per_problem", "two_stage_bootstrap", "seed_cell", "paired_difference",
           "BOOTSTRAP_ITERS"]

BOOTSTRAP_ITERS = 10_000


def per_problem(correct: np.ndarray) -> np.ndarray:
    """[S, P, N] 0/1 samples -> [S, P] per-problem accuracy (avg@N of each problem, per seed)."""
    correct = np.asarray(correct, dtype=float)
    if correct.ndim != 3 or 0 in correct.shape:
        raise ValueError(f"correct: need [seeds, problems, samples] with none empty, got shape {correct.shape}")
    return correct.mean(axis=2)


def two_stage_bootstrap(values: np.ndarray, iters: int = BOOTSTRAP_ITERS, seed: int = 0) -> np.ndarray:
    """[iters] bootstrap replicates of values.mean() for values [S, P]: seeds, then problems, with replacement."""
    values = np.asarray(values, dtype=float)
    s, p = values.shape
    rng = np.random.default_rng(seed)
    seeds = rng.integers(0, s, size=(iters, s))       # [iters, S]
    problems = rng.integers(0, p, size=(iters, p))    # [iters, P]
    # mean over the S × P drawn cells = mean over drawn seeds of (mean over drawn problems of that seed's row)
    rows = values[seeds]                                           # [iters, S, P]
    picked = np.take_along_axis(rows, problems[:, None, :], axis=2)  # [iters, S, P]
    return picked.mean(axis=(1, 2))


def _interval(replicates: np.ndarray) -> tuple[float, float]:
    lo, hi = np.percentile(replicates, [2.5, 97.5])
    return float(lo), float(hi)


@dataclass(frozen=True)
class SeedCell:
    """One (model, method, checkpoint, benchmark, setting) cell over seeds, in percent.

    mean: avg@N averaged over problems and seeds; lo, hi: its 95 % two-stage bootstrap CI;
    seed_means: each seed's own avg@N (the spread the table's n shows); n_seeds = len(seed_means).
    """

    mean: float
    lo: float
    hi: float
    seed_means: tuple[float, ...]

    @property
    def n_seeds(self) -> int:
        return len(self.seed_means)

    @property
    def half_width(self) -> float:
        return (self.hi - self.lo) / 2


def seed_cell(correct: np.ndarray, iters: int = BOOTSTRAP_ITERS, seed: int = 0) -> SeedCell:
    """The cell of ``correct`` [S, P, N] (0/1): mean, 95 % CI over seeds and problems, per-seed means (%)."""
    values = per_problem(correct)
    lo, hi = _interval(two_stage_bootstrap(values, iters, seed))
    return SeedCell(mean=100 * float(values.mean()), lo=100 * lo, hi=100 * hi,
                    seed_means=tuple(100 * float(m) for m in values.mean(axis=1)))


@dataclass(frozen=True)
class PairedDifference:
    """A − B in percentage points, paired on (seed, problem), with its 95 % CI; ``excludes_zero`` marks a
    difference whose interval lies entirely on one side of 0."""

    mean: float
    lo: float
    hi: float
    n_seeds: int
    n_problems: int

    @property
    def excludes_zero(self) -> bool:
        return self.lo > 0 or self.hi < 0


def paired_difference(a: np.ndarray, b: np.ndarray, iters: int = BOOTSTRAP_ITERS, seed: int = 0) -> PairedDifference:
    """A − B for two methods' ``correct`` [S, P, N] arrays on the same seeds and problems (N may differ)."""
    va, vb = per_problem(a), per_problem(b)
    if va.shape != vb.shape:
        raise ValueError(f"paired difference needs the same seeds and problems, got {va.shape[:2]} and {vb.shape[:2]}")
    d = va - vb
    lo, hi = _interval(two_stage_bootstrap(d, iters, seed))
    return PairedDifference(mean=100 * float(d.mean()), lo=100 * lo, hi=100 * hi, n_seeds=d.shape[0],
                            n_problems=d.shape[1])
