"""stapo.report.table and stapo.report.figures on synthetic score summaries and metrics: table layout, Δ vs the paper,
CSV CIs, what each figure plots."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest
import yaml

from stapo.report import table as report, results
from helpers.cells import write_cell
from stapo.core.atomic import atomic_write_json
from stapo import study as stapo_study
from stapo.report.figures import FIGURE_KINDS, figure_series, step_of, step_series
from stapo.study.names import PAPER_BENCHMARKS

SETTINGS = ("t1.0_p1.0", "t0.7_p0.9")
PAPER_MODEL = "qwen3-1.7b-base"
METHODS = ("grpo", "entropy20", "justrl", "stapo")
CELL = re.compile(r"^-?\d+\.\d{2} \(-?\d+\.\d{2}\)$")


def _summary(path: Path, acc: float, half: float = 2.0, n: int = 4, problems: int = 30) -> None:
    write_cell(path, {"avg_at_n": acc, "ci95": [acc - half, acc + half], "n_samples": n, "problems": problems})


def study_of(name: str = "synthetic", models=(), methods=(), **sections) -> stapo_study.Study:
    """A parsed study of ``models`` (any spec) and ``methods`` (each its own objective) over ``sections``."""
    config = {"study": name, **sections}
    if models:
        config["models"] = {m: {"spec": "x"} for m in models}
    if methods:
        config["methods"] = {m: {"objective": m} for m in methods}
    return stapo_study.parse(config, required=(), check_runs=False)


def _write_study(tmp: Path, model: str, benchmarks, ckpts=("final",)) -> tuple[Path, Path]:
    scores, runs = tmp / "scores", tmp / "runs"
    for i, method in enumerate(("base",) + METHODS):
        for ckpt in (("base",) if method == "base" else ckpts):
            for j, bench in enumerate(benchmarks):
                for k, setting in enumerate(SETTINGS):
                    _summary(scores / model / method / ckpt / bench / f"{setting}.summary.json", 10 + i + j + 0.5 * k)
        if method == "base":
            continue
        lines = [{"step": s, "entropy_mean": 0.5 + 0.01 * s * i, "reward_mean": -1 + 0.1 * s,
                  "silenced_fraction": 1e-5 * s if method == "stapo" else 0.0} for s in range(1, 6)]
        lines.append(dict(lines[-1], reward_mean=0.123))  # a resumed run repeats step 5: the last one wins
        (runs / model / method).mkdir(parents=True, exist_ok=True)
        (runs / model / method / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return scores, runs


def _rows(table: str) -> dict[str, list[str]]:
    rows = {}
    for line in table.splitlines():
        if line.startswith("| ") and not line.startswith("| Method"):
            label, *cells = [c.strip() for c in line.strip("|").split("|")]
            rows[label] = cells
    return rows


def test_paper_model_table_has_paper_numbers_and_delta(tmp_path):
    scores, runs = _write_study(tmp_path, PAPER_MODEL, PAPER_BENCHMARKS)
    report.write_report(scores, runs, tmp_path / "results", study_of("synthetic", [PAPER_MODEL], METHODS))
    table = (tmp_path / "results" / "table.md").read_text()
    rows = _rows(table)
    labels = [line.split("|")[1].strip() for line in table.splitlines() if line.startswith("| ")][1:]
    assert labels == ["Base"] + [f"{m}{suffix}" for m in ("GRPO", "20-Entropy", "JustRL", "STAPO")
                                 for suffix in ("", " (paper v2)", " Δ ours − paper")]
    assert "| Method | AIME24 | AIME25 | AMC23 | MATH500 | Minerva | OlympiadBench | Avg |" in table
    for name in ("Base", "GRPO", "20-Entropy", "JustRL", "STAPO"):
        assert len(rows[name]) == 7 and all(CELL.match(c) for c in rows[name]), rows[name]
    # STAPO is method index 4: aime24 = 14.0 (14.5); the paper's 1.7B STAPO aime24 = 17.40 (16.04)
    assert rows["STAPO"][0] == "14.00 (14.50)"
    assert rows["STAPO (paper v2)"][0] == "17.40 (16.04)"
    assert rows["STAPO Δ ours − paper"][0] == "-3.40 (-1.54)"
    # Avg over the six: 14 + mean(0..5) = 16.5; paper avg 38.18 -> Δ -21.68
    assert rows["STAPO"][6] == "16.50 (17.00)"
    assert rows["STAPO Δ ours − paper"][6] == "-21.68 (-19.72)"
    assert "Base (paper v2)" not in rows  # the paper has no base row


def test_csv_has_every_cell_with_ci_and_averages(tmp_path):
    scores, runs = _write_study(tmp_path, PAPER_MODEL, PAPER_BENCHMARKS)
    report.write_report(scores, runs, tmp_path / "results")
    with open(tmp_path / "results" / "scores.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    cells = [r for r in rows if r["benchmark"] != "avg"]
    assert len(cells) == 5 * 6 * 2
    for r in cells:
        assert float(r["ci95_lo"]) == pytest.approx(float(r["accuracy"]) - 2)
        assert float(r["ci95_hi"]) == pytest.approx(float(r["accuracy"]) + 2)
    stapo_avg = next(r for r in rows if r["method"] == "stapo" and r["benchmark"] == "avg"
                     and r["setting"] == "t1.0_p1.0")
    # half-width sqrt(6 * 2^2) / 6 = 0.8165
    assert float(stapo_avg["ci95_hi"]) - float(stapo_avg["accuracy"]) == pytest.approx(0.8165, abs=1e-3)
    assert float(stapo_avg["paper_v2"]) == 38.18
    grpo_aime = next(r for r in rows if r["method"] == "grpo" and r["benchmark"] == "aime24"
                     and r["setting"] == "t0.7_p0.9")
    assert float(grpo_aime["delta"]) == pytest.approx(11.5 - 10.83)


def test_miniature_table_only_present_benchmarks_and_footnote(tmp_path):
    scores, runs = _write_study(tmp_path, "smollm2-135m", ("arith", "aime24"), ckpts=("final", "checkpoint-2"))
    report.write_report(scores, runs, tmp_path / "results", study_of("tiny"))
    table = (tmp_path / "results" / "table.md").read_text()
    assert "| Method | AIME24 | Arith | Avg |" in table
    rows = _rows(table)
    assert set(rows) == {"Base", "GRPO", "20-Entropy", "JustRL", "STAPO"}  # no paper rows for a non-paper model
    assert all(CELL.match(c) for cells in rows.values() for c in cells)
    assert "Avg is over the 2 benchmark(s) present" in table and "not evaluated: AIME25" in table
    assert "\\begin{tabular}{lccc}" in (tmp_path / "results" / "table.tex").read_text()


def test_figures_exist_as_png_and_pdf(tmp_path):
    scores, runs = _write_study(tmp_path, "m", ("arith",), ckpts=("final", "checkpoint-2"))
    report.write_report(scores, runs, tmp_path / "results")
    for kind in ("entropy", "reward", "accuracy", "silenced"):
        png = tmp_path / "results" / "figures" / f"m_{kind}.png"
        pdf = png.with_suffix(".pdf")
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
        assert pdf.read_bytes()[:5] == b"%PDF-"
    index = (tmp_path / "results" / "figures.md").read_text()
    for kind in ("quadrants", "entropy_quantiles"):  # no diagnostics.jsonl: not drawn, and figures.md says why
        assert not (tmp_path / "results" / "figures" / f"m_{kind}.png").exists()
        assert f"### `{kind}`" in index
    assert index.count("- m: not drawn: no token diagnostics logged") == 2


def test_a_figure_with_nothing_to_show_is_not_drawn_and_the_index_says_why(tmp_path):
    """A silenced fraction of 0 throughout, accuracy at base and final only (two points are no trend), no
    diagnostics: none is drawn (an old file of an earlier report goes), figures.md gives each one's reason."""
    scores, runs = _write_study(tmp_path, "m", ("arith",))
    for method in METHODS:  # nothing silenced
        path = runs / "m" / method / "metrics.jsonl"
        rows = [dict(json.loads(x), silenced_fraction=0.0) for x in path.read_text().splitlines()]
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    stale = tmp_path / "results" / "figures" / "m_silenced.png"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"an earlier report's empty panel")
    report.write_report(scores, runs, tmp_path / "results")
    drawn = sorted(k for k in FIGURE_KINDS if (tmp_path / "results" / "figures" / f"m_{k}.png").exists())
    assert drawn == ["entropy", "reward"]
    index = (tmp_path / "results" / "figures.md").read_text()
    assert "- m: not drawn: no token was silenced: each of the 20 logged silenced_fraction values (every method, " \
        "every step) is 0" in index
    assert "- m: not drawn: only the base model and the final checkpoint are evaluated on arith" in index
    metrics = report.load_metrics(runs)
    assert figure_series("silenced", "m", [], metrics, list(METHODS)).series == ()
    accuracy = figure_series("accuracy", "m", report.load_scores(scores), metrics, ["base", *METHODS])
    assert [len(s.steps) for s in accuracy.series] == [2] * 8 and accuracy.missing


def test_identical_curves_are_named_in_the_legend_and_the_index(tmp_path):
    """STAPO that silenced nothing is JustRL to the bit: drawn over it, it hides it; the series says so."""
    scores, runs = _write_study(tmp_path, "m", ("arith",))
    (runs / "m" / "stapo" / "metrics.jsonl").write_text((runs / "m" / "justrl" / "metrics.jsonl").read_text())
    metrics = report.load_metrics(runs)
    entropy = figure_series("entropy", "m", [], metrics, list(METHODS))
    assert [s.same_as for s in entropy.series] == [None, None, None, "justrl"]
    assert entropy.notes() == ["stapo is identical to justrl (drawn over it, so only one line shows)"]
    report.write_report(scores, runs, tmp_path / "results")
    index = (tmp_path / "results" / "figures.md").read_text()
    assert "  - note: STAPO is identical to JustRL (drawn over it, so only one line shows)" in index  # entropy
    assert "  - note: STAPO is identical to GRPO (drawn over it" in index  # reward: every method logs the same
    from stapo.report.figures import draw_figure

    fig = draw_figure("entropy", "m", [], metrics, list(METHODS))
    assert "STAPO (same values as JustRL, drawn over it)" in fig.axes[0].get_legend_handles_labels()[1]


def test_several_seeds_diagnostics_and_examples_are_found(tmp_path):
    """A several-seed study keeps its diagnostics under runs/<model>/<method>/seed<k>/: the quadrant and quantile
    figures pool or average the seeds (the committed mini-study's were blank 'no data' panels)."""
    diagnostics = {("m", f"stapo/seed{k}"): rows for k, rows in enumerate(_diagnostics().values() for _ in "ab")
                   for rows in rows}
    quadrants = figure_series("quadrants", "m", [], {}, ["stapo"], diagnostics)
    assert quadrants.missing is None and quadrants.of("stapo").counts == (60, 54, 48, 0)  # both seeds pooled
    quantiles = figure_series("entropy_quantiles", "m", [], {}, ["stapo"], diagnostics)
    assert quantiles.of("stapo", "entropy_q50").values == pytest.approx([1.5, 2.5])
    run = tmp_path / "runs" / "m" / "stapo" / "seed1"
    run.mkdir(parents=True)
    (run / "silenced_examples.jsonl").write_text(json.dumps({"step": 2, "token": "x"}) + "\n")
    assert results.load_examples(tmp_path / "runs") == {("m", "stapo"): [{"step": 2, "token": "x"}]}
    study = stapo_study.default()
    assert "diagnostics were logged" in report.render_examples({}, ["m"], ["stapo"], study, diagnosed=True)
    assert "set train.diagnostics_every > 0" in report.render_examples({}, ["m"], ["stapo"], study)


def _inputs(tmp_path, benchmarks=("arith",), ckpts=("final",)):
    scores, runs = _write_study(tmp_path, "m", benchmarks, ckpts=ckpts)
    return report.load_scores(scores), report.load_metrics(runs), ["base", *METHODS]


def test_metric_figures_plot_each_methods_logged_values_per_step(tmp_path):
    scores, metrics, methods = _inputs(tmp_path)
    entropy = figure_series("entropy", "m", scores, metrics, methods)
    assert [s.method for s in entropy.series] == list(METHODS)  # the base model has no training curve
    for i, method in enumerate(METHODS, 1):  # _write_study: entropy_mean = 0.5 + 0.01 · step · (method index)
        logged = [r["entropy_mean"] for r in metrics[("m", method)]]
        assert entropy.of(method).steps == (1, 2, 3, 4, 5)
        assert entropy.of(method).values == pytest.approx([0.5 + 0.01 * s * i for s in range(1, 6)]) == logged
    reward = figure_series("reward", "m", scores, metrics, methods)
    assert reward.of("grpo").values == pytest.approx([-0.9, -0.8, -0.7, -0.6, 0.123])  # resumed step 5: last line
    silenced = figure_series("silenced", "m", scores, metrics, methods)  # log scale: positive fractions only
    assert [s.method for s in silenced.series] == ["stapo"]
    assert silenced.of("stapo").values == pytest.approx([1e-5 * s for s in range(1, 6)])


def test_long_metric_curves_are_smoothed_over_a_fiftieth_of_the_run():
    rows = [{"step": s, "entropy_mean": float(s % 2)} for s in range(1, 101)]  # 0/1 alternating: window 2 -> 0.5
    values = figure_series("entropy", "m", [], {("m", "stapo"): rows}, ["stapo"]).of("stapo").values
    assert values[0] == 1.0 and set(values[1:]) == {0.5}


def test_accuracy_figure_plots_checkpoints_at_their_rollout_step_from_the_base_score(tmp_path):
    scores, metrics, methods = _inputs(tmp_path, ("arith", "math500"), ckpts=("final", "checkpoint-2"))
    panel = figure_series("accuracy", "m", scores, metrics, methods)
    assert panel.ylabel == "Arith accuracy (%)"  # no AIME24: the best-covered benchmark (arith sorts first)
    assert {(s.method, s.variant) for s in panel.series} == {(m, t) for m in METHODS for t in SETTINGS}
    for i, method in enumerate(METHODS, 1):  # accuracy = 10 + method index + 0.5 · setting index on arith
        for k, setting in enumerate(SETTINGS):
            s = panel.of(method, setting)
            assert s.steps == (0, 2, 5) and s.values == (10 + 0.5 * k, 10 + i + 0.5 * k, 10 + i + 0.5 * k)
    scores, metrics, methods = _inputs(tmp_path / "aime", ("arith", "aime24"))
    assert figure_series("accuracy", "m", scores, metrics, methods).ylabel == "AIME24 accuracy (%)"
    empty = figure_series("accuracy", "other", scores, metrics, methods)
    assert empty.series == () and empty.ylabel is None


def _diagnostics(methods=("stapo",)) -> dict:
    """Two logged steps; at step s quadrant i has s·(10 − i) tokens of mean ‖∇J‖ s/(i + 1), high-p high-H none."""
    rows = []
    for step in (1, 2):
        row = {"step": step, **{f"entropy_q{q}": q / 100 + step for q in (10, 25, 50, 75, 90)}}
        for i, q in enumerate(("lowp_lowh", "lowp_highh", "highp_lowh", "highp_highh")):
            row[f"quadrant/{q}_count"] = step * (10.0 - i)
            row[f"quadrant/{q}_grad_norm"] = step / (i + 1) if i < 3 else None
        rows.append(row)
    return {("m", method): rows for method in methods}


def test_quadrant_figure_weights_each_steps_mean_by_its_token_count():
    panel = figure_series("quadrants", "m", [], {}, ["grpo", "stapo"], _diagnostics())
    assert [s.method for s in panel.series] == ["stapo"]  # grpo logged no diagnostics
    bars = panel.of("stapo")
    assert bars.steps == ("lowp_lowh", "lowp_highh", "highp_lowh", "highp_highh")
    # (1·(10−i)·1/(i+1) + 2·(10−i)·2/(i+1)) / (3·(10−i)) = 5 / (3 (i+1)); the empty quadrant: 0 tokens, bar 0
    assert bars.values == pytest.approx([5 / 3, 5 / 6, 5 / 9, 0.0]) and bars.counts == (30, 27, 24, 0)
    assert figure_series("quadrants", "m", [], {}, ["grpo", "stapo"]).series == ()  # no diagnostics at all


def test_entropy_quantile_figure_has_five_curves_per_method():
    panel = figure_series("entropy_quantiles", "m", [], {}, ["grpo", "stapo", "justrl"],
                          _diagnostics(("stapo", "grpo")))
    assert [(s.method, s.variant) for s in panel.series] == [
        (m, f"entropy_q{q}") for m in ("grpo", "stapo") for q in (10, 25, 50, 75, 90)]
    median = panel.of("stapo", "entropy_q50")
    assert median.steps == (1, 2) and median.values == pytest.approx([1.5, 2.5])


def test_unknown_figure_kind_is_an_error_naming_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown figure kind 'entropi'; expected one of entropy, reward, accuracy"):
        figure_series("entropi", "m", [], {}, ["stapo"])


def test_paper_numbers_are_keyed_by_our_model_and_method_keys(tmp_path):
    paper = report.load_paper()
    assert paper[("qwen3-1.7b-base", "stapo", "aime24", "t1.0_p1.0")] == 17.40
    assert paper[("qwen3-1.7b-base", "entropy20", "avg", "t0.7_p0.9")] == 33.08
    assert {k[1] for k in paper} == {"grpo", "entropy20", "justrl", "stapo"}
    bad = tmp_path / "paper.csv"
    bad.write_text("model,method,benchmark,setting,accuracy\nQwen3-1.7B-Base,DAPO,aime24,t1.0_p1.0,1.0\n")
    with pytest.raises(ValueError, match="paper.csv:2: method 'DAPO'"):
        report.load_paper(bad)


def test_metrics_resume_keeps_last_line_per_step(tmp_path):
    _, runs = _write_study(tmp_path, "m", ("arith",))
    rows = report.load_metrics(runs)[("m", "stapo")]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5] and rows[-1]["reward_mean"] == 0.123


def test_bad_summary_names_the_file(tmp_path):
    bad = tmp_path / "scores" / "m" / "grpo" / "final" / "arith" / "t1.0_p1.0.summary.json"
    bad.parent.mkdir(parents=True)
    bad.write_text('{"accuracy": 3}')
    with pytest.raises(ValueError, match="t1.0_p1.0.summary.json.*avg_at_n"):
        report.load_scores(tmp_path / "scores")


ARITH_30x4 = "eval: {limit: 30, benchmarks: {arith: {samples: 4}}}\n"  # what _write_study's cells hold


def test_cli_dispatches_report(tmp_path):
    from stapo.cli import main

    scores, runs = _write_study(tmp_path, "m", ("arith",))
    cfg = tmp_path / "study.yaml"
    cfg.write_text("study: cli\nmodels: {m: {spec: x}}\nmethods: {stapo: {objective: stapo}}\n" + ARITH_30x4)
    assert main(["report", "--scores", str(scores), "--runs", str(runs), "--out", str(tmp_path / "r"),
                 "--config", str(cfg)]) == 0
    assert (tmp_path / "r" / "table.md").read_text().startswith("# STAPO reproduction — study `cli`")


def test_bare_report_follows_the_study_the_workflow_wrote_into_its_out_dir(tmp_path, monkeypatch, capsys):
    """After the demo, a bare ``stapo report`` (defaults scores/, runs/, results/) keeps the demo's study and its
    name, from results/study.yaml, instead of rewriting results/ as the paper's study (issue 32)."""
    from stapo.cli import main

    _write_study(tmp_path, "m", ("arith",))
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "study.yaml").write_text("study: tiny\nmodels: {m: {spec: x}}\n"
                                                     "methods: {stapo: {objective: stapo}}\n" + ARITH_30x4)
    monkeypatch.chdir(tmp_path)
    assert main(["report"]) == 0
    assert (tmp_path / "results" / "table.md").read_text().startswith("# STAPO reproduction — study `tiny`")
    assert "following the study in results/study.yaml" in capsys.readouterr().out
    assert report.study_config("other.yaml", "results") == Path("other.yaml")  # --config wins
    assert report.study_config(None, tmp_path / "empty") is None


def test_silenced_examples_table(tmp_path):
    scores, runs = _write_study(tmp_path, "m", ["arith"])
    diag = []
    for step in (1, 2):
        row = {"step": step, **{f"entropy_q{q}": 0.1 * q / 10 + step for q in (10, 25, 50, 75, 90)}}
        for i, q in enumerate(("lowp_lowh", "lowp_highh", "highp_lowh", "highp_highh")):
            row[f"quadrant/{q}_count"] = 10.0 - i
            row[f"quadrant/{q}_grad_norm"] = 1.0 / (i + 1) if i < 3 else None  # an empty quadrant
        diag.append(row)
    (runs / "m" / "stapo" / "diagnostics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in diag))
    example = {"step": 2, "token": " seven", "context": "so the answer | is", "p": 1.5e-4, "entropy": 0.31,
               "advantage": 0.8,
               "top": [{"token": " 7", "p": 0.91}] + [{"token": f"t{i}", "p": 0.01} for i in range(4)]}
    (runs / "m" / "stapo" / "silenced_examples.jsonl").write_text(json.dumps(example) + "\n")
    out = tmp_path / "results"
    report.write_report(scores, runs, out, study_of(models=["m"]))
    md = (out / "silenced_examples.md").read_text()
    assert "## m / STAPO" in md and "` seven`" in md and "1.50e-04" in md and "` 7` 0.910" in md
    assert "answer \\| is" in md  # a pipe in the context cannot break the table
    assert "## m / JustRL" not in md  # runs without examples get no section


def test_examples_table_says_when_nothing_was_logged(tmp_path):
    scores, runs = _write_study(tmp_path, "m", ["arith"])
    report.write_report(scores, runs, tmp_path / "results", study_of(models=["m"]))
    assert "No examples logged" in (tmp_path / "results" / "silenced_examples.md").read_text()


def test_figures_count_rollout_steps():
    """x = the paper's training step (rollout batch): a batch's k optimiser steps are averaged, and checkpoint-N
    (named by optimiser step) sits at its rollout step."""
    rows = [{"step": s, "rollout_step": (s + 3) // 4, "entropy_mean": float(s)} for s in range(1, 9)]
    assert step_series(rows, "entropy_mean") == ([1, 2], [2.5, 6.5])
    assert step_series([{"step": 3, "entropy_mean": 1.0}], "entropy_mean") == ([3], [1.0])  # older logs: step
    assert step_of("checkpoint-4", rows) == 1 and step_of("checkpoint-8", rows) == 2
    assert step_of("final", rows) == 2 and step_of("base", rows) == 0 and step_of("checkpoint-4", []) is None
    entropy = figure_series("entropy", "m", [], {("m", "stapo"): rows}, ["stapo"]).of("stapo")
    assert (entropy.steps, entropy.values) == ((1, 2), (2.5, 6.5))


def _verified_summary(path: Path, rule: float, corrected: float | None, protocol: str | None = "justrl",
                      verifier: str = "opencompass/CompassVerifier-3B") -> None:
    summary = {"avg_at_n": rule, "ci95": [rule - 1, rule + 1], "avg_at_n_fallback": rule + 5,
               "truncation_rate": 7.5, "no_box_rate": 40.0, "n_samples": 4, "problems": 30,
               "generation": {} if protocol is None else {"protocol": protocol}}
    if corrected is not None:
        summary.update(avg_at_n_corrected=corrected, ci95_corrected=[corrected - 3, corrected + 3],
                       verifier={"model": verifier, "judged": 10})
    write_cell(path, summary)


def test_verifier_corrected_and_rule_only_side_by_side_in_each_cell(tmp_path):
    scores, runs = tmp_path / "scores", tmp_path / "runs"
    for method, (rule, corrected) in {"base": (10.0, 12.5), "stapo": (20.0, 26.0)}.items():
        ckpt = "base" if method == "base" else "final"
        for setting in SETTINGS:
            _verified_summary(scores / "m" / method / ckpt / "aime24" / f"{setting}.summary.json", rule, corrected)
    report.write_report(scores, runs, tmp_path / "results", study_of("v"))
    table = (tmp_path / "results" / "table.md").read_text()
    rows = _rows(table)
    assert list(rows) == ["Base", "STAPO"]  # no separate "(rule only)" rows
    assert rows["STAPO"] == ["26.00 / 20.00 (26.00 / 20.00)"] * 2  # AIME24 and Avg
    assert rows["Base"][-1] == "12.50 / 10.00 (12.50 / 10.00)"
    assert "Each cell: **verifier-corrected / rule-only** accuracy (%)." in table
    assert "Cells: verifier-corrected / rule-only accuracy." in table
    assert "Evaluation protocol: eval.protocol justrl, verifier: opencompass/CompassVerifier-3B." in table
    tex = (tmp_path / "results" / "table.tex").read_text()
    assert "verifier-corrected / rule-only accuracy (\\%)" in tex and "26.00 / 20.00 (26.00 / 20.00)" in tex
    with open(tmp_path / "results" / "scores.csv", newline="") as f:
        rows_csv = list(csv.DictReader(f))
    cell = next(r for r in rows_csv if r["method"] == "stapo" and r["benchmark"] == "aime24")
    assert float(cell["accuracy"]) == 26.0 and float(cell["ci95_lo"]) == 23.0
    assert (float(cell["rule_accuracy"]), float(cell["corrected_accuracy"]), float(cell["fallback_accuracy"])) == \
        (20.0, 26.0, 25.0)
    assert (float(cell["truncation_rate"]), float(cell["no_box_rate"])) == (7.5, 40.0)
    assert (cell["protocol"], cell["verifier"]) == ("justrl", "opencompass/CompassVerifier-3B")
    avg = next(r for r in rows_csv if r["method"] == "stapo" and r["benchmark"] == "avg")
    assert (float(avg["rule_accuracy"]), float(avg["corrected_accuracy"])) == (20.0, 26.0)


def test_without_verifier_the_table_says_rule_only_and_has_no_extra_rows(tmp_path):
    scores, runs = _write_study(tmp_path, "m", ("arith",))
    report.write_report(scores, runs, tmp_path / "results", study_of("tiny"))
    table = (tmp_path / "results" / "table.md").read_text()
    assert not any("(rule only)" in label or "/" in "".join(cells) for label, cells in _rows(table).items())
    assert "no LLM-verifier correction" in table
    # summaries from before eval.protocol was recorded say so
    assert "Evaluation protocol: eval.protocol not recorded, verifier: none — rule-only grading." in table


def test_rule_stage_is_named_and_the_samples_it_moves_counted(tmp_path):
    """Each summary's rule stage (eval.protocol) in a footnote, with the samples the other stage judges otherwise;
    both stages' rule-only accuracies in scores.csv. A summary from before the stage was recorded: math-verify."""
    scores, runs = tmp_path / "scores", tmp_path / "runs"
    for method in ("base", "stapo"):
        for setting in SETTINGS:
            ckpt = "base" if method == "base" else "final"
            path = scores / "m" / method / ckpt / "aime24" / f"{setting}.summary.json"
            _verified_summary(path, 20.0, None)
            summary = json.loads(path.read_text())
            summary.update(rule_stage="justrl", avg_at_n_justrl=20.0, avg_at_n_harness=17.5, rule_moved=3)
            atomic_write_json(path, summary)
    report.write_report(scores, runs, tmp_path / "results", study_of("v"))
    table = (tmp_path / "results" / "table.md").read_text()
    assert "Rule stage: JustRL's grade_answer_verl (last \\boxed{}; mathd normalisation, then sympy) against " \
           "JustRL's golds." in table
    assert "judges 12 of 480 samples differently" in table  # 4 cells x 3 samples; 4 cells x 30 problems x 4
    with open(tmp_path / "results" / "scores.csv", newline="") as f:
        cell = next(r for r in csv.DictReader(f) if r["method"] == "stapo" and r["benchmark"] == "aime24")
    assert (cell["rule_stage"], float(cell["rule_accuracy_justrl"]), float(cell["rule_accuracy_harness"]),
            cell["rule_moved_samples"]) == ("justrl", 20.0, 17.5, "3")
    for path in scores.rglob("*.summary.json"):
        _verified_summary(path, 20.0, None)  # before the rule stage was recorded
    report.write_report(scores, runs, tmp_path / "results", study_of("v"))
    table = (tmp_path / "results" / "table.md").read_text()
    assert "Rule stage: strict: the final \\boxed{} answer (math-verify)." in table and "differently" not in table


def _run_config(runs: Path, model: str, method: str, loss_agg_mode="token-mean", quantile_scope="mini_batch",
                prompt="stripped", normaliser=None) -> None:
    config = {"model": {"key": model}, "method": {"key": method, "loss_agg_mode": loss_agg_mode,
                                                   "quantile_scope": quantile_scope},
              "train": {"prompt": prompt, "max_steps": 5}, "trl": {"max_steps": 20}}
    if normaliser is not None:
        config["trl"]["normaliser"] = normaliser
    (runs / model / method).mkdir(parents=True, exist_ok=True)
    (runs / model / method / "config.yaml").write_text(yaml.safe_dump(config))


def _protocol_table(tmp_path, evals: dict, configs: dict) -> str:
    scores, runs = tmp_path / "scores", tmp_path / "runs"
    for method, (protocol, verifier) in evals.items():
        ckpt = "base" if method == "base" else "final"
        for setting in SETTINGS:
            _verified_summary(scores / "m" / method / ckpt / "aime24" / f"{setting}.summary.json", 20.0,
                              None if verifier is None else 25.0, protocol, verifier or "")
    for method, kw in configs.items():
        _run_config(runs, "m", method, **kw)
    report.write_report(scores, runs, tmp_path / "results", study_of("p"))
    return (tmp_path / "results" / "table.md").read_text()


def test_footnotes_name_one_protocol_when_runs_and_evaluations_agree(tmp_path):
    cv = "opencompass/CompassVerifier-3B"
    table = _protocol_table(tmp_path, {"base": ("justrl", cv), "justrl": ("justrl", cv), "stapo": ("justrl", cv)},
                            {"justrl": {"quantile_scope": None}, "stapo": {}})
    assert f"Evaluation protocol: eval.protocol justrl, verifier: {cv}." in table
    assert ("Training protocol (runs/<model>/<method>/config.yaml): loss_agg_mode token-mean; quantile_scope MIXED "
            "(JustRL None, STAPO mini_batch); train.prompt stripped; trl.normaliser not recorded.") in table
    assert "MIXED evaluation" not in table


def test_footnotes_say_mixed_protocols_per_method(tmp_path):
    cv = "opencompass/CompassVerifier-3B"
    table = _protocol_table(tmp_path, {"base": ("justrl", cv), "justrl": ("harness", None), "stapo": ("justrl", cv)},
                            {"justrl": {"prompt": "justrl_raw", "normaliser": "tokens"},
                             "stapo": {"normaliser": "tokens"}})
    assert ("MIXED evaluation protocols — per method: Base: eval.protocol justrl, verifier: " + cv + "; JustRL: "
            "eval.protocol harness, verifier: none — rule-only grading; STAPO: eval.protocol justrl, verifier: "
            + cv + ".") in table
    assert "train.prompt MIXED (JustRL justrl_raw, STAPO stripped); trl.normaliser tokens." in table
    rows = _rows(table)
    assert rows["JustRL"][0] == "20.00 (20.00)" and rows["STAPO"][0] == "25.00 / 20.00 (25.00 / 20.00)"
    assert rows["JustRL"][-1] == "20.00 (20.00)"  # Avg of uncorrected cells: one number


def test_footnotes_name_runs_without_a_recorded_config(tmp_path):
    table = _protocol_table(tmp_path, {"justrl": ("justrl", None), "stapo": ("justrl", None)}, {"stapo": {}})
    assert "trl.normaliser not recorded; no recorded config for JustRL." in table


def test_report_follows_the_study_settings_benchmarks_labels_and_curve(tmp_path):
    """Three settings, a study's own benchmark and labels, its curve benchmark: nothing is hard-wired to the paper."""
    settings = ("t1.0_p1.0", "t0.7_p0.9", "t0.6_p0.95")
    scores, runs = tmp_path / "scores", tmp_path / "runs"
    for method, ckpts in (("base", ("base",)), ("stapo_b", ("final", "checkpoint-2"))):
        for j, bench in enumerate(("arith", "gsm_tiny")):
            for ckpt in ckpts:
                for k, setting in enumerate(settings):
                    acc = 10 + 5 * j + k + (20 if method != "base" else 0) + (1 if ckpt == "final" else 0)
                    _summary(scores / "m" / method / ckpt / bench / f"{setting}.summary.json", acc)
    (runs / "m" / "stapo_b").mkdir(parents=True)
    (runs / "m" / "stapo_b" / "metrics.jsonl").write_text("".join(
        json.dumps({"step": s, "entropy_mean": 0.5}) + "\n" for s in range(1, 5)))
    data = tmp_path / "gsm_tiny.jsonl"
    data.write_text('{"id": "g", "problem": "p", "answer": "1"}\n')
    study = stapo_study.parse({
        "study": "own", "models": {"m": {"spec": "x"}},
        "methods": {"stapo_b": {"objective": "stapo", "tau_p": 0.01, "label": "STAPO τp 0.01"}},
        "eval": {"benchmarks": {"gsm_tiny": {"file": str(data), "label": "GSM tiny"}, "arith": {}},
                 "settings": {"t1.0_p1.0": {"temperature": 1.0, "top_p": 1.0},
                              "t0.7_p0.9": {"temperature": 0.7, "top_p": 0.9},
                              "t0.6_p0.95": {"temperature": 0.6, "top_p": 0.95}}},
        "workflow": {"curve_benchmark": "gsm_tiny", "curve_settings": ["t0.6_p0.95"]}},
        required=(), check_runs=False)
    report.write_report(scores, runs, tmp_path / "results", study)
    table = (tmp_path / "results" / "table.md").read_text()
    assert "| Method | Arith | GSM tiny | Avg |" in table
    rows = _rows(table)
    assert list(rows) == ["Base", "STAPO τp 0.01"]
    assert rows["STAPO τp 0.01"] == ["31.00 (32.00, 33.00)", "36.00 (37.00, 38.00)", "33.50 (34.50, 35.50)"]
    assert "at T 1 / top-p 1 (T 0.7 / top-p 0.9, T 0.6 / top-p 0.95)" in table
    csv_rows = list(csv.DictReader((tmp_path / "results" / "scores.csv").open()))
    assert {r["setting"] for r in csv_rows if r["benchmark"] == "avg"} == set(settings)
    panel = figure_series("accuracy", "m", report.load_scores(scores), report.load_metrics(runs), ["stapo_b"],
                          study=study)
    assert panel.ylabel == "GSM tiny accuracy (%)"  # the study's curve benchmark, though arith sorts first
    assert [s.variant for s in panel.series] == list(settings)  # the study's order of settings
    assert panel.of("stapo_b", "t0.6_p0.95").values == (17.0, 37.0, 38.0)  # base, checkpoint-2, final
    assert study.label("settings", "t0.6_p0.95") == "T0.6/p0.95"


def test_row_average_ci_stays_within_0_and_100_and_one_benchmark_keeps_its_own():
    from stapo.report.comparison import mean_ci

    def score(acc, lo, hi):
        return report.Score("m", "stapo", "final", "arith", "t1.0_p1.0", acc, lo, hi)

    assert mean_ci([score(95.8, 89.6, 100.0)]) == (95.8, 89.6, 100.0)  # not 95.8 ± 5.2 = [90.6, 101.0]
    mean, lo, hi = mean_ci([score(98.0, 92.0, 100.0), score(99.0, 95.0, 100.0)])
    half = ((4.0 ** 2 + 2.5 ** 2) ** 0.5) / 2  # 2.36: 98.5 + 2.36 would pass 100
    assert mean == pytest.approx(98.5) and lo == pytest.approx(98.5 - half) and hi == 100.0
    assert mean_ci([score(1.0, 0.0, 4.0), score(0.0, 0.0, 2.0)])[1] == 0.0


def test_footnotes_name_per_method_training_overrides(tmp_path):
    """A method trained with its own recipe (methods.<key>.train) is named in the table's footnotes."""
    scores, runs = tmp_path / "scores", tmp_path / "runs"
    for method in ("base", "entropy20"):
        ckpt = "base" if method == "base" else "final"
        for setting in SETTINGS:
            _verified_summary(scores / "m" / method / ckpt / "aime24" / f"{setting}.summary.json", 20.0, None,
                              "justrl", "")
    _run_config(runs, "m", "entropy20")
    config = {"study": "p", "methods": {"entropy20": {"objective": "entropy20", "train": {
        "prompts_per_generation": 512, "num_generations": 16, "prompts_per_step": 32}}}}
    study = stapo_study.parse(config, required=(), check_runs=False)
    report.write_report(scores, runs, tmp_path / "results", study)
    table = (tmp_path / "results" / "table.md").read_text()
    assert ("Per-method training overrides (methods.<key>.train, over the shared train section): 20-Entropy: "
            "prompts_per_generation 512, num_generations 16, prompts_per_step 32.") in table
    report.write_report(scores, runs, tmp_path / "plain", study_of("p"))
    assert "Per-method training overrides" not in (tmp_path / "plain" / "table.md").read_text()


def test_rows_and_curves_are_grouped_by_family(tmp_path):
    """The paper's four, verl's losses and TRL's loss types (stapo.study.methods.Family) each under a heading row
    of the table, in family order whatever the study's order; each family's curves in its own line style, with one
    grey legend entry per family."""
    from stapo.report.figures import _family_styles, draw_figure

    methods = ("vespo", "grpo", "dppo_tv", "stapo", "dr_grpo")
    scores, runs = tmp_path / "scores", tmp_path / "runs"
    for i, method in enumerate(("base",) + methods):
        for setting in SETTINGS:
            _summary(scores / "m" / method / ("base" if method == "base" else "final") / "arith" /
                     f"{setting}.summary.json", 10 + i)
        if method != "base":
            (runs / "m" / method).mkdir(parents=True)
            (runs / "m" / method / "metrics.jsonl").write_text(
                "".join(json.dumps({"step": s, "entropy_mean": 0.1 * i + s}) + "\n" for s in (1, 2, 3)))
    study = study_of("grouped", models=("m",), methods=methods)
    report.write_report(scores, runs, tmp_path / "results", study)
    table = (tmp_path / "results" / "table.md").read_text()
    rows = [line.split("|")[1].strip() for line in table.splitlines() if line.startswith("| ")][1:]
    assert rows == ["Base", "**The paper's four (STAPO, Table 2)**", "GRPO", "STAPO", "**verl 0.9.1's policy losses**",
                    "DPPO-TV", "**TRL 1.16's loss types**", "Dr. GRPO", "VESPO"]
    assert "| **verl 0.9.1's policy losses** | | |" in table  # a heading row: empty cells
    tex = (tmp_path / "results" / "table.tex").read_text()
    assert r"\midrule \multicolumn{3}{l}{\emph{TRL 1.16's loss types}} \\" in tex
    scores_, metrics = report.load_scores(scores), report.load_metrics(runs)
    panel = figure_series("entropy", "m", scores_, metrics, list(methods), study=study)
    assert {m: style for m, (style, _) in _family_styles(panel, study).items()} == {
        "grpo": "-", "stapo": "-", "dppo_tv": "--", "vespo": ":", "dr_grpo": ":"}
    fig = draw_figure("entropy", "m", scores_, metrics, list(methods), study=study)
    labels = fig.axes[0].get_legend_handles_labels()[1]
    assert labels[-3:] == ["The paper's four (STAPO, Table 2)", "verl 0.9.1's policy losses", "TRL 1.16's loss types"]


def test_table_says_how_many_tokens_the_s2t_mask_silenced_and_names_a_tau_p_departure(tmp_path):
    """Issue 42: the demo's STAPO row says what its mask did (counts from metrics.jsonl's silenced_fraction ×
    completion_tokens) and a τ_p other than the paper's is printed beside the paper's."""
    scores, runs = _write_study(tmp_path, "smollm2-135m", ("arith",))
    rows = [{"step": 1, "silenced_fraction": 0.01, "completion_tokens": 200.0},
            {"step": 2, "silenced_fraction": 0.0, "completion_tokens": 150.0},
            {"step": 3, "silenced_fraction": 0.02, "completion_tokens": 150.0}]
    (runs / "smollm2-135m" / "stapo" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert report.silencing(rows) == (5.0, 500.0, 2, 3)
    study = stapo_study.parse({"study": "tiny", "methods": {
        "grpo": {"objective": "grpo"}, "entropy20": {"objective": "entropy20"}, "justrl": {"objective": "justrl"},
        "stapo": {"objective": "stapo", "tau_p": 0.1}}}, required=(), check_runs=False)
    report.write_report(scores, runs, tmp_path / "results", study)
    table = (tmp_path / "results" / "table.md").read_text()
    assert ("S2T mask (metrics.jsonl): STAPO silenced 5 of 500 completion tokens (1.00 %) at 2 of 3 optimiser steps; "
            "τ_p 0.1 (the paper's 0.002), q 0.75. The tokens") in table
    assert "JustRL silenced" not in table  # only the S2T-masked methods
    old = [{"step": 1, "silenced_fraction": 0.0}]  # a run logged before completion_tokens: steps only
    assert report.silencing(old) == (None, None, 0, 1)


def test_each_cell_links_its_interval(tmp_path):
    """intervals.md: the table's layout with each cell's 95 % interval (the summary's bootstrap CI; Avg combined)."""
    scores, runs = _write_study(tmp_path, "smollm2-135m", ("arith", "aime24"))
    report.write_report(scores, runs, tmp_path / "results", study_of("tiny"))
    assert "[intervals.md](intervals.md)" in (tmp_path / "results" / "table.md").read_text()
    rows = _rows((tmp_path / "results" / "intervals.md").read_text())
    # STAPO (i = 4): arith (j = 0) 14.0 / 14.5 and aime24 (j = 1) 15.0 / 15.5, each ± 2; Avg ± sqrt(2·2²)/2
    assert rows["STAPO"][:2] == ["13.0–17.0 (13.5–17.5)", "12.0–16.0 (12.5–16.5)"]  # columns: AIME24, Arith
    assert rows["STAPO"][2] == "13.1–15.9 (13.6–16.4)"
