"""The report's training figures: what each one plots (pure functions), then the matplotlib code that draws it.

``figure_series(kind, model, scores, metrics, methods, diagnostics)`` returns a :class:`Panel`: the series of one
figure, in drawing order, with its axis labels; ``draw_figure`` draws exactly that and nothing it computes itself.
Each kind is declared once, at the end of this module, in the report's one figure registry (stapo.report.kinds:
series, drawing, caption; its loop writes them). Kinds (``FIGURE_KINDS``), all methods of one model in one panel:

    entropy, reward     ``entropy_mean`` / ``reward_mean`` of metrics.jsonl vs training step
    silenced            ``silenced_fraction`` vs step (log scale, the positive values only; a 1e-4 reference line)
    accuracy            accuracy vs step on the study's curve benchmark (``workflow.curve_benchmark`` when evaluated,
                        else the best-covered one), one series per (method, setting); the base model's score is
                        step 0 of every method
    quadrants           mean closed-form ‖∇_a J‖ per probability × entropy quadrant (positive-advantage tokens),
                        count-weighted over the logged steps of diagnostics.jsonl, one bar group per method
    entropy_quantiles   the 10/25/50/75/90 % token-entropy quantiles of diagnostics.jsonl vs step

The metric curves and accuracy points of a method take its family's line style (accuracy: marker): the paper's four,
the ablations, verl's losses, TRL's (stapo.study.methods.Family), with one grey legend entry per family present.

x is the paper's training step, the rollout batch (verl's step): the optimiser steps of one rollout batch are
averaged, as verl logs them, and ``checkpoint-N`` (named by TRL's optimiser step N) sits at its rollout step.
Labels, the curve benchmark and the order of the settings come from the study (stapo.study.Study; the paper's
defaults without one). The figures that compare methods by their objectives (Pareto, τ_p / q sweeps, masking
ablation, FullMask, spurious ratio across models) are stapo.report.comparison, on the same Series and Panel.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, replace

from stapo import study as stapo_study
from stapo.report.kinds import GROUPS, FIGURES, FigureInputs, FigureKind, register_figure
from stapo.study.methods import Family

__all__ = ["FIGURE_KINDS", "Series", "Panel", "figure_series", "draw_figure", "mark_identical", "twin_label",
           "STEP_LABEL", "SMALL_N", "settings_order", "curve_benchmark"]

STEP_LABEL = "training step (rollout batches)"
METRIC_PANELS = {"entropy": ("entropy_mean", "mean token entropy (nats)"),
                 "reward": ("reward_mean", "training reward (mean ±1)"),
                 "silenced": ("silenced_fraction", "silenced-token fraction")}
QUADRANT_LABELS = {"lowp_lowh": "low p\nlow H\n(S2T)", "lowp_highh": "low p\nhigh H", "highp_lowh": "high p\nlow H",
                   "highp_highh": "high p\nhigh H"}
QUANTILE_KEYS = ("entropy_q10", "entropy_q25", "entropy_q50", "entropy_q75", "entropy_q90")
SILENCED_REFERENCE = 1e-4  # the silenced figure's horizontal reference line
NO_DIAGNOSTICS = ("no token diagnostics logged (runs/<model>/<method>/diagnostics.jsonl): set "
                  "train.diagnostics_every > 0")
@dataclass(frozen=True)
class Series:
    """One drawn series of a method.

    steps:   x values: training steps (rollout batches; 0 = the base model), or the quadrant keys of the bars.
    values:  y values, as drawn (the metric curves are smoothed by a trailing moving average on long runs).
    variant: what distinguishes the method's series: the setting key (accuracy), the quantile key
             (entropy_quantiles), else None (stapo.report.comparison: see each kind).
    counts:  quadrants: the number of tokens behind each bar.
    lo, hi:  a band or error bar per value (an accuracy's 95 % CI); () when the figure has none.
    points:  the method behind each value where one series spans several methods (a parameter sweep), else ().
    same_as: the method of an earlier series of the panel with exactly these steps and values (drawn under this
             one, so hidden by it): the legend and results/figures.md say so; else None.
    """

    method: str
    steps: tuple
    values: tuple[float, ...]
    variant: str | None = None
    counts: tuple[float, ...] = ()
    lo: tuple[float, ...] = ()
    hi: tuple[float, ...] = ()
    points: tuple[str, ...] = ()
    same_as: str | None = None


@dataclass(frozen=True)
class Panel:
    """What one figure shows: its series in drawing order and its axis labels (None: not set, an empty panel).

    ylabel2: the right-hand axis of a twin-axis figure (stapo.report.comparison' fullmask), else None.
    missing: why the figure is not drawn (its inputs are missing, or it would show nothing: no series, a silenced
             fraction that is 0 throughout, two accuracy points per curve): the report skips it and says why in
             results/figures.md; None: drawn.
    """

    kind: str
    series: tuple[Series, ...]
    xlabel: str | None
    ylabel: str | None
    ylabel2: str | None = None
    missing: str | None = None

    def of(self, method: str, variant: str | None = None) -> Series | None:
        """The series of ``method`` (and ``variant``), or None when the figure has none."""
        return next((s for s in self.series if (s.method, s.variant) == (method, variant)), None)

    def notes(self, label=lambda key: key) -> list[str]:
        """One line per method hidden under another (``same_as``), for results/figures.md; the variants are named
        where only some of the method's series are hidden."""
        out = []
        for method, twin in dict.fromkeys((s.method, s.same_as) for s in self.series if s.same_as):
            mine = [s for s in self.series if s.method == method]
            hidden = [s.variant for s in mine if s.same_as == twin]
            which = "" if len(hidden) == len(mine) else f" ({', '.join(map(str, hidden))})"
            out.append(f"{label(method)}{which} is identical to {label(twin)} (drawn over it, so only one line shows)")
        return out


def twin_label(text: str, twin: str) -> str:
    """The legend entry of a series drawn over an identical earlier one: two methods, one visible line (issue 42:
    "JustRL (= 20-Entropy)" read as if the two were one method)."""
    return f"{text} (same values as {twin}, drawn over it)"


SMALL_N = 10  # a quadrant bar over fewer tokens is drawn hatched and pale: its mean is noise


def mark_identical(series: list[Series]) -> tuple[Series, ...]:
    """``series`` with ``same_as`` set on each one whose (variant, steps, values) an earlier one already has (a
    STAPO run that silenced nothing is JustRL, to the bit): drawn later, it hides that one."""
    seen: dict[tuple, str] = {}
    out = []
    for s in series:
        key = (s.variant, s.steps, s.values)
        out.append(replace(s, same_as=seen[key]) if key in seen else s)
        seen.setdefault(key, s.method)
    return tuple(out)


# ------------------------------------------------------------------------------------------------ series


def step_series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    """(x, y) of ``key`` per training step in the paper's unit, the rollout step (verl step): the optimiser steps
    of one rollout batch are averaged, as verl logs them. Rows without ``rollout_step`` count as one each."""
    by_step: dict[int, list[float]] = defaultdict(list)
    for r in rows:
        if isinstance(r.get(key), (int, float)) and math.isfinite(r[key]):
            by_step[int(r.get("rollout_step", r["step"]))].append(float(r[key]))
    xs = sorted(by_step)
    return xs, [sum(by_step[x]) / len(by_step[x]) for x in xs]


def smooth(ys: list[float], window: int) -> list[float]:
    """Trailing moving average (the paper's curves are smoothed); identity when window <= 1."""
    if window <= 1:
        return ys
    out, acc = [], 0.0
    for i, y in enumerate(ys):
        acc += y - (ys[i - window] if i >= window else 0.0)
        out.append(acc / min(i + 1, window))
    return out


def step_of(ckpt: str, rows: list[dict]) -> int | None:
    """Rollout step of a checkpoint: checkpoint-N is named by TRL's optimiser step N (stapo.core.schedule)."""
    if ckpt == "base":
        return 0
    if not rows:
        return None
    if ckpt.startswith("checkpoint-"):
        n = int(ckpt.split("-", 1)[1])
        return next((int(r.get("rollout_step", n)) for r in rows if r["step"] == n), None)
    return int(rows[-1].get("rollout_step", rows[-1]["step"]))


def seed_runs(metrics: dict, model: str, method: str) -> list[list[dict]]:
    """The metric rows of each training run of ``method``: its one run, or one per seed of a several-seed study
    (keys ``<method>/seed<k>``, stapo.study.Study.runs)."""
    if (model, method) in metrics:
        return [metrics[(model, method)]]
    return [rows for (m, run), rows in sorted(metrics.items())
            if m == model and "/" in run and stapo_study.split_run(run)[0] == method]


def across_seeds(runs: list[list[dict]], key: str) -> tuple[list[int], list[float], list[float], list[float]]:
    """(steps, mean, lo, hi) of ``key`` over the runs at the steps every run logged; lo/hi: the lowest and highest
    seed at each step (empty with one run)."""
    per_run = [dict(zip(*step_series(rows, key))) for rows in runs]
    xs = sorted(set.intersection(*(set(r) for r in per_run))) if per_run else []
    mean = [sum(r[x] for r in per_run) / len(per_run) for x in xs]
    if len(per_run) < 2:
        return xs, mean, [], []
    return xs, mean, [min(r[x] for r in per_run) for x in xs], [max(r[x] for r in per_run) for x in xs]


def _metric_series(kind: str, metrics: dict, model: str, methods: list[str]) -> Panel:
    """One curve per method with logged values, smoothed over len/50 steps (silenced: positive values only); with
    several seeds the across-seed mean, its band the seeds' range."""
    key, ylabel = METRIC_PANELS[kind]
    series, logged = [], 0
    for method in methods:
        xs, ys, lo, hi = across_seeds(seed_runs(metrics, model, method), key)
        logged += len(xs)
        if kind == "silenced":
            keep = [i for i, y in enumerate(ys) if y > 0]
            xs, ys = [xs[i] for i in keep], [ys[i] for i in keep]
            lo, hi = ([max(lo[i], 1e-12) for i in keep], [hi[i] for i in keep]) if lo else ([], [])
        if xs:
            window = max(1, len(ys) // 50)
            series.append(Series(method, tuple(xs), tuple(smooth(ys, window)), lo=tuple(smooth(lo, window)),
                                 hi=tuple(smooth(hi, window))))
    missing = None
    if not series:
        missing = (f"no method logged {key} (runs/<model>/<method>/metrics.jsonl)" if not logged else
                   f"no token was silenced: each of the {logged} logged silenced_fraction values (every method, "
                   "every step) is 0, and a log scale has nothing to show")
    return Panel(kind, mark_identical(series), STEP_LABEL, ylabel, missing=missing)


def settings_order(study, scores: list) -> list[str]:
    """The settings of ``scores``: the study's order (eval.settings), then any others, sorted."""
    seen = {s.setting for s in scores}
    return [k for k in study.eval.settings if k in seen] + sorted(seen - set(study.eval.settings))


def curve_benchmark(study, scores: list) -> str | None:
    """The benchmark of accuracy curves and points among ``scores``: the study's ``workflow.curve_benchmark`` when
    evaluated, else the best-covered one (the first in sorted order on a tie); None without scores."""
    counts = defaultdict(int)
    for s in sorted(scores, key=lambda s: s.benchmark):
        counts[s.benchmark] += 1
    if not counts:
        return None
    curve = study.workflow.curve_benchmark
    return curve if curve in counts else max(counts, key=counts.get)


def _accuracy_series(scores: list, metrics: dict, model: str, methods: list[str], study) -> Panel:
    """(step, accuracy) points per trained method and setting on the curve benchmark, base model at step 0."""
    mine = [s for s in scores if s.model == model]
    bench = curve_benchmark(study, mine)
    if bench is None:
        return Panel("accuracy", (), None, None, missing="no evaluation scores of this model")
    series = []
    for method in [m for m in methods if m != "base"]:
        runs = seed_runs(metrics, model, method)  # the seeds share the checkpoint -> step map
        rows = runs[0] if runs else []
        for setting in settings_order(study, mine):
            pts = sorted(p for p in ((step_of(s.ckpt, rows), s.accuracy, s.ci_lo, s.ci_hi, s.n_seeds) for s in mine
                                     if s.benchmark == bench and s.setting == setting and s.method in (method, "base"))
                         if p[0] is not None)
            if pts:
                xs, ys, lo, hi, n_seeds = zip(*pts)
                band = max(n_seeds) > 1  # several seeds: the band is each point's 95 % CI (seeds and problems)
                series.append(Series(method, xs, ys, variant=setting, lo=lo if band else (), hi=hi if band else ()))
    missing = None
    if max((len(s.steps) for s in series), default=0) < 3:  # base and final: a line would draw a trend
        missing = (f"only the base model and the final checkpoint are evaluated on {bench} (their scores are in "
                   "the table; two points per method are no curve): set workflow.eval_every for checkpoints between")
    return Panel("accuracy", mark_identical(series), f"{STEP_LABEL}, 0 = base model",
                 f"{study.label('benchmarks', bench)} accuracy (%)", missing=missing)


def _quadrant_series(diagnostics: dict, model: str, methods: list[str]) -> Panel:
    """Per method with diagnostics: the count-weighted mean ‖∇_a J‖ of each quadrant and its token count."""
    series = []
    for method in methods:
        logged = [r for rows in seed_runs(diagnostics, model, method) for r in rows]  # several seeds: pooled
        if not logged:
            continue
        means, counts = [], []
        for q in QUADRANT_LABELS:
            rows = [(r[f"quadrant/{q}_count"], r[f"quadrant/{q}_grad_norm"]) for r in logged
                    if r.get(f"quadrant/{q}_grad_norm") is not None]
            n = sum(c for c, _ in rows)
            means.append(sum(c * g for c, g in rows) / n if n else 0.0)
            counts.append(n)
        series.append(Series(method, tuple(QUADRANT_LABELS), tuple(means), counts=tuple(counts)))
    return Panel("quadrants", tuple(series), None, "mean closed-form ‖∇ₐJ‖ (Â > 0 tokens)",
                 missing=None if series else NO_DIAGNOSTICS)


def _quantile_series(diagnostics: dict, model: str, methods: list[str]) -> Panel:
    """Per method with diagnostics, one curve per entropy quantile (``QUANTILE_KEYS``) vs step (several seeds:
    their mean at the steps every seed logged)."""
    series = [Series(method, tuple(xs), tuple(ys), variant=key)
              for method in methods if seed_runs(diagnostics, model, method)
              for key in QUANTILE_KEYS for xs, ys, _, _ in [across_seeds(seed_runs(diagnostics, model, method), key)]
              if xs]
    return Panel("entropy_quantiles", mark_identical(series), STEP_LABEL, "token entropy quantiles 10–90 % (nats)",
                 missing=None if series else NO_DIAGNOSTICS)


def figure_series(kind: str, model: str, scores: list, metrics: dict, methods: list[str],
                  diagnostics: dict | None = None, study=None) -> Panel:
    """What figure ``kind`` of ``model`` plots (module docstring); ``methods`` in their drawing order.

    ``scores``: the report's Score records; ``metrics`` / ``diagnostics``: ``(model, method) -> rows`` of
    metrics.jsonl / diagnostics.jsonl (``stapo.report.results.load_metrics``); ``study``: a stapo.study.Study (default:
    the paper's defaults). Raises ValueError for an unknown kind.
    """
    if kind not in FIGURE_KINDS:
        raise ValueError(f"unknown figure kind {kind!r}; expected one of {', '.join(FIGURE_KINDS)}")
    inputs = FigureInputs([model], methods, scores, metrics, diagnostics or {}, study or stapo_study.default())
    return FIGURES[kind].series(model, inputs)


# ------------------------------------------------------------------------------------------------ drawing


def _draw(ax, panel: Panel, methods: list[str], study) -> None:
    from matplotlib.ticker import MaxNLocator

    kind = panel.kind

    def label(what: str, key: str, series: Series | None = None) -> str:  # a hidden twin is named in the legend
        text = study.label(what, key)
        if series is not None and series.same_as:
            text = twin_label(text, study.label(what, series.same_as))
        return text

    group = _family_styles(panel, study)
    if kind in METRIC_PANELS:  # markers on short runs, so identical curves (e.g. before divergence) stay visible
        for s in panel.series:  # silenced: points only, a line would pass over the steps that silenced nothing
            style = "none" if kind == "silenced" else group[s.method][0]
            line, = ax.plot(s.steps, s.values, ls=style, label=label("methods", s.method, s), lw=1.4,
                            marker="o" if len(s.steps) <= 30 or kind == "silenced" else None,
                            ms=7 - 1.5 * (methods.index(s.method) % 4),
                            alpha=0.85)
            if s.lo:  # several seeds: the curve is their mean, the band their range
                ax.fill_between(s.steps, s.lo, s.hi, color=line.get_color(), alpha=0.2, lw=0)
        _family_legend(ax, group, study, markers=False)
    elif kind == "accuracy":
        variants = list(dict.fromkeys(s.variant for s in panel.series))
        for s in panel.series:
            style = ("-", "--", ":", "-.")[variants.index(s.variant) % 4]
            line, = ax.plot(s.steps, s.values, style, marker=group[s.method][1], ms=3,
                            label=f"{label('methods', s.method, s)} {label('settings', s.variant)}")
            if s.lo:
                ax.fill_between(s.steps, s.lo, s.hi, color=line.get_color(), alpha=0.12, lw=0)
        _family_legend(ax, group, study, markers=True)
    elif kind == "quadrants":
        width = 0.8 / max(1, len(panel.series))
        for j, s in enumerate(panel.series):
            xs = [i + (j - (len(panel.series) - 1) / 2) * width for i in range(len(s.steps))]
            bars = ax.bar(xs, s.values, width=width, color=f"C{j}")
            ax.bar([0], [0], width=0, color=f"C{j}", label=label("methods", s.method))  # legend: the plain colour
            for bar, n in zip(bars, s.counts):
                if 0 < n < SMALL_N:  # a mean over a handful of tokens: marked, so it is not read as a finding
                    bar.set_alpha(0.35)
                    bar.set_hatch("///")
            # upright counts would overlap over bars this narrow (issue 42: "n=456n=471"): turned when crowded
            ax.bar_label(bars, [f"n={int(n)}" for n in s.counts], fontsize=6 if len(panel.series) < 3 else 5,
                         padding=1, rotation=0 if len(panel.series) < 3 else 90)
        if any(0 < n < SMALL_N for s in panel.series for n in s.counts):
            ax.bar([0], [0], color="white", edgecolor="grey", hatch="///", label=f"hatched: n < {SMALL_N} tokens")
        ax.set_xticks(range(len(QUADRANT_LABELS)), list(QUADRANT_LABELS.values()), fontsize=7)
    else:  # entropy_quantiles: colour = method, line style = quantile
        colours = {m: f"C{i}" for i, m in enumerate(dict.fromkeys(s.method for s in panel.series))}
        styles = dict(zip(QUANTILE_KEYS, (":", "--", "-", "--", ":")))
        for s in panel.series:  # markers on short runs: a few logged steps are points, not a smooth trend
            median = s.variant == "entropy_q50"
            ax.plot(s.steps, s.values, styles[s.variant], color=colours[s.method], lw=1.8 if median else 0.9,
                    marker="o" if len(s.steps) <= 30 else None, ms=3,
                    label=label("methods", s.method, s) if median else None)
        if panel.series:  # the line styles, once, in grey
            for style, text in (("-", "median"), ("--", "25 / 75 %"), (":", "10 / 90 %")):
                ax.plot([], [], style, color="grey", lw=0.9, label=text)
            logged = sorted({x for s in panel.series for x in s.steps})
            if len(logged) <= 12:  # a tick at each logged step, none where nothing was logged
                ax.set_xticks(logged)
    if kind in METRIC_PANELS or (kind == "accuracy" and panel.xlabel is not None) or (
            kind == "entropy_quantiles" and len({x for s in panel.series for x in s.steps}) > 12):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if panel.xlabel is not None:
        ax.set_xlabel(panel.xlabel)
    if panel.ylabel is not None:
        ax.set_ylabel(panel.ylabel)
    if kind == "quadrants":
        ax.margins(y=0.25 if len(panel.series) < 3 else 0.4)  # room for the counts and the legend above the bars
    if kind == "silenced":
        ax.set_yscale("log")
        ax.axhline(SILENCED_REFERENCE, color="grey", ls=":", lw=1, label="1e-4")


FAMILY_LINES, FAMILY_MARKERS = ("-", "-.", "--", ":"), ("o", "v", "s", "^")  # per Family, in its order


def _family_styles(panel: Panel, study) -> dict[str, tuple[str, str]]:
    """{method: (line style, marker)} of its family (stapo.study.methods.Family: the paper's four, ablations, verl's,
    TRL's), so a figure of many methods reads by group; the base model and undeclared keys: the paper's."""
    order = list(Family)
    return {s.method: (FAMILY_LINES[i], FAMILY_MARKERS[i]) for s in panel.series
            for i in [order.index(study.family(s.method)) if study.family(s.method) else 0]}


def _family_legend(ax, styles: dict, study, markers: bool) -> None:
    """Where the panel's methods come from several families: one grey legend entry per family's style."""
    families = sorted({f for f in map(study.family, styles) if f is not None}, key=list(Family).index)
    if len(families) > 1:
        for f in families:
            i = list(Family).index(f)
            ax.plot([], [], FAMILY_LINES[i], marker=FAMILY_MARKERS[i] if markers else None, color="grey", lw=0.9,
                    label=f.title)


def draw_figure(kind: str, model: str, scores: list, metrics: dict, methods: list[str],
                diagnostics: dict | None = None, study=None, panel: Panel | None = None):
    """One matplotlib figure of ``kind`` for ``model``: the :func:`figure_series` panel (``panel``: already
    computed), or "no data" where it has no series (the report does not draw those: see write_figures)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    study = study or stapo_study.default()
    panel = panel or figure_series(kind, model, scores, metrics, methods, diagnostics, study)
    fig, ax = plt.subplots(figsize=(5.5, 3.6), dpi=120)
    _draw(ax, panel, methods, study)
    if not panel.series:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, color="grey")
    elif kind == "entropy_quantiles":  # beside the axes: above the curves it hid the top tick and a line
        ax.legend(fontsize=7, frameon=False, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        fig.set_size_inches(7.0, 3.6)
    elif ax.get_legend_handles_labels()[0]:
        above = kind == "quadrants"  # this panel leaves room for the legend at the top
        many = len(ax.get_legend_handles_labels()[0]) > 8  # verl's and TRL's methods beside the paper's
        ax.legend(fontsize=5 if many else 7, frameon=False, loc="upper right" if above else "best",
                  ncol=2 if many else 1)
    ax.set_title(f"{study.label('models', model)}: {kind}", fontsize=10)
    fig.tight_layout()
    return fig


def _draw_kind(panel: Panel, model: str, inputs: FigureInputs):
    return draw_figure(panel.kind, model, inputs.scores, inputs.metrics, inputs.methods, inputs.diagnostics,
                       inputs.study, panel)


# ------------------------------------------------------------------------------------------------ the kinds


def _declare(key: str, series, reproduces: str, caption: str) -> None:
    register_figure(FigureKind(key, series, _draw_kind, reproduces, caption, GROUPS[0]))


_declare("entropy", lambda model, i: _metric_series("entropy", i.metrics, model, i.methods), "Fig. 1a, training curves",
         "Mean token entropy vs training step, every method (several seeds: their mean, shaded: their range).")
_declare("reward", lambda model, i: _metric_series("reward", i.metrics, model, i.methods), "training curves",
         "Training reward (mean of the ±1 strict rewards over the step's own rollouts) vs training step, every method "
         "(several seeds: their mean, shaded: their range). Each step samples new prompts at T 1.0, so the curve "
         "moves with how hard that step's few prompts are: with a handful of prompts per step it can fall while the "
         "accuracy on the fixed benchmark rises. The trend over many steps is the signal; the table's accuracy is "
         "the held-out measure.")
_declare("accuracy", lambda model, i: _accuracy_series(i.scores, i.metrics, model, i.methods, i.study),
         "AIME24 vs step", "Accuracy vs training step on the curve benchmark, per method and sampling setting; step 0 "
         "is the base model (several seeds: their mean, shaded: its 95 % CI over seeds and problems).")
_declare("silenced", lambda model, i: _metric_series("silenced", i.metrics, model, i.methods), "spurious-token ratio",
         "Silenced-token fraction vs step (log scale: the steps that silenced a token, as points; the 1e-4 line is "
         "the paper's typical level).")
_declare("quadrants", lambda model, i: _quadrant_series(i.diagnostics, model, i.methods), "gradient norm per quadrant",
         "Mean closed-form ‖∇ₐJ‖ of positive-advantage tokens per probability × entropy quadrant, n = the tokens "
         f"behind each bar; a bar over fewer than {SMALL_N} tokens is hatched and pale (its mean is noise). Needs "
         "train.diagnostics_every > 0.")
_declare("entropy_quantiles", lambda model, i: _quantile_series(i.diagnostics, model, i.methods),
         "token-entropy quantiles", "Token-entropy quantiles 10/25/50/75/90 % vs step, at the steps that logged "
         "diagnostics (the ticks; needs train.diagnostics_every > 0).")
FIGURE_KINDS = tuple(k for k, kind in FIGURES.items() if kind.group == GROUPS[0])  # always tried, per model
