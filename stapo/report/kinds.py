"""The one registry of the report's figures, the one loop that writes them, and the index that lists them.

Each kind is declared once, by the module that plots it (:func:`register_figure` at import), as a
:class:`FigureKind`: what it plots (``series``: a stapo.report.figures.Panel), how it is drawn (``draw``), the paper
figure it reproduces and its caption (results/figures.md), its group there, and its scope: one figure per model
(``figures/<model>_<kind>.{png,pdf}``) or one for the whole study (``figures/<kind>.{png,pdf}``). The declaring
modules, which stapo/report/__init__.py imports (the plug-in list), so the registry is complete whoever asks first:

    stapo.report.figures      training curves and token diagnostics
    stapo.report.comparison   the methods compared by their objectives (Pareto, sweeps, masking, FullMask, ratio)
    stapo.report.cost         what a training step cost

:func:`figure_kinds`' order, which is the order of results/figures.md and of the figures written, is ``GROUPS``
order, each group's kinds in the order its module declares them. Every kind is tried for every model (once for a
study-wide kind); one whose panel is missing its inputs (``Panel.missing``) is not drawn, and an earlier report's
files of it are removed.

The index (results/figures.md, :func:`render_figure_index`): per group and kind, the paper figure it reproduces,
its caption and each model's files or why it was not drawn; then the silenced-token examples page it links
(results/silenced_examples.md, :func:`render_examples`: the paper's table of spurious tokens).
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from stapo.core.atomic import atomic_write

__all__ = ["GROUPS", "FigureInputs", "FigureKind", "FIGURES", "register_figure", "figure_kinds",
           "figure_groups", "write_figures", "NO_EXAMPLES", "render_examples", "render_figure_index"]

# results/figures.md's groups, in order (a kind names its group by its title)
GROUPS = ("Training curves and token diagnostics", "1. Accuracy vs entropy stability (Pareto)",
          "2. Sensitivity sweeps: τ_p and q", "3. Masking-strategy ablation",
          "4. JustRL-FullMask: entropy and accuracy", "5. Spurious-token ratio across model sizes, and examples",
          "6. Cost per training step")
SCOPES = ("model", "study")


@dataclass(frozen=True)
class FigureInputs:
    """What the figures are made from: the study's models and methods (in drawing order), the report's Score
    records (stapo.report.results.load_scores), ``(model, run) -> rows`` of metrics.jsonl and diagnostics.jsonl
    (stapo.report.results.load_metrics) and the study (stapo.study.Study)."""

    models: list[str]
    methods: list[str]
    scores: list
    metrics: dict
    diagnostics: dict
    study: Any


@dataclass(frozen=True)
class FigureKind:
    """One kind of figure (module docstring).

    series:     ``(model, inputs) -> Panel``; ``model`` is the list of models for a study-wide kind.
    draw:       ``(panel, model, inputs) -> matplotlib Figure`` of a panel that is not missing.
    reproduces: the paper's figure it reproduces; caption: what it shows (both in results/figures.md).
    group:      its group in results/figures.md (one of ``GROUPS``).
    scope:      "model" (a figure per model) or "study" (one figure for all models).
    """

    key: str
    series: Callable
    draw: Callable
    reproduces: str
    caption: str
    group: str
    scope: str = "model"

    def stem(self, model: str | None) -> str:
        """The file name (without extension) of the figure of ``model`` (None: the study-wide one)."""
        return self.key if model is None else f"{model}_{self.key}"


FIGURES: dict[str, FigureKind] = {}


def register_figure(kind: FigureKind) -> FigureKind:
    """Declare ``kind`` (once: a key declared twice is an error, as is an unknown group or scope)."""
    if kind.key in FIGURES:
        raise ValueError(f"figure kind {kind.key!r} is declared twice")
    if kind.group not in GROUPS or kind.scope not in SCOPES:
        raise ValueError(f"figure kind {kind.key!r}: group {kind.group!r} / scope {kind.scope!r}; expected one of "
                         f"{GROUPS} / {SCOPES}")
    FIGURES[kind.key] = kind
    return kind


def figure_kinds() -> list[FigureKind]:
    """Every declared kind, in ``GROUPS`` order (within a group: declaration order)."""
    return sorted(FIGURES.values(), key=lambda k: GROUPS.index(k.group))


def figure_groups() -> list[tuple[str, tuple[FigureKind, ...]]]:
    """``[(group title, its kinds)]`` in order (results/figures.md); a group without kinds is left out."""
    kinds = figure_kinds()
    return [(title, tuple(k for k in kinds if k.group == title)) for title in GROUPS
            if any(k.group == title for k in kinds)]


def write_figures(out_dir: str | Path, inputs: FigureInputs, kinds: list[FigureKind] | None = None
                  ) -> list[tuple[str, str, str | None, str | None, list[str]]]:
    """``out_dir/figures/<stem>.{png,pdf}`` of every kind (``kinds``: default all, :func:`figure_kinds`) and model,
    each written atomically; a figure not drawn now loses its files of an earlier report. Returns
    ``[(file stem, kind, model or None, why not drawn or None, notes)]`` for results/figures.md, ``notes`` naming
    the curves hidden under an identical one (stapo.report.figures.Panel.notes)."""
    import matplotlib.pyplot as plt

    written = []
    for kind in kinds or figure_kinds():
        for model in (inputs.models if kind.scope == "model" else [None]):
            stem = kind.stem(model)
            panel = kind.series(inputs.models if model is None else model, inputs)
            notes = [] if panel.missing else panel.notes(lambda m: inputs.study.label("methods", m))
            written.append((stem, kind.key, model, panel.missing, notes))
            paths = [Path(out_dir) / "figures" / f"{stem}.{ext}" for ext in ("png", "pdf")]
            if panel.missing:
                for path in paths:
                    path.unlink(missing_ok=True)  # a planted link is removed, never followed
                continue
            fig = kind.draw(panel, model, inputs)
            for path in paths:
                buf = io.BytesIO()
                fig.savefig(buf, format=path.suffix[1:])
                atomic_write(path, buf.getvalue(), inside=out_dir)
            plt.close(fig)
    return written


# ------------------------------------------------------------------------------------------------ the index


NO_EXAMPLES = {False: "No examples logged: no run logged token diagnostics (set train.diagnostics_every > 0).",
               True: "No examples: token diagnostics were logged (train.diagnostics_every), but at none of the logged "
                     "steps did the S2T mask silence a token."}


def render_examples(examples: dict, models: list[str], methods: list[str], study,
                    per_run: int = 20, diagnosed: bool = False) -> str:
    """Markdown table of logged silenced tokens (the paper's table of spurious-token examples); ``diagnosed``:
    whether any run logged diagnostics (what an empty table says: :data:`NO_EXAMPLES`)."""
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
                      "| step | context | token | p | H | Â | top-5 alternatives (p) |",
                      "|---|---|---|---|---|---|---|"]
            for r in rows:
                top = ", ".join(f"`{esc(t['token'])}` {t['p']:.3f}" for t in r["top"])
                lines.append(f"| {r['step']} | …{esc(r['context'][-60:])} | `{esc(r['token'])}` | {r['p']:.2e} | "
                             f"{r['entropy']:.3f} | {r['advantage']:+.2f} | {top} |")
            lines.append("")
    if not found:
        lines.append(NO_EXAMPLES[diagnosed])
    return "\n".join(lines) + "\n"


def render_figure_index(figures: list[tuple[str, str, str | None, str | None]], examples: str,
                        study, notes: dict[str, list[str]] | None = None) -> str:
    """results/figures.md: per figure group and kind, in the registry's order, the paper figure it
    reproduces, its caption and each model's files, or why it was not drawn; then the examples table.
    ``figures``: ``[(file stem, kind, model or None, why skipped or None)]``; ``notes``: file stem -> lines under
    its link (a curve hidden under an identical one)."""
    notes = notes or {}
    lines = [f"# Figures — study `{study.name}`", "",
             "Written by `stapo report` (what each plots: stapo/report/figures.py, stapo/report/comparison.py); "
             "tables: "
             "[table.md](table.md). A figure whose inputs the study or its runs lack is not drawn; its line says "
             "why.", ""]
    for title, kinds in figure_groups():
        lines += [f"## {title}", ""]
        for kind in kinds:
            lines += [f"### `{kind.key}` — reproduces: {kind.reproduces}", "", kind.caption, ""]
            for stem, _, model, missing in (f for f in figures if f[1] == kind.key):
                where = study.label("models", model) if model else "all models"
                lines.append(f"- {where}: " + (f"not drawn: {missing}" if missing else
                                               f"[png](figures/{stem}.png) · [pdf](figures/{stem}.pdf)"))
                lines += [f"  - note: {note}" for note in notes.get(stem, [])]
            lines.append("")
    logged = next((f" {text}" for text in NO_EXAMPLES.values() if text in examples), "")
    lines += ["### Silenced-token examples — reproduces: the paper's examples of spurious tokens", "",
              "[silenced_examples.md](silenced_examples.md): silenced tokens with their context, probability p, "
              f"entropy H, advantage Â and the top-5 alternatives, per model and method.{logged}", ""]
    return "\n".join(lines)
