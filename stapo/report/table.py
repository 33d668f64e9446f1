"""``stapo report``: the paper's Table 2 and training figures from score summaries and training metrics.

Inputs (read by stapo.report.results):
    scores/<model>/<method>/<ckpt>/<benchmark>/<setting>.summary.json   one evaluation (``stapo eval``)
    runs/<model>/<method>/metrics.jsonl                                 one line per optimiser step (``stapo train``)
    runs/<model>/<method>/diagnostics.jsonl, silenced_examples.jsonl   token diagnostics (train.diagnostics_every)
Outputs (under ``--out``, each written atomically):
    table.md     per model: rows = methods (+ the untrained base), grouped under a heading row per family where
                 several are present (the paper's four, the ablations, verl 0.9.1's losses, TRL 1.16's loss types:
                 stapo.study.methods.Family), columns = benchmarks + Avg, each cell the
                 accuracy (%) at the study's first sampling setting, the others in parentheses (the paper's:
                 "T1.0 (T0.7)" = (T 1.0, top-p 1.0) and (T 0.7, top-p 0.9)); for the paper's models the
                 paper's v2 numbers and our Δ follow each method's row. Where the evaluation ran the LLM verifier
                 (the paper's protocol) a cell shows "verifier-corrected / rule-only" side by side; else the strict
                 rule grade alone. Footnotes name the protocol the table was made with: each evaluation's
                 ``eval.protocol``, rule stage and verifier (FILE.summary.json) and each run's recorded training
                 protocol (runs/<model>/<method>/config.yaml: method.loss_agg_mode, method.quantile_scope,
                 train.prompt, trl.normaliser), per method where they differ
    table.tex    the same as LaTeX (booktabs)
    intervals.md each cell of table.md as its 95 % interval (linked from its footnotes)
    scores.csv   every evaluated cell (all checkpoints) with its 95 % CI, plus per-row averages; per cell also the
                 rule-only, verifier-corrected and lenient-fallback accuracies, truncation and no-box rates, the
                 eval.protocol and the verifier (empty: none), the rule stage, both rule stages' accuracies and the
                 samples on which they differ; the average rows also average rule-only and corrected
    figures/<model>_<kind>.{png,pdf}   for each kind of the one figure registry (stapo.report.kinds), in its order:
                 each of ``FIGURE_KINDS`` (what each plots: ``stapo.report.figures``)
    figures/<model>_<kind>.{png,pdf}, figures/spurious_ratio.{png,pdf}   the comparison figures
                 (``stapo.report.comparison``: Pareto, τ_p / q sweeps, masking ablation, FullMask, spurious ratio)
                 whose methods the study has; a figure whose inputs are missing is skipped, with one line saying why
    cost.md, figures/<model>_time_breakdown.{png,pdf}   what each run cost per training step: seconds by part,
                 tokens/s per GPU, MFU, peak memory (``stapo.report.cost``)
    silenced_examples.md   the logged silenced tokens: context, token, p, H, Â and the top-5 alternatives
    figures.md   the figure index: every figure with its caption and the paper figure it reproduces, and the
                 skipped ones with why (linked from table.md); it and silenced_examples.md: stapo.report.kinds

The table uses the ``final`` checkpoint of each trained method and ``base`` for the untrained model. Avg is the
mean over the benchmarks present; its CI half-width is sqrt(Σ h_i²)/k (independent benchmarks, normal approx.).
Rows, columns, settings and labels follow the study (``--config``, read through stapo.study): any number of
benchmarks and settings, a study's own labels (``label:``) and its curve benchmark.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from stapo import study as stapo_study
from stapo.core.atomic import atomic_write, check_creatable_dir
from stapo.report import comparison, cost, seeds as seed_report
from stapo.core.errors import UserError
from stapo.report.kinds import FigureInputs, render_examples, render_figure_index, write_figures
from stapo.report.figures import FIGURE_KINDS, settings_order
from stapo.study.names import BENCHMARKS, METHODS, MODELS, PAPER_BENCHMARKS, paper_key
from stapo.report.results import (PAPER_CSV, RUN_PROTOCOL_KEYS, Score, expected_cells, load_examples, load_metrics,
                           load_paper, load_run_protocols, load_scores)
from stapo.tasks.problems import EvalProtocol

# load_scores, load_metrics, load_paper, Score: stapo.report.results; render_examples, render_figure_index:
# stapo.report.kinds (the pages listing the figures); importable here as before
__all__ = ["add_arguments", "run", "load_scores", "load_metrics", "load_paper", "write_report", "FIGURE_KINDS",
           "Score", "render_examples", "render_figure_index"]

TABLE_CKPTS = ("final", "base")


# ---------------------------------------------------------------------------------------------- table


def _ordered(keys, preferred):
    """``keys`` in the order of ``preferred`` (first occurrence), the others sorted after them."""
    keys = set(keys)
    return [k for k in dict.fromkeys(preferred) if k in keys] + sorted(keys - set(preferred))


def _layout(scores: list[Score], study: stapo_study.Study) -> dict[str, dict]:
    """Per model: the methods (rows), benchmarks (columns), settings and the table's cells
    {(method, bench, setting): Score}."""
    models = _ordered({s.model for s in scores}, list(study.models))
    method_order = list(METHODS) + list(study.methods)  # the paper's row order first
    layout = {}
    for model in models:
        mine = [s for s in scores if s.model == model and s.ckpt == ("base" if s.method == "base" else "final")]
        cells = {(s.method, s.benchmark, s.setting): s for s in mine}
        layout[model] = {
            "methods": study.grouped(_ordered({m for m, _, _ in cells}, method_order)),
            "benchmarks": _ordered({b for _, b, _ in cells}, list(BENCHMARKS) + list(study.eval.benchmarks)),
            "settings": settings_order(study, mine),
            "cells": cells,
        }
    return layout


def row_average(cells: dict, method: str, benchmarks: list[str], setting: str) -> tuple[float, float, float] | None:
    """Mean accuracy over ``benchmarks`` and its CI (half-width sqrt(Σ h_i²)/k); None if any is missing."""
    got = [cells.get((method, b, setting)) for b in benchmarks]
    if not got or any(s is None for s in got):
        return None
    return comparison.mean_ci(got)


def _row_values(entry, method, field: str = "accuracy") -> dict[tuple[str, str], float | None]:
    """``(benchmark|'avg', setting) -> accuracy`` (or another Score field, e.g. rule_accuracy) for one table row."""
    cells, benchmarks, vals = entry["cells"], entry["benchmarks"], {}
    for setting in entry["settings"]:
        for b in benchmarks:
            s = cells.get((method, b, setting))
            vals[(b, setting)] = getattr(s, field) if s else None
        got = [vals[(b, setting)] for b in benchmarks]
        vals[("avg", setting)] = sum(got) / len(got) if got and None not in got else None
    return vals


def _paper_values(paper, model, method, entry) -> dict[tuple[str, str], float | None] | None:
    """The paper's row of (model, method) in the table's cells, or None when the paper has no such row."""
    if not any(k[:2] == (model, method) for k in paper):
        return None
    # The paper's Avg covers the six benchmarks: compare it only when we have all six.
    full = set(PAPER_BENCHMARKS) <= set(entry["benchmarks"])
    return {(b, s): paper.get((model, method, b, s)) if (b != "avg" or full) else None
            for b in list(entry["benchmarks"]) + ["avg"] for s in entry["settings"]}


def _fmt(v, signed=False) -> str:
    if v is None:
        return "–"
    return f"{v:+.2f}" if signed else f"{v:.2f}"


def _cell(vals, bench, settings, signed=False, rule=None) -> str:
    """"first (second, ...)": the value at the first setting, the others in parentheses. With ``rule`` (the
    rule-only values of a verifier-corrected row), each value is "corrected / rule-only" where the two differ in
    kind (a cell the verifier did not correct shows its one value)."""
    def one(s):
        value = _fmt(vals[(bench, s)], signed)
        if rule is None or rule.get((bench, s), "uncorrected") == "uncorrected":
            return value
        return f"{value} / {_fmt(rule[(bench, s)])}"

    first, *others = [one(s) for s in settings]
    return f"{first} ({', '.join(others)})" if others else first


def _rule_values(entry, method) -> dict[tuple[str, str], float | str | None]:
    """The rule-only values of the verifier-corrected cells (and of Avg where all its cells are corrected);
    "uncorrected" marks the others."""
    rule, corrected = _row_values(entry, method, "rule_accuracy"), _row_values(entry, method, "corrected_accuracy")
    return {k: rule[k] if corrected[k] is not None else "uncorrected" for k in rule}


def table_rows(entry: dict, model: str, paper: dict, study: stapo_study.Study) -> list[tuple[str, list[str] | None]]:
    """``[(row label, [cell per benchmark + Avg])]`` for one model: ours, then paper v2 and Δ for paper models;
    where the methods come from several families (the paper's four, verl's, TRL's: Study.family), each family's
    rows follow a heading row ``(its title, None)``."""
    columns, settings, rows = entry["benchmarks"] + ["avg"], entry["settings"], []
    families = {study.family(m) for m in entry["methods"]} - {None}
    for i, method in enumerate(entry["methods"]):
        family = study.family(method)
        if len(families) > 1 and family is not None and (i == 0 or study.family(entry["methods"][i - 1]) != family):
            rows.append((family.title, None))
        ours = _row_values(entry, method)
        name = study.label("methods", method)
        rule = _rule_values(entry, method) if _verified(entry) else None
        rows.append((name, [_cell(ours, b, settings, rule=rule) for b in columns]))
        theirs = _paper_values(paper, model, method, entry)
        if theirs is None:
            continue
        delta = {k: (ours[k] - theirs[k]) if ours.get(k) is not None and theirs[k] is not None else None
                 for k in theirs}
        rows.append((f"{name} (paper v2)", [_cell(theirs, b, settings) for b in columns]))
        rows.append((f"{name} Δ ours − paper", [_cell(delta, b, settings, signed=True) for b in columns]))
    return rows


def interval_rows(entry: dict, study: stapo_study.Study) -> list[tuple[str, list[str]]]:
    """``[(row label, [cell per benchmark + Avg])]``: each of our cells' 95 % interval "lo–hi", the first setting's
    with the others' in parentheses (the score's bootstrap CI over problems; Avg: :func:`row_average`'s)."""
    rows = []
    for method in entry["methods"]:
        cells = []
        for bench in entry["benchmarks"] + ["avg"]:
            spans = []
            for setting in entry["settings"]:
                if bench == "avg":
                    got = row_average(entry["cells"], method, entry["benchmarks"], setting)
                    lo, hi = (got[1], got[2]) if got else (None, None)
                else:
                    score = entry["cells"].get((method, bench, setting))
                    lo, hi = (score.ci_lo, score.ci_hi) if score else (None, None)
                spans.append("–" if lo is None else f"{lo:.1f}–{hi:.1f}")
            first, *others = spans
            cells.append(f"{first} ({', '.join(others)})" if others else first)
        rows.append((study.label("methods", method), cells))
    return rows


def _verified(entry: dict) -> bool:
    """Whether any cell of this model's table was corrected by an LLM verifier."""
    return any(s.corrected_accuracy is not None for s in entry["cells"].values())


def _settings_note(settings: list[str], study: stapo_study.Study) -> str:
    def described(key):
        try:
            t = study.eval.setting(key)
        except KeyError:
            return study.label("settings", key)
        return f"T {t['temperature']:g} / top-p {t['top_p']:g}"

    first, *others = [described(s) for s in settings]
    return f"at {first}" + (f" ({', '.join(others)})" if others else "")


NO_VERIFIER = "none — rule-only grading"


def _eval_protocol_note(entry: dict, study: stapo_study.Study) -> str:
    """Which eval.protocol and verifier made the table's cells (each cell's FILE.summary.json); per method when
    the cells disagree."""
    def kinds(cells):
        return sorted({(s.protocol or "not recorded", s.verifier_model or NO_VERIFIER) for s in cells})

    def described(cells):
        return " + ".join(f"eval.protocol {p}, verifier: {v}" for p, v in kinds(cells))

    cells = list(entry["cells"].values())
    if len(kinds(cells)) <= 1:
        return f"Evaluation protocol: {described(cells)}."
    by_method = {m: [s for (mm, _, _), s in entry["cells"].items() if mm == m] for m in entry["methods"]}
    return ("MIXED evaluation protocols — per method: "
            + "; ".join(f"{study.label('methods', m)}: {described(c)}" for m, c in by_method.items() if c) + ".")


def _rule_stage_note(entry: dict) -> str:
    """Which rule stage graded the table's cells (each summary's ``rule_stage``; one from before it was recorded
    was the harness's math-verify grade), and how many samples the other stage would have judged differently."""
    cells = list(entry["cells"].values())
    # a summary from before the rule stage was recorded was graded by the strict final box (harness)
    stages = sorted({(EvalProtocol(s.rule_stage) if s.rule_stage else EvalProtocol.HARNESS).rule_stage for s in cells})
    note = "Rule stage: " + (stages[0] if len(stages) == 1 else "MIXED — " + " + ".join(stages)) + "."
    moved = [s.rule_moved for s in cells]
    if cells and all(m is not None for m in moved):
        samples = sum((s.problems or 0) * (s.n_samples or 0) * s.n_seeds for s in cells)
        note += (f" The other rule stage (eval.protocol justrl / harness) judges {sum(moved)} of {samples} samples "
                 "differently; each cell's two rule-only accuracies in scores.csv.")
    return note


def _train_protocol_note(entry: dict, model: str, runs: dict, study: stapo_study.Study) -> str | None:
    """The training protocol recorded by each trained method's run (runs/<model>/<method>/config.yaml); a key on
    which the runs disagree is named per method and called mixed."""
    trained = [m for m in entry["methods"] if m != "base"]
    if not trained:
        return None
    recorded = {m: runs.get((model, m)) for m in trained}
    missing = [study.label("methods", m) for m, r in recorded.items() if r is None]
    have = {m: r for m, r in recorded.items() if r is not None}
    parts = []
    for label, _, _ in RUN_PROTOCOL_KEYS:
        values = {m: r[label] for m, r in have.items()}
        if len(set(values.values())) == 1:
            parts.append(f"{label} {next(iter(values.values()))}")
        elif values:
            parts.append(f"{label} MIXED (" + ", ".join(f"{study.label('methods', m)} {v}"
                                                        for m, v in values.items()) + ")")
    note = "Training protocol (runs/<model>/<method>/config.yaml): " + ("; ".join(parts) if parts else "")
    if missing:
        note += ("; " if parts else "") + f"no recorded config for {', '.join(missing)}"
    return note + "."


def _method_recipe_note(study: stapo_study.Study) -> str:
    """The methods trained with their own recipe (``methods.<key>.train``) and what differs from ``train``."""
    parts = [f"{study.label('methods', m)}: " + ", ".join(f"{k} {v}" for k, v in own.items())
             for m, own in study.train_overrides().items()]
    if not parts:
        return ""
    return ("Per-method training overrides (methods.<key>.train, over the shared train section): "
            + "; ".join(parts) + ".")


def silencing(rows: list[dict]) -> tuple[float | None, float | None, int, int]:
    """(silenced tokens, completion tokens, steps that silenced, steps) of one run's metrics.jsonl rows; the counts
    are None for a run logged before ``completion_tokens`` was (its fractions alone are known)."""
    logged = [r for r in rows if isinstance(r.get("silenced_fraction"), (int, float))]
    steps = sum(1 for r in logged if r["silenced_fraction"] > 0)
    if not logged or not all(isinstance(r.get("completion_tokens"), (int, float)) for r in logged):
        return None, None, steps, len(logged)
    return (sum(r["silenced_fraction"] * r["completion_tokens"] for r in logged),
            sum(r["completion_tokens"] for r in logged), steps, len(logged))


def _silencing_note(entry: dict, model: str, metrics: dict, study: stapo_study.Study) -> str | None:
    """How many tokens each S2T-masked method (STAPO, its ablations) silenced over its run, and its τ_p and q where
    they depart from the paper's (issue 42: a demo table whose STAPO row silenced nothing said nothing of it)."""
    parts = []
    for method in entry["methods"]:
        cfg = study.methods.get(method)
        runs = [rows for (m, run), rows in sorted(metrics.items())
                if m == model and stapo_study.split_run(run)[0] == method]
        if cfg is None or not str(cfg.token_mask or "").startswith("s2t") or not runs:
            continue
        counts = [silencing(rows) for rows in runs]
        silenced, tokens = (sum(c[i] for c in counts) if all(c[i] is not None for c in counts) else None
                            for i in (0, 1))
        steps, total = sum(c[2] for c in counts), sum(c[3] for c in counts)
        how_many = (f"{silenced:,.0f} of {tokens:,.0f} completion tokens ({100 * silenced / tokens:.2f} %)"
                    if silenced is not None and tokens else "tokens")
        params = []
        for key, symbol in (("tau_p", "τ_p"), ("entropy_quantile", "q")):
            value, paper = getattr(cfg, key), type(cfg).__dataclass_fields__[key].default
            params.append(f"{symbol} {value:g}" + (f" (the paper's {paper:g})" if value != paper else ""))
        parts.append(f"{study.label('methods', method)} silenced {how_many} at {steps} of {total} optimiser "
                     f"steps{' (all seeds)' if len(runs) > 1 else ''}; {', '.join(params)}")
    if not parts:
        return None
    return ("S2T mask (metrics.jsonl): " + "; ".join(parts) + ". The tokens, their context and the alternatives: "
            "[silenced_examples.md](silenced_examples.md).")


def _footnotes(entry: dict, model: str, study: stapo_study.Study, runs: dict | None = None,
               metrics: dict | None = None) -> list[str]:
    benches = entry["benchmarks"]
    notes = [f"Cells: accuracy (%), avg@n over samples, {_settings_note(entry['settings'], study)}; each cell's 95 % "
             "interval: [intervals.md](intervals.md) (and scores.csv). Trained methods: final checkpoint; Base: the "
             "untrained model."]
    if _verified(entry):
        notes.append("Cells: verifier-corrected / rule-only accuracy. Verifier-corrected: the rule grade "
                     "(the rule stage below) corrected by the LLM verifier (the paper's protocol; "
                     "the table's headline, compared with the paper); rule-only: before correction. A cell with "
                     "one number was not verifier-corrected.")
    else:
        notes.append("Accuracy: rule grade (the rule stage below), no LLM-verifier "
                     "correction (the paper's numbers are verifier-corrected); truncation and no-box rates in "
                     "scores.csv.")
    seeds = sorted({c.n_seeds for c in entry["cells"].values() if c.n_seeds > 1})
    if seeds:
        notes.append(f"Trained methods: the mean over {'/'.join(map(str, seeds))} seeds (workflow.seeds "
                     f"{study.seeds}), 95 % CIs over seeds and problems; each seed's number and the paired "
                     "method differences with their CIs: [seeds.md](seeds.md).")
    notes.append(_eval_protocol_note(entry, study))
    notes.append(_rule_stage_note(entry))
    train_note = _train_protocol_note(entry, model, runs or {}, study)
    if train_note:
        notes.append(train_note)
    overrides = _method_recipe_note(study)
    if overrides:
        notes.append(overrides)
    silenced = _silencing_note(entry, model, metrics or {}, study)
    if silenced:
        notes.append(silenced)
    missing = [BENCHMARKS[b].label for b in PAPER_BENCHMARKS if b not in benches]
    if missing or len(benches) != len(PAPER_BENCHMARKS):
        present = ", ".join(study.label("benchmarks", b) for b in benches)
        notes.append(f"Avg is over the {len(benches)} benchmark(s) present ({present}), not the paper's six"
                     + (f"; not evaluated: {', '.join(missing)}." if missing else "."))
    protocol = sorted({(s.benchmark, s.problems, s.n_samples) for s in entry["cells"].values()},
                      key=lambda t: benches.index(t[0]) if t[0] in benches else len(benches))
    if protocol:
        notes.append("Protocol: " + "; ".join(f"{study.label('benchmarks', b)} {p} problems × avg@{n}"
                                              for b, p, n in protocol) + ".")
    if paper_key(MODELS, model) is not None:
        notes.append("Paper numbers: STAPO v2 Table 2 (stapo/reference/paper_v2_table.csv); Δ = ours − paper.")
    return notes


def render_markdown(layout: dict, paper: dict, study: stapo_study.Study, runs: dict | None = None,
                    metrics: dict | None = None) -> str:
    lines = [f"# STAPO reproduction — study `{study.name}`", ""]
    for model, entry in layout.items():
        benches = entry["benchmarks"]
        lines += [f"## {study.label('models', model)}", ""]
        if _verified(entry):
            lines += ["Each cell: **verifier-corrected / rule-only** accuracy (%).", ""]
        lines.append("| Method | " + " | ".join(study.label("benchmarks", b) for b in benches) + " | Avg |")
        lines.append("|---|" + "---|" * (len(benches) + 1))
        lines += [f"| {name} | " + " | ".join(cells) + " |" if cells is not None else  # a family's heading row
                  f"| **{name}** |" + " |" * (len(benches) + 1)
                  for name, cells in table_rows(entry, model, paper, study)]
        lines.append("")
        lines += [f"{i}. {note}" for i, note in enumerate(_footnotes(entry, model, study, runs, metrics), 1)]
        lines.append("")
    if not layout:
        lines += ["No score summaries found.", ""]
    lines += ["Figures: [figures.md](figures.md) (each figure, its caption and the paper figure it reproduces).", ""]
    return "\n".join(lines)


def render_intervals(layout: dict, study: stapo_study.Study) -> str:
    """intervals.md: per model, the table's cells as their 95 % intervals, same rows and columns (issue 42: a
    miniature cell of 48 problems is ±10–15 points, and a reader should see it beside the number)."""
    lines = [f"# 95 % intervals — study `{study.name}`", "",
             "Each cell of [table.md](table.md) as its 95 % interval (bootstrap over problems; Avg: the benchmarks' "
             "half-widths combined, sqrt(Σ h²)/k), the first setting's with the others in parentheses. Two cells "
             "whose intervals overlap are not told apart by this evaluation.", ""]
    for model, entry in layout.items():
        benches = entry["benchmarks"]
        lines += [f"## {study.label('models', model)}", "",
                  "| Method | " + " | ".join(study.label("benchmarks", b) for b in benches) + " | Avg |",
                  "|---|" + "---|" * (len(benches) + 1)]
        lines += [f"| {name} | " + " | ".join(cells) + " |" for name, cells in interval_rows(entry, study)]
        lines.append("")
    return "\n".join(lines)


def _tex_escape(text: str) -> str:
    for a, b in (("\\", r"\textbackslash{}"), ("&", r"\&"), ("%", r"\%"), ("_", r"\_"), ("#", r"\#"),
                 ("Δ", r"$\Delta$"), ("−", "$-$"), ("–", "--")):
        text = text.replace(a, b)
    return text


def render_latex(layout: dict, paper: dict, study: stapo_study.Study) -> str:
    out = [f"% STAPO reproduction, study {study.name}: accuracy (%) at the first setting (the others)"]
    for model, entry in layout.items():
        benches = entry["benchmarks"]
        kind = "verifier-corrected / rule-only accuracy" if _verified(entry) else "accuracy"
        caption = _tex_escape(f"{study.label('models', model)}: {kind} (%), "
                              f"{_settings_note(entry['settings'], study)}. {_eval_protocol_note(entry, study)}")
        out += [r"\begin{table}[t]", r"\centering", r"\small", rf"\caption{{{caption}}}",
                r"\begin{tabular}{l" + "c" * (len(benches) + 1) + "}", r"\toprule",
                " & ".join(["Method"] + [_tex_escape(study.label("benchmarks", b)) for b in benches] + ["Avg"])
                + r" \\", r"\midrule"]
        out += [" & ".join(_tex_escape(x) for x in [name] + cells) + r" \\" if cells is not None else
                rf"\midrule \multicolumn{{{len(benches) + 2}}}{{l}}{{\emph{{{_tex_escape(name)}}}}} \\"
                for name, cells in table_rows(entry, model, paper, study)]
        out += [r"\bottomrule", r"\end{tabular}", r"\end{table}", ""]
    return "\n".join(out)


def render_csv(scores: list[Score], layout: dict, paper: dict) -> str:
    """Every evaluated cell with its CI (all checkpoints), the table rows' averages, and the paper's value."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["model", "method", "ckpt", "benchmark", "setting", "accuracy", "ci95_lo", "ci95_hi",
                "n_samples", "problems", "paper_v2", "delta", "rule_accuracy", "corrected_accuracy",
                "fallback_accuracy", "truncation_rate", "no_box_rate", "protocol", "verifier", "n_seeds",
                "rule_stage", "rule_accuracy_justrl", "rule_accuracy_harness", "rule_moved_samples"])
    opt = lambda v: "" if v is None else f"{v:.4f}"  # noqa: E731

    for s in scores:
        p = paper.get((s.model, s.method, s.benchmark, s.setting)) if s.ckpt in TABLE_CKPTS else None
        w.writerow([s.model, s.method, s.ckpt, s.benchmark, s.setting, f"{s.accuracy:.4f}", f"{s.ci_lo:.4f}",
                    f"{s.ci_hi:.4f}", s.n_samples, s.problems, _fmt(p).replace("–", ""),
                    "" if p is None else f"{s.accuracy - p:.4f}", opt(s.rule_accuracy), opt(s.corrected_accuracy),
                    opt(s.fallback_accuracy), opt(s.truncation_rate), opt(s.no_box_rate), s.protocol or "",
                    s.verifier_model or "", s.n_seeds, s.rule_stage or "", opt(s.rule_justrl),
                    opt(s.rule_harness), "" if s.rule_moved is None else s.rule_moved])
    for model, entry in layout.items():
        full = set(PAPER_BENCHMARKS) <= set(entry["benchmarks"])
        for method in entry["methods"]:
            for setting in entry["settings"]:
                avg = row_average(entry["cells"], method, entry["benchmarks"], setting)
                if avg is None:
                    continue
                p = paper.get((model, method, "avg", setting)) if full else None
                rule = _row_values(entry, method, "rule_accuracy")[("avg", setting)]
                corrected = _row_values(entry, method, "corrected_accuracy")[("avg", setting)]
                w.writerow([model, method, "base" if method == "base" else "final", "avg", setting,
                            *(f"{v:.4f}" for v in avg), "", "", _fmt(p).replace("–", ""),
                            "" if p is None else f"{avg[0] - p:.4f}", opt(rule), opt(corrected)])
    return buf.getvalue()


# ---------------------------------------------------------------------------------------------- entry points


def write_report(scores_dir, runs_dir, out_dir, study: stapo_study.Study | None = None, paper_csv=PAPER_CSV,
                 log=None, expected: dict | None = None) -> dict:
    """Write table.md, table.tex, scores.csv, the figures and their index; return the per-model layout.
    ``log``: called with one line per skipped figure (``stapo report`` prints them); ``expected``: what the study's
    evaluations ask for, by benchmark (stapo.report.results.expected_cells; ``stapo report`` checks every cell
    against it)."""
    study = study or stapo_study.default()
    out_dir = Path(out_dir)
    scores, metrics, paper = load_scores(scores_dir, expected), load_metrics(runs_dir), load_paper(paper_csv)
    layout = _layout(scores, study)
    table = render_markdown(layout, paper, study, load_run_protocols(runs_dir), metrics)
    atomic_write(out_dir / "table.md", table, inside=out_dir)
    atomic_write(out_dir / "table.tex", render_latex(layout, paper, study), inside=out_dir)
    atomic_write(out_dir / "intervals.md", render_intervals(layout, study), inside=out_dir)
    atomic_write(out_dir / "scores.csv", render_csv(scores, layout, paper), inside=out_dir)
    models = study.workflow.models or _ordered(set(layout) | {m for m, _ in metrics} | set(study.models),
                                               list(study.models))
    methods = _ordered({stapo_study.split_run(m)[0] for _, m in metrics} | {s.method for s in scores}
                       | set(study.methods),
                       list(METHODS) + list(study.methods))
    diagnostics = load_metrics(runs_dir, "diagnostics.jsonl")
    drawn = write_figures(out_dir, FigureInputs(models, methods, scores, metrics, diagnostics, study))
    examples = render_examples(load_examples(runs_dir), models, methods, study,
                               diagnosed=any(rows for rows in diagnostics.values()))
    atomic_write(out_dir / "silenced_examples.md", examples, inside=out_dir)
    cost.write_costs(out_dir, models, metrics, study)  # cost.md (its figure: time_breakdown, drawn above)
    figures = [f[:4] for f in drawn]
    notes = {stem: lines for stem, _, _, _, lines in drawn if lines}
    atomic_write(out_dir / "figures.md", render_figure_index(figures, examples, study, notes), inside=out_dir)
    if any(s.n_seeds > 1 for s in scores):  # a several-seed study: each seed and the paired comparisons
        benchmarks = _ordered({s.benchmark for s in scores}, list(study.eval.benchmarks))
        seeded = _ordered({s.model for s in scores if s.n_seeds > 1}, list(study.models))
        seeds_md = seed_report.render_seeds(seed_report.seed_cells(scores_dir), study, seeded, benchmarks,
                                            settings_order(study, scores))
        atomic_write(out_dir / "seeds.md", seeds_md, inside=out_dir)
    for stem, _, _, missing in figures:
        if missing and log:
            log(f"report: figure {stem} skipped: {missing}")
    return layout


def add_arguments(parser) -> None:
    parser.add_argument("--scores", default="scores",
                        help="directory of <model>/<method>/<ckpt>/<bench>/<setting>.summary.json")
    parser.add_argument("--runs", default="runs", help="directory of <model>/<method>/metrics.jsonl")
    parser.add_argument("--out", default="results", help="output directory (table.md, table.tex, scores.csv, figures/)")
    parser.add_argument("--config", default=None,
                        help="study YAML: its name, models, methods, benchmarks, settings and labels (default: "
                        "OUT/study.yaml, the resolved study the workflow wrote there; without one, no study: every "
                        "model and method found under --scores, the paper's settings and benchmarks)")


def study_config(config: str | None, out: str | Path) -> Path | None:
    """The study a report follows: ``--config``, else ``OUT/study.yaml`` where the workflow wrote the study whose
    report OUT holds (issue 32: a bare ``stapo report`` after the demo rewrote results/ as the paper's study)."""
    if config:
        return Path(config)
    written = Path(out) / "study.yaml"
    return written if written.is_file() else None


def run(args) -> int:
    config = study_config(args.config, args.out)
    if config is not None and not args.config:
        print(f"report: following the study in {config} (the workflow's; --config to choose another)")
    study = stapo_study.read(config, required=(), check_runs=False) if config else None
    if not Path(args.scores).is_dir():
        raise UserError(f"--scores: directory {args.scores} not found (stapo eval writes it)")
    try:
        check_creatable_dir(args.out)
    except OSError as err:
        raise UserError(f"--out: {err}") from None
    try:
        expected = expected_cells(study) if study else None
    except (OSError, ValueError) as err:
        raise UserError(f"{config}: cannot count the problems its evaluations ask for: {err}") from None
    layout = write_report(args.scores, args.runs, args.out, study, log=print, expected=expected)
    print(f"report: {sum(len(e['methods']) for e in layout.values())} rows for {len(layout)} model(s) -> {args.out}")
    return 0
