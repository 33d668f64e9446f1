"""The across-seed part of ``stapo report`` for a study of several seeds (``workflow.seeds``).

Inputs: the per-sample files of every seed's evaluation,
    scores/<model>/<method>/seed<k>/<ckpt>/<benchmark>/<setting>.jsonl      (one per seed)
    scores/<model>/base/base/<benchmark>/<setting>.jsonl                    (the untrained model: one "seed")
Outputs:
    :func:`seed_scores`  one cell per (model, method, ckpt, benchmark, setting): the mean over seeds of avg@N with
                         the 95 % CI of a two-stage bootstrap over seeds and problems (stapo.report.seed_statistics),
                         for the report's table (its cells then read "mean over n seeds")
    :func:`render_seeds` results/seeds.md: per model and setting, each cell "mean [lo, hi]" with n seeds and each
                         seed's own number, then the paired comparisons — every method minus JustRL, and STAPO
                         minus every other method — per benchmark and on Avg, with the paired CI; "*" marks an
                         interval that excludes zero.

Accuracy is the verifier-corrected verdict where the evaluation ran a verifier (``correct_verified``), else the
strict rule verdict (``correct``), as in the main table. Avg's paired difference is the mean of the benchmarks'
differences, its half-width sqrt(Σ h_i²)/k (independent benchmarks, the main table's rule for Avg).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from stapo import study as stapo_study
from stapo.study.names import BASE
from stapo.eval.scoring import DamagedScores, read_samples
from stapo.report.seed_statistics import PairedDifference, SeedCell, paired_difference, seed_cell

__all__ = ["SeedSamples", "load_seed_samples", "seed_cells", "seed_scores", "paired_table", "render_seeds"]

Key = tuple[str, str, str, str, str]  # (model, method, ckpt, benchmark, setting)


@dataclass(frozen=True)
class SeedSamples:
    """One cell's verdicts over its seeds: rule [S, P, N] (strict grade) and corrected (verifier; None without)."""

    seeds: list[int]
    rule: np.ndarray
    corrected: np.ndarray | None = None

    @property
    def headline(self) -> np.ndarray:
        """What the table reports: verifier-corrected where the evaluations ran a verifier, else the rule grade."""
        return self.rule if self.corrected is None else self.corrected


def _correct_matrix(path: Path) -> tuple[list[str], np.ndarray, np.ndarray | None]:
    """(problem ids in order, rule [P, N] 0/1, corrected [P, N] or None) of one per-sample file."""
    rows = read_samples(path)  # checked against its summary: a file cut short is refused, not averaged
    if not rows:
        raise DamagedScores(f"{path}: no samples")
    verified = all("correct_verified" in r for r in rows)
    by_problem: dict[str, list] = defaultdict(list)
    for r in sorted(rows, key=lambda r: r["sample"]):
        by_problem[str(r["problem_id"])].append((bool(r["correct"]), bool(r.get("correct_verified"))))
    ids = sorted(by_problem)
    n = {len(v) for v in by_problem.values()}
    if len(n) != 1:
        raise ValueError(f"{path}: problems have different numbers of samples {sorted(n)}")
    both = np.array([by_problem[i] for i in ids], dtype=float)  # [P, N, 2]
    return ids, both[..., 0], both[..., 1] if verified else None


def load_seed_samples(scores_dir: str | Path) -> dict[Key, dict[int, Path]]:
    """``(model, method, ckpt, benchmark, setting) -> {seed: per-sample file}`` of every seed's evaluation."""
    out: dict[Key, dict[int, Path]] = defaultdict(dict)
    for path in sorted(Path(scores_dir).glob("*/*/seed*/*/*/*.jsonl")):
        model, method, seed_dir, ckpt, bench = path.relative_to(scores_dir).parts[:5]
        method_key, seed = stapo_study.split_run(f"{method}/{seed_dir}")
        if seed is None:
            continue
        out[(model, method_key, ckpt, bench, path.name.removesuffix(".jsonl"))][seed] = path
    return dict(out)


def _stack(files: dict[int, Path]) -> SeedSamples:
    """One cell's seeds, all on the same problems (the samples per problem cut to the fewest)."""
    seeds = sorted(files)
    mats = [_correct_matrix(files[s]) for s in seeds]
    ids = mats[0][0]
    for s, (other, _, _) in zip(seeds, mats):
        if other != ids:
            raise ValueError(f"{files[s]}: its problems differ from seed {seeds[0]}'s ({files[seeds[0]]})")
    n = min(m.shape[1] for _, m, _ in mats)
    corrected = None if any(c is None for _, _, c in mats) else np.stack([c[:, :n] for _, _, c in mats])
    return SeedSamples(seeds, np.stack([m[:, :n] for _, m, _ in mats]), corrected)


def seed_cells(scores_dir: str | Path) -> dict[Key, SeedSamples]:
    """Every several-seed cell, plus the untrained model's one evaluation (one "seed")."""
    cells = {key: _stack(files) for key, files in load_seed_samples(scores_dir).items()}
    for path in sorted(Path(scores_dir).glob(f"*/{BASE}/{BASE}/*/*.jsonl")):
        model, _, _, bench = path.relative_to(scores_dir).parts[:4]
        _, rule, corrected = _correct_matrix(path)
        cells[(model, BASE, BASE, bench, path.name.removesuffix(".jsonl"))] = SeedSamples(
            [0], rule[None], None if corrected is None else corrected[None])
    return cells


def seed_scores(cells: dict[Key, SeedSamples]) -> dict[Key, SeedCell]:
    """The mean over seeds and its two-stage CI of every cell's headline verdict (:func:`seed_cells`)."""
    return {key: seed_cell(c.headline) for key, c in cells.items()}


def _reference(study, objective: str) -> list[str]:
    return [k for k, o in study.methods.items() if o.method == objective]


def paired_table(cells: dict, model: str, setting: str, benchmarks: list[str], study
                 ) -> list[tuple[str, str, list[PairedDifference | None], tuple[float, float] | None]]:
    """(a, b, [A − B per benchmark], Avg (mean, half-width)) for every method − JustRL and STAPO − every other
    method, on the final checkpoints of ``model`` at ``setting`` (pairs missing a cell get None)."""
    methods = [m for m in study.methods if any(k[:3] == (model, m, "final") for k in cells)]
    pairs = [(m, ref) for ref in _reference(study, "justrl") if ref in methods for m in methods if m != ref]
    pairs += [(s, m) for s in _reference(study, "stapo") if s in methods for m in methods
              if m != s and (s, m) not in pairs and (m, s) not in pairs]
    out = []
    for a, b in pairs:
        diffs = []
        for bench in benchmarks:
            ca, cb = cells.get((model, a, "final", bench, setting)), cells.get((model, b, "final", bench, setting))
            same = (ca is not None and cb is not None and ca.seeds == cb.seeds
                    and ca.headline.shape[:2] == cb.headline.shape[:2])
            diffs.append(paired_difference(ca.headline, cb.headline) if same else None)
        present = [d for d in diffs if d is not None]
        avg = None
        if present and len(present) == len(diffs):
            avg = (sum(d.mean for d in present) / len(present),
                   math.sqrt(sum(((d.hi - d.lo) / 2) ** 2 for d in present)) / len(present))
        out.append((a, b, diffs, avg))
    return out


def _cell_text(c: SeedCell | None) -> str:
    if c is None:
        return "–"
    return f"{c.mean:.1f} [{c.lo:.1f}, {c.hi:.1f}]"


def _diff_text(d: PairedDifference | None) -> str:
    if d is None:
        return "–"
    return f"{d.mean:+.1f} [{d.lo:+.1f}, {d.hi:+.1f}]{'*' if d.excludes_zero else ''}"


def render_seeds(cells: dict, study, models: list[str], benchmarks: list[str], settings: list[str]) -> str:
    """results/seeds.md (module docstring)."""
    scores = seed_scores(cells)
    label = study.label
    lines = ["# Across seeds", "",
             f"Seeds: {study.seeds}. Each cell: avg@N averaged over seeds, with the 95 % CI of a two-stage bootstrap "
             "(seeds, then problems); n = seeds behind it, then each seed's own avg@N. Paired differences pair "
             "each (seed, problem) of the two methods; * = the 95 % CI excludes 0.", ""]
    for model in models:
        for setting in settings:
            lines += [f"## {label('models', model)}, {label('settings', setting)}", "",
                      "| method | n | " + " | ".join(label("benchmarks", b) for b in benchmarks) + " | per seed |",
                      "|---|---|" + "---|" * len(benchmarks) + "---|"]
            for method in [*study.methods, BASE]:
                row = [scores.get((model, method, "final" if method != BASE else BASE, b, setting))
                       for b in benchmarks]
                if not any(row):
                    continue
                n = max(c.n_seeds for c in row if c)
                per_seed = "; ".join(f"{label('benchmarks', b)} " + "/".join(f"{m:.1f}" for m in c.seed_means)
                                     for b, c in zip(benchmarks, row) if c)
                lines.append(f"| {label('methods', method)} | {n} | "
                             + " | ".join(_cell_text(c) for c in row) + f" | {per_seed} |")
            pairs = paired_table(cells, model, setting, benchmarks, study)
            if pairs:
                lines += ["", "| paired difference | " + " | ".join(label("benchmarks", b) for b in benchmarks)
                          + " | Avg |", "|---|" + "---|" * (len(benchmarks) + 1)]
                for a, b, diffs, avg in pairs:
                    avg_text = "–" if avg is None else (f"{avg[0]:+.1f} ± {avg[1]:.1f}"
                                                        + ("*" if abs(avg[0]) > avg[1] else ""))
                    lines.append(f"| {label('methods', a)} − {label('methods', b)} | "
                                 + " | ".join(_diff_text(d) for d in diffs) + f" | {avg_text} |")
            lines.append("")
    return "\n".join(lines)
