"""``stapo report``: the paper's Table 2 and training figures from score summaries and training metrics.

Inputs:
    scores/<model>/<method>/<ckpt>/<benchmark>/<setting>.summary.json   one evaluation (``stapo eval``)
    runs/<model>/<method>/metrics.jsonl                                 one line per optimiser step (``stapo train``)
    runs/<model>/<method>/diagnostics.jsonl, silenced_examples.jsonl   token diagnostics (train.diagnostics_every)
Outputs (under ``--out``, each written atomically):
    table.md     per model: rows = methods (+ the untrained base), columns = benchmarks + Avg, each cell the
                 accuracy (%) at the study's first sampling setting, the others in parentheses (the paper's:
                 "T1.0 (T0.7)" = (T 1.0, top-p 1.0) and (T 0.7, top-p 0.9)); for the paper's models the
                 paper's v2 numbers and our Δ follow each method's row. Accuracy is the rule grade
                 corrected by the LLM verifier where the evaluation ran one (the paper's protocol), else the
                 strict rule grade; with a verifier, a "(rule only)" row follows each method
    table.tex    the same as LaTeX (booktabs)
    scores.csv   every evaluated cell (all checkpoints) with its 95 % CI, plus per-row averages; per cell also the
                 rule-only, verifier-corrected and lenient-fallback accuracies, truncation and no-box rates
    figures/<model>_<kind>.{png,pdf}   for each of ``FIGURE_KINDS`` (what each plots: ``stapo.figures``)
    silenced_examples.md   the logged silenced tokens: context, token, p, H, Â and the top-5 alternatives

The table uses the ``final`` checkpoint of each trained method and ``base`` for the untrained model. Avg is the
mean over the benchmarks present; its CI half-width is sqrt(Σ h_i²)/k (independent benchmarks, normal approx.).
Rows, columns, settings and labels follow the study (``--config``, read through stapo.study): any number of
benchmarks and settings, a study's own labels (``label:``) and its curve benchmark.
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass
from pathlib import Path

from stapo import study as stapo_study
from stapo.atomic import atomic_write
from stapo.figures import FIGURE_KINDS, settings_order, write_figures  # FIGURE_KINDS: the files write_report writes
from stapo.names import BENCHMARKS, METHODS, MODELS, PAPER_BENCHMARKS, SETTINGS, paper_key

__all__ = ["add_arguments", "run", "load_scores", "load_metrics", "load_paper", "write_report", "FIGURE_KINDS"]

PAPER_CSV = Path(__file__).parent / "reference" / "paper_v2_table.csv"
TABLE_CKPTS = ("final", "base")


@dataclass(frozen=True)
class Score:
    """One evaluation: accuracy avg@n (%) and its 95 % CI."""

    model: str
    method: str
    ckpt: str
    benchmark: str
    setting: str
    accuracy: float
    ci_lo: float
    ci_hi: float
    n_samples: int | None = None
    problems: int | None = None
    rule_accuracy: float | None = None  # strict rule grade (== accuracy without a verifier)
    corrected_accuracy: float | None = None  # rule grade corrected by the LLM verifier (None: no verifier)
    fallback_accuracy: float | None = None  # the lenient fallback diagnostic
    truncation_rate: float | None = None  # % of samples that hit max_new_tokens
    no_box_rate: float | None = None  # % of samples without a final \boxed{}


# ---------------------------------------------------------------------------------------------- loading


def load_scores(scores_dir: str | Path) -> list[Score]:
    """Every ``<model>/<method>/<ckpt>/<benchmark>/<setting>.summary.json`` under ``scores_dir``."""
    scores = []
    for path in sorted(Path(scores_dir).glob("*/*/*/*/*.summary.json")):
        model, method, ckpt, benchmark = path.relative_to(scores_dir).parts[:4]
        setting = path.name[: -len(".summary.json")]
        try:
            s = json.loads(path.read_text(encoding="utf-8"))
            rule = float(s["avg_at_n"])
            corrected = s.get("avg_at_n_corrected")
            acc = rule if corrected is None else float(corrected)  # the paper reports verifier-corrected
            ci = (s.get("ci95") if corrected is None else s.get("ci95_corrected")) or (acc, acc)
            lo, hi = (float(v) for v in ci)
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{path}: not a score summary (need avg_at_n and ci95): {e}") from e
        scores.append(Score(model, method, ckpt, benchmark, setting, acc, lo, hi, s.get("n_samples"),
                            s.get("problems"), rule, None if corrected is None else acc,
                            s.get("avg_at_n_fallback"), s.get("truncation_rate"), s.get("no_box_rate")))
    return scores


def load_metrics(runs_dir: str | Path, name: str = "metrics.jsonl") -> dict[tuple[str, str], list[dict]]:
    """``(model, method) -> [rows of runs/*/*/<name> per step]`` sorted by step; a resumed run's repeated steps
    keep the last."""
    out = {}
    for path in sorted(Path(runs_dir).glob(f"*/*/{name}")):
        by_step = {}
        for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                by_step[int(row["step"])] = row
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(f"{path}:{lineno}: bad line (need a JSON object with 'step'): {e}") from e
        model, method = path.relative_to(runs_dir).parts[:2]
        out[(model, method)] = [by_step[k] for k in sorted(by_step)]
    return out


def load_paper(path: str | Path = PAPER_CSV) -> dict[tuple[str, str, str, str], float]:
    """The paper's v2 Table 2 in our keys: ``(model, method, benchmark|'avg', setting) -> accuracy``.

    The file names models, methods, benchmarks and settings by their paper keys (``stapo.names``, ``Name.paper``);
    a name the registry does not know is an error (naming the file and the row).
    """
    ours = {field: {n.paper: n.key for n in registry.values() if n.paper} for field, registry in
            (("model", MODELS), ("method", METHODS), ("benchmark", BENCHMARKS), ("setting", SETTINGS))}
    ours["benchmark"]["avg"] = "avg"
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    paper = {}
    for i, r in enumerate(rows, 2):
        unknown = [f"{field} {r[field]!r}" for field in ours if r[field] not in ours[field]]
        if unknown:
            raise ValueError(f"{path}:{i}: {', '.join(unknown)} not in stapo.names")
        paper[tuple(ours[field][r[field]] for field in ours)] = float(r["accuracy"])
    return paper


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
            "methods": _ordered({m for m, _, _ in cells}, method_order),
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
    mean = sum(s.accuracy for s in got) / len(got)
    half = math.sqrt(sum(((s.ci_hi - s.ci_lo) / 2) ** 2 for s in got)) / len(got)
    return mean, mean - half, mean + half


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


def _cell(vals, bench, settings, signed=False) -> str:
    """"first (second, ...)": the value at the first setting, the others in parentheses."""
    first, *others = [_fmt(vals[(bench, s)], signed) for s in settings]
    return f"{first} ({', '.join(others)})" if others else first


def table_rows(entry: dict, model: str, paper: dict, study: stapo_study.Study) -> list[tuple[str, list[str]]]:
    """``[(row label, [cell per benchmark + Avg])]`` for one model: ours, then paper v2 and Δ for paper models."""
    columns, settings, rows = entry["benchmarks"] + ["avg"], entry["settings"], []
    for method in entry["methods"]:
        ours = _row_values(entry, method)
        name = study.label("methods", method)
        rows.append((name, [_cell(ours, b, settings) for b in columns]))
        if _verified(entry):
            rule = _row_values(entry, method, "rule_accuracy")
            rows.append((f"{name} (rule only)", [_cell(rule, b, settings) for b in columns]))
        theirs = _paper_values(paper, model, method, entry)
        if theirs is None:
            continue
        delta = {k: (ours[k] - theirs[k]) if ours.get(k) is not None and theirs[k] is not None else None
                 for k in theirs}
        rows.append((f"{name} (paper v2)", [_cell(theirs, b, settings) for b in columns]))
        rows.append((f"{name} Δ ours − paper", [_cell(delta, b, settings, signed=True) for b in columns]))
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


def _footnotes(entry: dict, model: str, study: stapo_study.Study) -> list[str]:
    benches = entry["benchmarks"]
    notes = [f"Cells: accuracy (%), avg@n over samples, {_settings_note(entry['settings'], study)}; 95 % CIs in "
             "scores.csv. Trained methods: final checkpoint; Base: the untrained model."]
    if _verified(entry):
        notes.append("Accuracy: strict rule grade (final \\boxed{} answer, math-verify) corrected by the LLM "
                     "verifier (the paper's protocol); \"(rule only)\" rows: before correction.")
    else:
        notes.append("Accuracy: strict rule grade (final \\boxed{} answer, math-verify), no LLM-verifier "
                     "correction (the paper's numbers are verifier-corrected); truncation and no-box rates in "
                     "scores.csv.")
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


def render_markdown(layout: dict, paper: dict, study: stapo_study.Study) -> str:
    lines = [f"# STAPO reproduction — study `{study.name}`", ""]
    for model, entry in layout.items():
        benches = entry["benchmarks"]
        lines += [f"## {study.label('models', model)}", ""]
        lines.append("| Method | " + " | ".join(study.label("benchmarks", b) for b in benches) + " | Avg |")
        lines.append("|---|" + "---|" * (len(benches) + 1))
        lines += [f"| {name} | " + " | ".join(cells) + " |" for name, cells in table_rows(entry, model, paper, study)]
        lines.append("")
        lines += [f"{i}. {note}" for i, note in enumerate(_footnotes(entry, model, study), 1)]
        lines.append("")
    if not layout:
        lines += ["No score summaries found.", ""]
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
        caption = _tex_escape(f"{study.label('models', model)}: accuracy (%), "
                              f"{_settings_note(entry['settings'], study)}.")
        out += [r"\begin{table}[t]", r"\centering", r"\small", rf"\caption{{{caption}}}",
                r"\begin{tabular}{l" + "c" * (len(benches) + 1) + "}", r"\toprule",
                " & ".join(["Method"] + [_tex_escape(study.label("benchmarks", b)) for b in benches] + ["Avg"])
                + r" \\", r"\midrule"]
        out += [" & ".join(_tex_escape(x) for x in [name] + cells) + r" \\"
                for name, cells in table_rows(entry, model, paper, study)]
        out += [r"\bottomrule", r"\end{tabular}", r"\end{table}", ""]
    return "\n".join(out)


def render_csv(scores: list[Score], layout: dict, paper: dict) -> str:
    """Every evaluated cell with its CI (all checkpoints), the table rows' averages, and the paper's value."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["model", "method", "ckpt", "benchmark", "setting", "accuracy", "ci95_lo", "ci95_hi",
                "n_samples", "problems", "paper_v2", "delta", "rule_accuracy", "corrected_accuracy",
                "fallback_accuracy", "truncation_rate", "no_box_rate"])
    opt = lambda v: "" if v is None else f"{v:.4f}"  # noqa: E731

    for s in scores:
        p = paper.get((s.model, s.method, s.benchmark, s.setting)) if s.ckpt in TABLE_CKPTS else None
        w.writerow([s.model, s.method, s.ckpt, s.benchmark, s.setting, f"{s.accuracy:.4f}", f"{s.ci_lo:.4f}",
                    f"{s.ci_hi:.4f}", s.n_samples, s.problems, _fmt(p).replace("–", ""),
                    "" if p is None else f"{s.accuracy - p:.4f}", opt(s.rule_accuracy), opt(s.corrected_accuracy),
                    opt(s.fallback_accuracy), opt(s.truncation_rate), opt(s.no_box_rate)])
    for model, entry in layout.items():
        full = set(PAPER_BENCHMARKS) <= set(entry["benchmarks"])
        for method in entry["methods"]:
            for setting in entry["settings"]:
                avg = row_average(entry["cells"], method, entry["benchmarks"], setting)
                if avg is None:
                    continue
                p = paper.get((model, method, "avg", setting)) if full else None
                w.writerow([model, method, "base" if method == "base" else "final", "avg", setting,
                            *(f"{v:.4f}" for v in avg), "", "", _fmt(p).replace("–", ""),
                            "" if p is None else f"{avg[0] - p:.4f}"])
    return buf.getvalue()


def render_examples(examples: dict, models: list[str], methods: list[str], study: stapo_study.Study,
                    per_run: int = 20) -> str:
    """Markdown table of logged silenced tokens (the paper's table of spurious-token examples)."""
    def esc(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", "⏎").replace("`", "'")

    lines = ["# Silenced-token examples", "",
             "Tokens the S2T mask silences (Â > 0, p < τ_p, H below the candidates' q-quantile), logged every "
             "`train.diagnostics_every` steps, with the policy's top-5 alternatives at that position.", ""]
    found = False
    for model in models:
        for method in methods:
            rows = examples.get((model, method), [])[:per_run]
            if not rows:
                continue
            found = True
            lines += [f"## {study.label('models', model)} / {study.label('methods', method)}", "",
                      "| step | context | token | p | H | Â | top-5 alternatives (p) |", "|---|---|---|---|---|---|---|"]
            for r in rows:
                top = ", ".join(f"`{esc(t['token'])}` {t['p']:.3f}" for t in r["top"])
                lines.append(f"| {r['step']} | …{esc(r['context'][-60:])} | `{esc(r['token'])}` | {r['p']:.2e} | "
                             f"{r['entropy']:.3f} | {r['advantage']:+.2f} | {top} |")
            lines.append("")
    if not found:
        lines.append("No examples logged (set train.diagnostics_every > 0 to record them).")
    return "\n".join(lines) + "\n"


def _load_examples(runs_dir) -> dict[tuple[str, str], list[dict]]:
    out = {}
    for path in sorted(Path(runs_dir).glob("*/*/silenced_examples.jsonl")):
        model, method = path.relative_to(runs_dir).parts[:2]
        out[(model, method)] = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]
    return out


# ---------------------------------------------------------------------------------------------- entry points


def write_report(scores_dir, runs_dir, out_dir, study: stapo_study.Study | None = None, paper_csv=PAPER_CSV) -> dict:
    """Write table.md, table.tex, scores.csv and the figures; return the per-model layout."""
    study = study or stapo_study.default()
    out_dir = Path(out_dir)
    scores, metrics, paper = load_scores(scores_dir), load_metrics(runs_dir), load_paper(paper_csv)
    layout = _layout(scores, study)
    atomic_write(out_dir / "table.md", render_markdown(layout, paper, study))
    atomic_write(out_dir / "table.tex", render_latex(layout, paper, study))
    atomic_write(out_dir / "scores.csv", render_csv(scores, layout, paper))
    models = study.workflow.models or _ordered(set(layout) | {m for m, _ in metrics} | set(study.models),
                                               list(study.models))
    methods = _ordered({m for _, m in metrics} | {s.method for s in scores} | set(study.methods),
                       list(METHODS) + list(study.methods))
    write_figures(out_dir, models, methods, scores, metrics, load_metrics(runs_dir, "diagnostics.jsonl"), study)
    atomic_write(out_dir / "silenced_examples.md", render_examples(_load_examples(runs_dir), models, methods, study))
    return layout


def add_arguments(parser) -> None:
    parser.add_argument("--scores", default="scores",
                        help="directory of <model>/<method>/<ckpt>/<bench>/<setting>.summary.json")
    parser.add_argument("--runs", default="runs", help="directory of <model>/<method>/metrics.jsonl")
    parser.add_argument("--out", default="results", help="output directory (table.md, table.tex, scores.csv, figures/)")
    parser.add_argument("--config", default=None,
                        help="study YAML (its models, methods, benchmarks, settings and labels; default the paper's)")


def run(args) -> int:
    study = stapo_study.read(args.config, required=(), check_runs=False) if args.config else None
    layout = write_report(args.scores, args.runs, args.out, study)
    print(f"report: {sum(len(e['methods']) for e in layout.values())} rows for {len(layout)} model(s) -> {args.out}")
    return 0
