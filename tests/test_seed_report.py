"""The across-seed report (stapo.report.seeds) on synthetic per-sample files of a 3-seed study with a known effect."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from stapo import study
from stapo.eval.scoring import DamagedScores, samples_file_digest, summary_of
from stapo.report.seeds import load_seed_samples, paired_table, render_seeds, seed_cells, seed_scores

ROOT = Path(__file__).resolve().parents[1]


def _write(path: Path, correct: np.ndarray, verified: np.ndarray | None = None) -> None:
    """Per-sample records (the fields stapo.eval.scoring.build_records writes) of correct [P, N]."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [{"problem_id": f"p{p:03d}", "sample": k, "correct": bool(correct[p, k]),
             **({"correct_verified": bool(verified[p, k])} if verified is not None else {})}
            for p in range(correct.shape[0]) for k in range(correct.shape[1])]
    data = "".join(json.dumps(r) + "\n" for r in rows[::-1]).encode()  # order on disk does not matter
    path.write_bytes(data)
    summary = {"avg_at_n": 100 * float(correct.mean()), "ci95": [0.0, 100.0], "n_samples": correct.shape[1],
               "problems": correct.shape[0], "samples": len(rows), "samples_file": samples_file_digest(data)}
    summary_of(path).write_text(json.dumps(summary))


@pytest.fixture
def tiny_study():
    recipe = study.load(ROOT / "configs" / "tiny.yaml")
    recipe["workflow"]["seeds"] = [0, 1, 2]
    return study.parse(recipe, check_runs=False)


@pytest.fixture
def scores(tmp_path):
    """justrl solves each problem with p = d, stapo with p = d + 0.15, grpo with p = d; 3 seeds, 200 problems x 4."""
    rng = np.random.default_rng(0)
    d = rng.uniform(0.1, 0.6, size=200)
    for method, shift in (("justrl", 0.0), ("stapo", 0.15), ("grpo", 0.0)):
        for seed in range(3):
            correct = rng.random((200, 4)) < (d + shift)[:, None]
            _write(tmp_path / "m" / method / f"seed{seed}" / "final" / "arith" / "t1.0_p1.0.jsonl", correct)
    _write(tmp_path / "m" / "base" / "base" / "arith" / "t1.0_p1.0.jsonl", rng.random((200, 4)) < d[:, None] / 2)
    return tmp_path


def test_cells_hold_every_seed_and_the_base(scores):
    files = load_seed_samples(scores)
    assert sorted(files[("m", "stapo", "final", "arith", "t1.0_p1.0")]) == [0, 1, 2]
    cells = seed_cells(scores)
    cell = cells[("m", "stapo", "final", "arith", "t1.0_p1.0")]
    seeds, correct = cell.seeds, cell.headline
    assert seeds == [0, 1, 2] and correct.shape == (3, 200, 4) and cell.corrected is None
    assert cells[("m", "base", "base", "arith", "t1.0_p1.0")].rule.shape == (1, 200, 4)
    cell = seed_scores(cells)[("m", "stapo", "final", "arith", "t1.0_p1.0")]
    assert cell.mean == pytest.approx(100 * correct.mean()) and cell.n_seeds == 3
    assert cell.seed_means == pytest.approx(tuple(100 * correct[s].mean() for s in range(3)))


def test_paired_table_finds_the_known_effect(scores, tiny_study):
    cells = seed_cells(scores)
    rows = {(a, b): (diffs, avg) for a, b, diffs, avg in paired_table(cells, "m", "t1.0_p1.0", ["arith"],
                                                                       tiny_study)}
    # every method minus JustRL, then STAPO minus the others (not JustRL twice); entropy20 has no scores
    assert list(rows) == [("grpo", "justrl"), ("stapo", "justrl"), ("stapo", "grpo")]
    stapo_justrl = rows[("stapo", "justrl")][0][0]
    assert stapo_justrl.lo < 15.0 < stapo_justrl.hi and stapo_justrl.excludes_zero
    grpo_justrl = rows[("grpo", "justrl")][0][0]
    assert grpo_justrl.lo < 0 < grpo_justrl.hi and not grpo_justrl.excludes_zero
    assert rows[("stapo", "grpo")][0][0].lo > 0


def test_rendered_markdown(scores, tiny_study):
    text = render_seeds(seed_cells(scores), tiny_study, ["m"], ["arith"], ["t1.0_p1.0"])
    stapo_row = next(line for line in text.splitlines() if line.startswith("| STAPO | 3 |"))
    base_row = next(line for line in text.splitlines() if line.startswith("| Base | 1 |"))
    assert stapo_row.count("[") == 1 and base_row
    pair = next(line for line in text.splitlines() if line.startswith("| STAPO − JustRL |"))
    assert pair.count("*") == 2  # the benchmark and Avg both exclude zero
    assert next(line for line in text.splitlines() if line.startswith("| GRPO − JustRL |")).count("*") == 0


def test_the_verifier_verdict_is_used_where_present(tmp_path):
    ones, zeros = np.ones((5, 2), bool), np.zeros((5, 2), bool)
    for seed in (0, 1):
        _write(tmp_path / "m" / "stapo" / f"seed{seed}" / "final" / "b" / "s.jsonl", zeros, verified=ones)
    cells = seed_cells(tmp_path)
    cell = seed_scores(cells)[("m", "stapo", "final", "b", "s")]
    assert cell.mean == 100.0 and cell.seed_means == (100.0, 100.0)
    assert cells[("m", "stapo", "final", "b", "s")].rule.sum() == 0


def test_seeds_on_different_problems_are_an_error(tmp_path):
    _write(tmp_path / "m" / "stapo" / "seed0" / "final" / "b" / "s.jsonl", np.ones((5, 2), bool))
    _write(tmp_path / "m" / "stapo" / "seed1" / "final" / "b" / "s.jsonl", np.ones((4, 2), bool))
    with pytest.raises(ValueError, match="seed1.*problems differ from seed 0"):
        seed_cells(tmp_path)


def test_stapo_report_of_a_three_seed_study(scores, tiny_study, tmp_path):
    """write_report: the table's trained cells are the means over seeds (n in a footnote, linked to seeds.md),
    scores.csv has n_seeds, the curves come from every seed's metrics."""
    from stapo.report.table import load_scores, write_report

    for path in sorted(scores.rglob("*.jsonl")):  # the summaries stapo eval writes beside the samples
        _, rule, _ = __import__("stapo.report.seeds", fromlist=["x"])._correct_matrix(path)
        summary = {"avg_at_n": 100 * rule.mean(), "ci95": [0.0, 100.0], "n_samples": 4, "problems": 200}
        path.with_name(path.name.replace(".jsonl", ".summary.json")).write_text(json.dumps(summary))
    runs = tmp_path / "runs"
    for method in ("justrl", "stapo", "grpo"):
        for seed in range(3):
            run = runs / "m" / method / f"seed{seed}"
            run.mkdir(parents=True)
            run.joinpath("metrics.jsonl").write_text("".join(
                json.dumps({"step": i, "entropy_mean": 1.0 + seed, "reward_mean": 0.0}) + "\n" for i in (1, 2)))
            run.joinpath("config.yaml").write_text("method: {loss_agg_mode: token-mean, quantile_scope: mini_batch}\n")
    loaded = {(s.method, s.ckpt): s for s in load_scores(scores)}
    stapo = loaded[("stapo", "final")]
    assert stapo.n_seeds == 3 and loaded[("base", "base")].n_seeds == 1
    cells = seed_cells(scores)
    assert stapo.accuracy == pytest.approx(100 * cells[("m", "stapo", "final", "arith", "t1.0_p1.0")].rule.mean())
    assert stapo.ci_hi - stapo.ci_lo < 20  # the two-stage CI, not a seed summary's [0, 100]
    out = tmp_path / "results"
    write_report(scores, runs, out, tiny_study)
    table = (out / "table.md").read_text()
    assert f"{stapo.accuracy:.2f}" in table and "the mean over 3 seeds" in table and "(seeds.md)" in table
    assert "| STAPO − JustRL |" in (out / "seeds.md").read_text()
    import csv

    with open(out / "scores.csv", newline="") as f:
        csv_rows = list(csv.DictReader(f))
    keys = ("model", "method", "ckpt", "benchmark", "n_seeds")
    assert any(tuple(r[k] for k in keys) == ("m", "stapo", "final", "arith", "3") for r in csv_rows)
    from stapo.report.figures import figure_series
    from stapo.report.table import load_metrics

    metrics = load_metrics(runs)
    assert sorted(metrics)[:3] == [("m", "grpo/seed0"), ("m", "grpo/seed1"), ("m", "grpo/seed2")]
    curve = figure_series("entropy", "m", [], metrics, ["stapo"]).of("stapo")
    assert curve.values == (2.0, 2.0) and curve.lo == (1.0, 1.0) and curve.hi == (3.0, 3.0)


# ------------------------------------------------------------------------------------------- damaged scores


def _cut(path: Path, keep_lines: int) -> None:
    path.write_text("".join(path.read_text().splitlines(keepends=True)[:keep_lines]))


def test_a_per_sample_file_cut_short_is_refused_not_averaged(scores, tiny_study, tmp_path):
    """Two seeds cut to half their problems used to be averaged silently (STAPO 41.67 instead of 29.17 while
    scores.csv said 12 problems): the file's SHA-256 and line count are checked against its summary."""
    from stapo.report.table import write_report

    for seed in (0, 1):
        _cut(scores / "m" / "stapo" / f"seed{seed}" / "final" / "arith" / "t1.0_p1.0.jsonl", 400)
    with pytest.raises(DamagedScores, match=r"stapo/seed0/final/arith/t1\.0_p1\.0\.jsonl: 400 lines, SHA-256 .+ its "
                                            r"summary recorded 800 lines"):
        write_report(scores, tmp_path / "runs", tmp_path / "results", tiny_study)
    assert not (tmp_path / "results" / "table.md").exists()


def test_a_line_cut_mid_way_names_the_file_and_line(scores):
    path = scores / "m" / "justrl" / "seed2" / "final" / "arith" / "t1.0_p1.0.jsonl"
    data = path.read_bytes()
    path.write_bytes(data[: data.index(b"\n", 100) + 20])
    summary = json.loads(summary_of(path).read_text())
    del summary["samples_file"]  # a summary written before the checksum: the count still catches it
    summary_of(path).write_text(json.dumps(summary))
    with pytest.raises(DamagedScores, match=rf"{path}:3: not a JSON record \(cut mid-way\?\)"):
        seed_cells(scores)
    _cut(path, 2)
    with pytest.raises(DamagedScores, match=rf"{path}: 2 samples, its summary says 800"):
        seed_cells(scores)
    summary_of(path).unlink()
    with pytest.raises(DamagedScores, match=r"t1\.0_p1\.0\.summary\.json: missing"):
        seed_cells(scores)
