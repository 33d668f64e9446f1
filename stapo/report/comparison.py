"""The report's comparison figures: methods set against each other by their objectives (the paper's v4 Fig. 1b,
its Ablations, the JustRL-FullMask probe, the spurious-token ratio across model sizes), pure series then drawing.

Which methods a figure compares is read from the study's methods, never from their keys: each method's
stapo.study.ObjectiveConfig gives its token mask (its declaration, stapo/study/methods.py) and its hyper-parameters.
Two methods share "the other parameters" when their ObjectiveConfig fields agree except ``method`` and ``seed`` (and the
swept one). A method the report finds (runs/, scores/) but the study does not declare is its own objective, its key
a declared method (stapo.study's rule for ``objective``). ``comparison_series`` returns a stapo.report.figures.Panel, as
stapo.report.figures.figure_series does. Each kind is declared once, at the end of this module, in the report's one
figure registry (stapo.report.kinds). Kinds, per model (``COMPARISON_KINDS``) unless noted:

    pareto            one point per trained method: x = entropy instability (``ENTROPY_STABILITY``), y = final
                      accuracy on the curve benchmark at the study's first setting, with its 95 % CI; ``variant``
                      "frontier" marks the methods no other method beats on both (lower x, higher y)
    sweep_tau_p,      final accuracy vs τ_p (``tau_p``) / q (``entropy_quantile``): one line per masking strategy
    sweep_q           (``method`` = the token mask: s2t = low-entropy STAPO, s2t_high, s2t_random; ``points`` = the
                      method of each point); the methods whose other parameters agree, the largest such set with two
                      or more values; ``variant`` = the curve benchmark or "avg" (the benchmarks every point has)
    masking_accuracy  the masking ablation: per token mask (s2t, s2t_high, s2t_random, s2t_full, ``variant``) the
                      first method of the set with equal other parameters that covers the most masks; final accuracy
                      per benchmark (every member has) + "avg", with CIs
    masking_entropy   the same set's mean-entropy curves (of the methods that logged one)
    fullmask          each s2t_full method: mean entropy (``variant`` "entropy", left axis) and curve-benchmark
                      accuracy (``variant`` "accuracy", right axis, base model at step 0) vs training step
    spurious_ratio    one figure for all models (``model`` = the list of model keys, ``STUDY_KINDS``): per model the
                      silenced fraction vs step of its s2t method (``variant`` = the model), positive values, log
                      scale, the 1e-4 reference line

A panel whose inputs are missing has no series and ``missing`` = one line saying why: the report skips it.
Scores are final checkpoints at the study's first setting (the table's headline) unless said otherwise.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from stapo import study as stapo_study
from stapo.report.kinds import GROUPS, FIGURES, FigureInputs, FigureKind, register_figure
from stapo.report.figures import (SILENCED_REFERENCE, STEP_LABEL, Panel, Series, curve_benchmark, mark_identical,
                                  settings_order, smooth, step_of, step_series, twin_label)
from stapo.study.names import BENCHMARKS
from stapo.study.objective import OBJECTIVES

__all__ = ["COMPARISON_KINDS", "STUDY_KINDS", "ENTROPY_STABILITY", "MASKS", "comparison_series",
           "entropy_instability", "masking_methods", "sweep_methods", "mean_ci"]

MASKS = {"s2t": "low-entropy (STAPO)", "s2t_high": "high-entropy", "s2t_random": "random",
         "s2t_full": "all candidates (FullMask)"}  # token mask -> the masking strategy it is
SWEEP_MASKS = ("s2t", "s2t_high", "s2t_random")
SWEEPS = {"sweep_tau_p": ("tau_p", "τ_p (probability threshold)"),
          "sweep_q": ("entropy_quantile", "q (quantile of the candidates' entropies giving τ_h)")}
UNCOMPARED = ("method", "seed")  # fields that do not make two methods' other parameters differ
WARMUP_FRACTION = 0.1
ENTROPY_STABILITY = ("entropy instability: the (population) standard deviation of the per-step mean token entropy "
                     "over the training steps after the first 10 % logged (nats; lower = more stable). The paper "
                     "does not define its \"entropy stability\" axis recoverably; this is our definition.")


# ------------------------------------------------------------------------------------------------ selection


def objective_of(study, method: str):
    """The method's ObjectiveConfig: the study's, else its key's declared objective; None when neither."""
    return study.methods.get(method) or OBJECTIVES.get(method)


def _mask_of(study, method: str) -> str | None:
    cfg = objective_of(study, method)
    return cfg.token_mask if cfg is not None else None


def _others(cfg, vary: tuple[str, ...] = ()) -> tuple:
    """The parameters two methods of one comparison must share (module docstring)."""
    return tuple((k, v) for k, v in dataclasses.asdict(cfg).items() if k not in UNCOMPARED + vary)


def masking_methods(study, methods: list[str]) -> dict[str, str]:
    """``{token mask: method}`` of the masking ablation, in ``MASKS`` order: among the methods of those masks with
    equal other parameters, the set covering the most masks (ties: the first in ``methods`` order), the first
    method of each mask."""
    groups: dict[tuple, dict[str, str]] = {}
    for m in methods:
        cfg = objective_of(study, m)
        if cfg is not None and cfg.token_mask in MASKS:
            groups.setdefault(_others(cfg), {}).setdefault(cfg.token_mask, m)
    best = max(groups.values(), key=len, default={})
    return {mask: best[mask] for mask in MASKS if mask in best}


def sweep_methods(study, methods: list[str], param: str) -> dict[str, list[tuple[float, str]]]:
    """``{token mask: [(value of param, method), ...] sorted}`` of the largest set of ``SWEEP_MASKS`` methods whose
    other parameters agree and which holds two or more values of ``param``; {} when the study sweeps nothing."""
    groups: dict[tuple, list] = {}
    for m in methods:
        cfg = objective_of(study, m)
        if cfg is not None and cfg.token_mask in SWEEP_MASKS:
            groups.setdefault(_others(cfg, (param,)), []).append((cfg, m))
    sweeps = [g for g in groups.values() if len({getattr(c, param) for c, _ in g}) >= 2]
    best = max(sweeps, key=len, default=[])
    lines = {}
    for mask in SWEEP_MASKS:
        points: dict[float, str] = {}
        for cfg, m in best:
            if cfg.token_mask == mask:
                points.setdefault(getattr(cfg, param), m)
        if points:
            lines[mask] = sorted(points.items())
    return lines


# ------------------------------------------------------------------------------------------------ series


def entropy_instability(rows: list[dict]) -> float | None:
    """``ENTROPY_STABILITY`` of one run's metrics rows; None with fewer than two steps after the warm-up."""
    _, ys = step_series(rows, "entropy_mean")
    kept = ys[math.ceil(WARMUP_FRACTION * len(ys)):]
    return statistics.pstdev(kept) if len(kept) >= 2 else None


def mean_ci(scores: list) -> tuple[float, float, float]:
    """Mean accuracy of ``scores`` and its 95 % CI: half-width sqrt(Σ h_i²)/k (independent benchmarks), within
    [0, 100]; one benchmark keeps its own (bootstrap, possibly asymmetric) interval."""
    if len(scores) == 1:
        return scores[0].accuracy, scores[0].ci_lo, scores[0].ci_hi
    mean = sum(s.accuracy for s in scores) / len(scores)
    half = math.sqrt(sum(((s.ci_hi - s.ci_lo) / 2) ** 2 for s in scores)) / len(scores)
    return mean, max(0.0, mean - half), min(100.0, mean + half)


def _finals(scores: list, model: str, study) -> tuple[dict, str | None]:
    """``{(method, benchmark): Score}`` of the final checkpoints of ``model`` at its first setting, and that key."""
    mine = [s for s in scores if s.model == model and s.ckpt == "final"]
    order = settings_order(study, mine)
    if not order:
        return {}, None
    return {(s.method, s.benchmark): s for s in mine if s.setting == order[0]}, order[0]


def _benchmarks(study, finals: dict, members) -> list[str]:
    """The benchmarks every one of ``members`` has a final score on, in the table's order."""
    keys = {b for _, b in finals if all((m, b) in finals for m in members)}
    preferred = list(dict.fromkeys(list(BENCHMARKS) + list(study.eval.benchmarks)))
    return [b for b in preferred if b in keys] + sorted(keys - set(preferred))


def _accuracy_label(study, setting: str) -> str:
    return f"final accuracy (%), {study.label('settings', setting)}"


def _pareto(model, scores, metrics, methods, study) -> Panel:
    finals, setting = _finals(scores, model, study)
    bench = curve_benchmark(study, list(finals.values()))
    points = []
    for m in methods:
        score, x = finals.get((m, bench)), entropy_instability(metrics.get((model, m), []))
        if score is not None and x is not None:  # the base model has no training curve, so no x
            points.append((m, x, score.accuracy, score))
    if len(points) < 2:
        return Panel("pareto", (), None, None, missing=f"needs two trained methods with a final score on "
                     f"{bench or 'a benchmark'} and two entropy steps after warm-up; {len(points)} found")

    def beaten(x, y):
        return any(x2 <= x and y2 >= y and (x2, y2) != (x, y) for _, x2, y2, _ in points)

    series = mark_identical([Series(m, (x,), (y,), None if beaten(x, y) else "frontier", lo=(s.ci_lo,),
                                    hi=(s.ci_hi,)) for m, x, y, s in points])  # a twin point hides the other
    return Panel("pareto", series, "entropy instability: std of mean entropy after warm-up (nats)",
                 f"{study.label('benchmarks', bench)} {_accuracy_label(study, setting)}")


def _sweep(kind, model, scores, metrics, methods, study) -> Panel:
    param, xlabel = SWEEPS[kind]
    finals, setting = _finals(scores, model, study)
    lines = sweep_methods(study, [m for m in methods if any(k[0] == m for k in finals)], param)
    if not lines:
        return Panel(kind, (), None, None, missing=f"no two methods with final scores of the token masks "
                     f"{', '.join(SWEEP_MASKS)} differ in {param} alone")
    members = [m for pts in lines.values() for _, m in pts]
    bench = curve_benchmark(study, [s for (m, _), s in finals.items() if m in members])
    series = []
    for variant, benches in ((bench, [bench]), ("avg", _benchmarks(study, finals, members))):
        for mask, pts in lines.items():
            got = [(x, m, mean_ci([finals[(m, b)] for b in benches])) for x, m in pts
                   if benches and all((m, b) in finals for b in benches)]
            if got:
                series.append(Series(mask, tuple(x for x, _, _ in got), tuple(v[0] for _, _, v in got), variant,
                                     lo=tuple(v[1] for _, _, v in got), hi=tuple(v[2] for _, _, v in got),
                                     points=tuple(m for _, m, _ in got)))
    return Panel(kind, tuple(series), xlabel, _accuracy_label(study, setting))


def _masking_accuracy(model, scores, metrics, methods, study) -> Panel:
    finals, setting = _finals(scores, model, study)
    group = masking_methods(study, [m for m in methods if any(k[0] == m for k in finals)])
    benches = _benchmarks(study, finals, group.values())
    if len(group) < 2 or not benches:
        return Panel("masking_accuracy", (), None, None, missing=_masking_missing(group, "final scores"))
    series = []
    for mask, m in group.items():
        stats = [mean_ci([finals[(m, b)]]) for b in benches] + [mean_ci([finals[(m, b)] for b in benches])]
        series.append(Series(m, tuple(benches) + ("avg",), tuple(v[0] for v in stats), mask,
                             lo=tuple(v[1] for v in stats), hi=tuple(v[2] for v in stats)))
    return Panel("masking_accuracy", tuple(series), None, _accuracy_label(study, setting))


def _masking_missing(group: dict, what: str) -> str:
    have = ", ".join(f"{mask} ({m})" for mask, m in group.items()) or "none"
    return (f"needs methods with {what} of two or more of the token masks {', '.join(MASKS)} at equal other "
            f"parameters; found: {have}")


def _masking_entropy(model, scores, metrics, methods, study) -> Panel:
    curves = {m: step_series(metrics.get((model, m), []), "entropy_mean") for m in methods}
    group = masking_methods(study, [m for m in methods if curves[m][0]])
    if len(group) < 2:
        return Panel("masking_entropy", (), None, None, missing=_masking_missing(group, "entropy curves"))
    series = tuple(Series(m, tuple(curves[m][0]), tuple(smooth(curves[m][1], max(1, len(curves[m][1]) // 50))), mask)
                   for mask, m in group.items())
    return Panel("masking_entropy", series, STEP_LABEL, "mean token entropy (nats)")


def _curve_setting(study, scores: list) -> str | None:
    """The setting of accuracy-vs-step points: the first curve setting evaluated, else the first setting."""
    seen = {s.setting for s in scores}
    return next((k for k in study.curve_settings if k in seen), None) or next(iter(settings_order(study, scores)),
                                                                              None)


def _fullmask(model, scores, metrics, methods, study) -> Panel:
    full = [m for m in methods if _mask_of(study, m) == "s2t_full"]
    if not full:
        return Panel("fullmask", (), None, None, missing="the study has no method with the s2t_full token mask")
    mine = [s for s in scores if s.model == model]
    bench = curve_benchmark(study, [s for s in mine if s.method in full])
    series = []
    for m in full:
        rows = metrics.get((model, m), [])
        evals = [s for s in mine if s.method in (m, "base") and s.benchmark == bench]
        setting = _curve_setting(study, [s for s in evals if s.method == m])
        pts = sorted(((step_of(s.ckpt, rows), s) for s in evals if s.setting == setting), key=lambda p: p[0] or 0)
        pts = [(x, s) for x, s in pts if x is not None]
        xs, ys = step_series(rows, "entropy_mean")
        if xs and len(pts) >= 2:
            series += [Series(m, tuple(xs), tuple(smooth(ys, max(1, len(ys) // 50))), "entropy"),
                       Series(m, tuple(x for x, _ in pts), tuple(s.accuracy for _, s in pts), "accuracy",
                              lo=tuple(s.ci_lo for _, s in pts), hi=tuple(s.ci_hi for _, s in pts))]
    if not series:
        return Panel("fullmask", (), None, None, missing=f"no s2t_full method ({', '.join(full)}) has both an "
                     f"entropy curve and two accuracy points (base and a checkpoint) on {bench or 'a benchmark'}")
    return Panel("fullmask", tuple(series), f"{STEP_LABEL}, 0 = base model", "mean token entropy (nats)",
                 ylabel2=f"{study.label('benchmarks', bench)} accuracy (%)")


def _spurious(models, scores, metrics, methods, study) -> Panel:
    series = []
    for model in models:
        logged = [m for m in methods if any(r.get("silenced_fraction") for r in metrics.get((model, m), []))]
        s2t = [m for m in logged if _mask_of(study, m) == "s2t"]
        if not s2t:
            continue
        ref = masking_methods(study, logged).get("s2t", s2t[0])
        xs, ys = step_series(metrics[(model, ref)], "silenced_fraction")
        xs, ys = [x for x, y in zip(xs, ys) if y > 0], [y for y in ys if y > 0]
        if xs:
            series.append(Series(ref, tuple(xs), tuple(smooth(ys, max(1, len(ys) // 50))), model))
    if not series:
        return Panel("spurious_ratio", (), None, None, missing="no model has a positive silenced fraction logged by "
                     "a method with the s2t token mask")
    return Panel("spurious_ratio", tuple(series), STEP_LABEL, "silenced-token fraction")


def comparison_series(kind: str, model, scores: list, metrics: dict, methods: list[str],
                      diagnostics: dict | None = None, study=None) -> Panel:
    """What comparison figure ``kind`` of ``model`` plots (module docstring), as stapo.report.figures.figure_series;
    ``model`` is the list of models for the ``STUDY_KINDS``. Raises ValueError for an unknown kind."""
    if kind not in COMPARISON_KINDS + STUDY_KINDS:
        raise ValueError(f"unknown comparison figure {kind!r}; expected one of "
                         f"{', '.join(COMPARISON_KINDS + STUDY_KINDS)}")
    models = list(model) if kind in STUDY_KINDS else [model]
    inputs = FigureInputs(models, methods, scores, metrics, diagnostics or {}, study or stapo_study.default())
    return FIGURES[kind].series(model, inputs)


# ------------------------------------------------------------------------------------------------ drawing


def _yerr(s: Series):
    """Matplotlib's asymmetric error bars from the series' lo/hi (None when it has none)."""
    if not s.lo:
        return None
    return [[v - lo for v, lo in zip(s.values, s.lo)], [hi - v for v, hi in zip(s.values, s.hi)]]


def _draw_pareto(fig, panel: Panel, study) -> None:
    ax = fig.subplots()
    frontier = sorted((s.steps[0], s.values[0]) for s in panel.series if s.variant == "frontier")
    if len(frontier) > 1:  # one point is no line: a legend entry only for what is drawn
        ax.plot([x for x, _ in frontier], [y for _, y in frontier], "--", color="grey", lw=1, label="Pareto frontier")
    else:
        ax.plot([x for x, _ in frontier], [y for _, y in frontier], "o", ms=14, mfc="none", mec="grey",
                label="Pareto frontier: one method, no other as stable and as accurate")
    for i, s in enumerate(panel.series):
        text = study.label("methods", s.method)
        ax.errorbar(s.steps, s.values, yerr=_yerr(s), fmt="os^Dv"[i // 10 % 5], ms=6, capsize=3, color=f"C{i % 10}",
                    label=twin_label(text, study.label("methods", s.same_as)) if s.same_as else text)
    # from 0 on both axes: differences of a few thousandths of a nat are not stretched across the figure
    ax.set_xlim(0, max(max(s.steps[0] for s in panel.series) * 1.15, 1e-3))
    ax.set_ylim(0, 100)
    ax.set_xlabel(panel.xlabel + "\nlower = more stable; both axes from 0", fontsize=8)
    ax.set_ylabel(panel.ylabel, fontsize=8)
    ax.legend(fontsize=6, frameon=False, loc="lower right")


def _draw_sweep(fig, panel: Panel, study) -> None:
    variants = list(dict.fromkeys(s.variant for s in panel.series))
    axes = fig.subplots(1, len(variants), squeeze=False)[0]
    for ax, variant in zip(axes, variants):
        for s in (s for s in panel.series if s.variant == variant):
            ax.errorbar(s.steps, s.values, yerr=_yerr(s), fmt="-o", ms=4, capsize=3,
                        color=f"C{list(MASKS).index(s.method)}", label=MASKS[s.method])
        ax.set_title("Avg" if variant == "avg" else study.label("benchmarks", variant), fontsize=9)
        ax.set_xlabel(panel.xlabel, fontsize=8)
        ax.set_ylabel(panel.ylabel, fontsize=8)
        if panel.kind == "sweep_tau_p":
            ax.set_xscale("log")
        ax.legend(fontsize=7, frameon=False, loc="best")


def _draw_masking_accuracy(fig, panel: Panel, study) -> None:
    ax = fig.subplots()
    width = 0.8 / len(panel.series)
    for j, s in enumerate(panel.series):
        xs = [i + (j - (len(panel.series) - 1) / 2) * width for i in range(len(s.steps))]
        ax.bar(xs, s.values, width=width, yerr=_yerr(s), capsize=2, color=f"C{list(MASKS).index(s.variant)}",
               label=f"{study.label('methods', s.method)}: {MASKS[s.variant]}")
    ticks = panel.series[0].steps
    ax.set_xticks(range(len(ticks)), ["Avg" if b == "avg" else study.label("benchmarks", b) for b in ticks],
                  fontsize=7)
    ax.set_ylabel(panel.ylabel, fontsize=8)
    ax.margins(y=0.3)
    ax.legend(fontsize=6, frameon=False, loc="upper right")


def _draw_lines(fig, panel: Panel, study) -> None:
    """masking_entropy (a line per method) and spurious_ratio (a line per model, log scale)."""
    ax = fig.subplots()
    for s in panel.series:
        if panel.kind == "spurious_ratio":
            label = f"{study.label('models', s.variant)} ({study.label('methods', s.method)})"
            colour = None
        else:
            label = f"{study.label('methods', s.method)}: {MASKS[s.variant]}"
            colour = f"C{list(MASKS).index(s.variant)}"
        ax.plot(s.steps, s.values, color=colour, lw=1.4, marker="o" if len(s.steps) <= 30 else None, ms=4, label=label)
    if panel.kind == "spurious_ratio":
        ax.set_yscale("log")
        ax.axhline(SILENCED_REFERENCE, color="grey", ls=":", lw=1, label="1e-4")
    ax.set_xlabel(panel.xlabel, fontsize=8)
    ax.set_ylabel(panel.ylabel, fontsize=8)
    ax.legend(fontsize=6, frameon=False, loc="best")


def _draw_fullmask(fig, panel: Panel, study) -> None:
    ax = fig.subplots()
    twin = ax.twinx()
    for i, s in enumerate(panel.series):
        name = study.label("methods", s.method)
        if s.variant == "entropy":
            ax.plot(s.steps, s.values, "-", color=f"C{i}", lw=1.4, label=f"{name}: entropy")
        else:
            twin.errorbar(s.steps, s.values, yerr=_yerr(s), fmt="--s", ms=4, capsize=3, color=f"C{i}",
                          label=f"{name}: accuracy")
    ax.set_xlabel(panel.xlabel, fontsize=8)
    ax.set_ylabel(panel.ylabel, fontsize=8)
    twin.set_ylabel(panel.ylabel2, fontsize=8)
    handles = [h for a in (ax, twin) for h in a.get_legend_handles_labels()[0]]
    ax.legend(handles, [h.get_label() for h in handles], fontsize=7, frameon=False, loc="best")


def _framed(body, title: str, wide: bool = False):
    """A comparison kind's draw function: a figure (wide: the sweeps' two panels), ``body`` drawn on it and its
    title, the model's label first (a study-wide figure, ``model`` None: the title alone)."""
    def draw(panel: Panel, model, inputs: FigureInputs):
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig = plt.figure(figsize=(9.0 if wide else 5.5, 3.6), dpi=120)
        body(fig, panel, inputs.study)
        where = "" if model is None else f"{inputs.study.label('models', model)}: "
        fig.suptitle(f"{where}{title}", fontsize=10)
        fig.tight_layout()
        return fig

    return draw


# ------------------------------------------------------------------------------------------------ the kinds


COMPARISON_GROUPS = GROUPS[1:6]  # results/figures.md's groups 1-5


def _declare(key, group: int, build, draw, title: str, reproduces: str, caption: str, scope: str = "model") -> None:
    """One comparison kind: ``build(model, scores, metrics, methods, study)`` plots it, ``draw`` draws it."""
    register_figure(FigureKind(key, lambda model, i: build(model, i.scores, i.metrics, i.methods, i.study),
                               _framed(draw, title, wide=key in SWEEPS), reproduces, caption, GROUPS[group], scope))


def _sweep_of(kind: str):
    return lambda model, scores, metrics, methods, study: _sweep(kind, model, scores, metrics, methods, study)


_declare("pareto", 1, _pareto, _draw_pareto, "accuracy vs entropy stability", "v4 Fig. 1b (Pareto frontier)",
         "Final accuracy on the curve benchmark (first setting, 95 % CI) vs entropy instability, one point per "
         "trained method; the dashed line joins the Pareto frontier (a lone frontier method: ringed). Both axes "
         "start at 0, so differences of a few thousandths of a nat look as small as they are. " + ENTROPY_STABILITY)
_declare("sweep_tau_p", 2, _sweep_of("sweep_tau_p"), _draw_sweep, "τ_p sweep", "Ablations: τ_p sweep",
         "Final accuracy (curve benchmark and Avg, first setting, 95 % CI) vs τ_p, one line per masking strategy "
         "(token mask), over the methods whose other parameters agree; a strategy the study does not sweep is one "
         "point.")
_declare("sweep_q", 2, _sweep_of("sweep_q"), _draw_sweep, "q sweep", "Ablations: q sweep",
         "Final accuracy (curve benchmark and Avg, first setting, 95 % CI) vs q (the entropy quantile of τ_h), one "
         "line per masking strategy, over the methods whose other parameters agree.")
_declare("masking_accuracy", 3, _masking_accuracy, _draw_masking_accuracy, "masking strategies, accuracy",
         "Ablations: which candidates to silence", "Final accuracy per benchmark and Avg (first setting, 95 % CI) "
         "of the masking strategies at equal other parameters: low-entropy (STAPO), high-entropy, random, all "
         "candidates (FullMask).")
_declare("masking_entropy", 3, _masking_entropy, _draw_lines, "masking strategies, entropy",
         "Ablations: which candidates to silence", "Mean token entropy vs training step of the masking strategies "
         "(the methods of the masking ablation).")
_declare("fullmask", 4, _fullmask, _draw_fullmask, "FullMask: entropy and accuracy", "JustRL-FullMask probe",
         "Each FullMask (s2t_full) method: mean token entropy (left axis) and curve-benchmark accuracy (right axis, "
         "curve setting, base model at step 0) vs training step.")
_declare("spurious_ratio", 5, _spurious, _draw_lines, "silenced-token fraction across models",
         "spurious-token ratio across model sizes", "Silenced-token fraction vs training step of each model's "
         "STAPO (s2t) method, log scale, positive values; the 1e-4 line is the paper's typical level.",
         scope="study")
COMPARISON_KINDS = tuple(k for k, f in FIGURES.items() if f.group in COMPARISON_GROUPS and f.scope == "model")
STUDY_KINDS = tuple(k for k, f in FIGURES.items() if f.group in COMPARISON_GROUPS and f.scope == "study")
