"""stapo.report.comparison on synthetic runs and scores of the ablation study (configs/paper.yaml overlaid with
configs/ablations.yaml, as the workflow merges them): what each comparison figure plots, which methods it takes
(from their objectives and parameters, never their keys), and the report's skipped figures and figure index."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest
import yaml

from stapo.report import table as report
from stapo import study as stapo_study
from helpers.cells import write_cell
from stapo.report.comparison import COMPARISON_KINDS, ENTROPY_STABILITY, comparison_series, entropy_instability

REPO = Path(__file__).resolve().parents[1]
MODELS = ("qwen3-1.7b-base", "qwen3-8b-base")
BENCHES = ("aime24", "math500")
SETTINGS = ("t1.0_p1.0", "t0.7_p0.9")
STEPS = range(1, 11)
TAU_P = ("stapo", "stapo_tp5e-3", "stapo_tp2e-2", "stapo_tp5e-2", "stapo_tp2e-1")  # 0.002 ... 0.2
Q = ("stapo_q0.25", "stapo_q0.5", "stapo", "stapo_q0.9")  # 0.25, 0.5, 0.75 (stapo), 0.9


def _merge(base: dict, over: dict) -> dict:
    """Snakemake's merge of --configfile files: nested mappings update, other values replace."""
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def ablation_config(**workflow) -> dict:
    paper = yaml.safe_load((REPO / "configs" / "paper.yaml").read_text())
    config = _merge(paper, yaml.safe_load((REPO / "configs" / "ablations.yaml").read_text()))
    config["workflow"] = {**config["workflow"], "models": list(MODELS), **workflow}
    return config


def parse(config: dict) -> stapo_study.Study:
    return stapo_study.parse(config, required=(), check_runs=False)


def accuracy(i: int, j: int, k: int) -> float:
    """Final accuracy of method index i (study order) on benchmark j at setting k."""
    return 10.0 + i + 5 * j + 0.5 * k


def slope(i: int) -> float:
    """Method i's mean entropy rises by slope(i) per step: its instability is slope(i) · pstdev(steps 2..10)."""
    return 0.01 * (1 + i % 3)


def write_runs(tmp: Path, study: stapo_study.Study, models=MODELS) -> tuple[Path, Path]:
    """Final scores (CI ± 1 + j), metrics (entropy, silenced fraction for the s2t masks), a FullMask curve point."""
    scores, runs = tmp / "scores", tmp / "runs"
    for mi, model in enumerate(models):
        for j, bench in enumerate(BENCHES):
            for k, setting in enumerate(SETTINGS):
                for i, method in enumerate(study.methods):
                    acc = accuracy(i, j, k) + mi
                    write_cell(scores / model / method / "final" / bench / f"{setting}.summary.json",
                               {"avg_at_n": acc, "ci95": [acc - 1 - j, acc + 1 + j], "n_samples": 4})
                base = 5.0 + j + mi
                write_cell(scores / model / "base" / "base" / bench / f"{setting}.summary.json",
                           {"avg_at_n": base, "ci95": [base - 1, base + 1], "n_samples": 4})
        if "stapo_full" in study.methods:
            write_cell(scores / model / "stapo_full" / "checkpoint-4" / "aime24" / "t1.0_p1.0.summary.json",
                       {"avg_at_n": 3.0, "ci95": [2.0, 4.0], "n_samples": 4})
        for i, method in enumerate(study.methods):
            s2t = study.methods[method].token_mask == "s2t"
            rows = [{"step": s, "entropy_mean": 0.5 + slope(i) * s,
                     "silenced_fraction": 1e-5 * s * (mi + 1) if s2t else 0.0,
                     # the cost fields of stapo.train.step_cost
                     "gen_seconds": 3.0 + i, "forward_seconds": 0.5, "update_seconds": 1.0 + mi,
                     "step_seconds": 4.5 + i + mi} for s in STEPS]
            (runs / model / method).mkdir(parents=True, exist_ok=True)
            (runs / model / method / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return scores, runs


@pytest.fixture(scope="module")
def ablation(tmp_path_factory):
    study = parse(ablation_config())
    scores, runs = write_runs(tmp_path_factory.mktemp("ablation"), study)
    return study, report.load_scores(scores), report.load_metrics(runs), ["base", *study.methods], (scores, runs)


def series_of(kind, ablation, model=MODELS[0]):
    study, scores, metrics, methods, _ = ablation
    return comparison_series(kind, model, scores, metrics, methods, study=study)


def test_the_ablation_study_declares_what_the_figures_compare():
    study = parse(ablation_config())
    assert list(study.methods)[:4] == ["grpo", "entropy20", "justrl", "stapo"] and len(study.methods) == 14
    assert {study.methods[m].token_mask for m in ("stapo_high", "stapo_random", "stapo_full")} == \
        {"s2t_high", "s2t_random", "s2t_full"}


def test_pareto_plots_each_trained_method_at_its_entropy_instability_and_final_accuracy(ablation):
    study, *_ = ablation
    panel = series_of("pareto", ablation)
    assert [s.method for s in panel.series] == list(study.methods)  # every trained method, base excluded
    spread = statistics.pstdev([float(s) for s in STEPS][1:])  # 10 steps: the first (10 %) is the warm-up
    for i, method in enumerate(study.methods):
        point = panel.of(method, panel.series[i].variant)
        assert point.steps == pytest.approx((slope(i) * spread,))
        assert point.values == (accuracy(i, 0, 0),) and (point.lo, point.hi) == ((accuracy(i, 0, 0) - 1,),
                                                                                    (accuracy(i, 0, 0) + 1,))
    # accuracy grows with the index, instability cycles 1, 2, 3 (× 0.01): only the last two are on the frontier
    assert [s.method for s in panel.series if s.variant == "frontier"] == list(study.methods)[12:]
    assert panel.ylabel.startswith("AIME24 final accuracy (%)") and "entropy instability" in panel.xlabel
    assert "not" in ENTROPY_STABILITY and "standard deviation" in ENTROPY_STABILITY


def test_entropy_instability_drops_the_warm_up_and_needs_two_steps():
    rows = [{"step": s, "entropy_mean": v} for s, v in enumerate([9.0, 1.0, 3.0, 1.0, 3.0], 1)]
    assert entropy_instability(rows) == pytest.approx(1.0)  # ceil(10 % of 5) = 1 step dropped: pstdev(1,3,1,3)
    assert entropy_instability(rows[:2]) is None and entropy_instability([]) is None


@pytest.mark.parametrize("kind, methods, values", [
    ("sweep_tau_p", TAU_P, (0.002, 0.005, 0.02, 0.05, 0.2)),
    ("sweep_q", Q, (0.25, 0.5, 0.75, 0.9))])
def test_sweeps_read_the_axis_from_the_methods_parameters_one_line_per_masking_strategy(ablation, kind, methods,
                                                                                        values):
    study, *_ = ablation
    index = list(study.methods).index
    panel = series_of(kind, ablation)
    assert [(s.method, s.variant) for s in panel.series] == [
        (mask, bench) for bench in ("aime24", "avg") for mask in ("s2t", "s2t_high", "s2t_random")]
    line = panel.of("s2t", "aime24")
    assert line.steps == values and line.points == methods
    assert line.values == tuple(accuracy(index(m), 0, 0) for m in methods)
    avg = panel.of("s2t", "avg")  # the mean over both benchmarks, CI half-width sqrt(1² + 2²)/2
    assert avg.values == pytest.approx([(accuracy(index(m), 0, 0) + accuracy(index(m), 1, 0)) / 2 for m in methods])
    assert [h - v for v, h in zip(avg.values, avg.hi)] == pytest.approx([math.sqrt(5) / 2] * len(methods))
    # the ablation study sweeps STAPO only: high-entropy and random masking are one point each, at the paper's value
    default = 0.002 if kind == "sweep_tau_p" else 0.75
    assert panel.of("s2t_high", "aime24").points == ("stapo_high",) and panel.of("s2t_high", "aime24").steps == \
        (default,)
    assert panel.of("s2t_random", "aime24").points == ("stapo_random",)


def test_masking_ablation_compares_the_four_masks_per_benchmark_with_cis_and_their_entropy(ablation):
    study, _, metrics, _, _ = ablation
    index = list(study.methods).index
    panel = series_of("masking_accuracy", ablation)
    masks = ("s2t", "s2t_high", "s2t_random", "s2t_full")
    assert [(s.method, s.variant) for s in panel.series] == list(
        zip(("stapo", "stapo_high", "stapo_random", "stapo_full"), masks))
    bars = panel.of("stapo_random", "s2t_random")
    i = index("stapo_random")
    assert bars.steps == ("aime24", "math500", "avg")
    assert bars.values == pytest.approx([accuracy(i, 0, 0), accuracy(i, 1, 0), accuracy(i, 0.5, 0)])
    assert bars.lo == pytest.approx([accuracy(i, 0, 0) - 1, accuracy(i, 1, 0) - 2,
                                     accuracy(i, 0.5, 0) - math.sqrt(5) / 2])
    entropy = series_of("masking_entropy", ablation)
    assert [s.method for s in entropy.series] == ["stapo", "stapo_high", "stapo_random", "stapo_full"]
    logged = [r["entropy_mean"] for r in metrics[(MODELS[0], "stapo_full")]]
    assert entropy.of("stapo_full", "s2t_full").values == pytest.approx(logged)


def test_fullmask_figure_has_entropy_and_accuracy_vs_step_on_two_axes(ablation):
    study, *_ = ablation
    panel = series_of("fullmask", ablation)
    assert [(s.method, s.variant) for s in panel.series] == [("stapo_full", "entropy"), ("stapo_full", "accuracy")]
    i = list(study.methods).index("stapo_full")
    assert panel.of("stapo_full", "entropy").steps == tuple(STEPS)
    acc = panel.of("stapo_full", "accuracy")  # base at step 0, checkpoint-4, final at step 10 (AIME24, T 1.0)
    assert acc.steps == (0, 4, 10) and acc.values == (5.0, 3.0, accuracy(i, 0, 0))
    assert acc.lo == (4.0, 2.0, accuracy(i, 0, 0) - 1)
    assert panel.ylabel == "mean token entropy (nats)" and panel.ylabel2 == "AIME24 accuracy (%)"


def test_spurious_ratio_has_one_curve_per_model_of_its_stapo_method(ablation):
    panel = series_of("spurious_ratio", ablation, model=list(MODELS))
    assert [(s.method, s.variant) for s in panel.series] == [("stapo", m) for m in MODELS]
    assert panel.of("stapo", MODELS[1]).values == pytest.approx([2e-5 * s for s in STEPS])


def test_comparisons_follow_parameters_not_keys():
    """A user's own sweep (any keys, any values) plots without code; keys that look like a sweep do not."""
    own = {"study": "own", "models": {"m": {"spec": "x"}}, "methods": {
        "alpha": {"objective": "stapo", "tau_p": 0.01}, "beta": {"objective": "stapo", "tau_p": 0.003},
        "gamma": {"objective": "stapo_high", "tau_p": 0.003}, "stapo_tp5e-3": {"objective": "justrl"},
        "delta": {"objective": "stapo_full", "tau_p": 0.003}}}
    study = parse(own)
    scores = [report.Score("m", m, "final", "aime24", "t1.0_p1.0", 10.0 + i, 9.0 + i, 11.0 + i)
              for i, m in enumerate(study.methods)]
    panel = comparison_series("sweep_tau_p", "m", scores, {}, list(study.methods), study=study)
    assert [(s.method, s.points, s.steps) for s in panel.series if s.variant == "aime24"] == [
        ("s2t", ("beta", "alpha"), (0.003, 0.01)), ("s2t_high", ("gamma",), (0.003,))]
    masking = comparison_series("masking_accuracy", "m", scores, {}, list(study.methods), study=study)
    assert [s.method for s in masking.series] == ["beta", "gamma", "delta"]  # alpha's tau_p differs
    assert comparison_series("sweep_q", "m", scores, {}, list(study.methods), study=study).missing


def test_the_main_study_skips_the_ablation_figures_saying_why(tmp_path):
    config = ablation_config()
    config["methods"] = {k: v for k, v in config["methods"].items() if k in ("grpo", "entropy20", "justrl", "stapo")}
    study = parse(config)
    scores, runs = write_runs(tmp_path, study)
    args = (report.load_scores(scores), report.load_metrics(runs), list(study.methods))
    missing = {kind: comparison_series(kind, MODELS[0], *args, study=study).missing for kind in COMPARISON_KINDS}
    assert missing["pareto"] is None
    assert "differ in tau_p alone" in missing["sweep_tau_p"] and "differ in entropy_quantile" in missing["sweep_q"]
    assert "found: s2t (stapo)" in missing["masking_accuracy"] and missing["masking_entropy"]
    assert missing["fullmask"] == "the study has no method with the s2t_full token mask"
    lines = []
    report.write_report(scores, runs, tmp_path / "results", study, log=lines.append)
    figures = tmp_path / "results" / "figures"
    assert (figures / f"{MODELS[0]}_pareto.png").exists() and not (figures / f"{MODELS[0]}_sweep_q.png").exists()
    assert f"report: figure {MODELS[0]}_fullmask skipped: the study has no method with the s2t_full token mask" \
        in lines
    compared = [line for line in lines if any(f"_{kind} skipped" in line for kind in COMPARISON_KINDS)]
    assert len(compared) == 5 * len(MODELS)  # sweeps (2), masking (2), fullmask per model
    index = (tmp_path / "results" / "figures.md").read_text()
    assert "- Qwen3-8B-Base: not drawn: needs methods with entropy curves of two or more" in index
    assert "- Qwen3-8B-Base: [png](figures/qwen3-8b-base_pareto.png)" in index


def test_report_on_the_ablation_study_writes_all_five_figure_groups_and_the_index(ablation, tmp_path):
    study, *_, (scores, runs) = ablation
    lines = []
    report.write_report(scores, runs, tmp_path / "results", study, log=lines.append)
    assert [line for line in lines if any(f"_{kind} skipped" in line for kind in COMPARISON_KINDS)
            or "spurious_ratio" in line] == []  # no comparison figure skipped
    figures = tmp_path / "results" / "figures"
    stems = [f"{m}_{k}" for m in MODELS for k in COMPARISON_KINDS] + ["spurious_ratio"]
    for stem in stems:
        assert (figures / f"{stem}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert (figures / f"{stem}.pdf").read_bytes()[:5] == b"%PDF-"
    index = (tmp_path / "results" / "figures.md").read_text()
    for stem in stems + [f"{m}_entropy" for m in MODELS]:
        assert f"[png](figures/{stem}.png) · [pdf](figures/{stem}.pdf)" in index
    for title in ("1. Accuracy vs entropy stability", "2. Sensitivity sweeps", "3. Masking-strategy ablation",
                  "4. JustRL-FullMask", "5. Spurious-token ratio across model sizes"):
        assert f"## {title}" in index
    assert "reproduces: v4 Fig. 1b" in index and "reproduces: Ablations: τ_p sweep" in index
    assert "[silenced_examples.md](silenced_examples.md)" in index and "not drawn:" not in index.split("## 1.")[1]
    assert "[figures.md](figures.md)" in (tmp_path / "results" / "table.md").read_text()
