"""What each training run cost: the report's cost table (results/cost.md) and its time-breakdown figure.

Read from the cost fields of metrics.jsonl (stapo.train.step_cost), per run (one metrics.jsonl; a several-seed study's
seeds are separate runs):

    steps            optimiser steps with timings (rollout steps: the paper's unit)
    wall h           Σ step_seconds (saving checkpoints and logging between steps are not in it)
    s / step         seconds per rollout step, and its split into generation, π_old/reference forward and update
    tokens/s/GPU     mean over the steps of step_tokens / step_seconds / processes
    MFU              mean of the update's MFU; "—" where the run recorded no device peak (CPU)
    peak GiB         the highest peak allocated GPU memory of any step; "—" on CPU

``time_breakdown`` (one figure per model, declared at the end, in stapo.report.kinds): one horizontal bar per run,
seconds per rollout step stacked by part. Runs logged before these fields existed have no timings: their row says
so and they have no bar.
"""

from __future__ import annotations

from pathlib import Path

from stapo import study as stapo_study
from stapo.core.atomic import atomic_write
from stapo.report.kinds import GROUPS, FigureKind, register_figure
from stapo.report.figures import Panel, Series

__all__ = ["PARTS", "run_cost", "render_cost_table", "time_breakdown", "write_costs"]

PARTS = {"gen_seconds": "generation", "forward_seconds": "π_old / ref forward", "update_seconds": "update"}


def _numbers(rows: list[dict], key: str) -> list[float]:
    return [float(r[key]) for r in rows if isinstance(r.get(key), (int, float))]


def run_cost(rows: list[dict]) -> dict | None:
    """The cost of one run from its metrics.jsonl rows (module docstring), or None when no row has timings."""
    timed = [r for r in rows if all(isinstance(r.get(k), (int, float)) for k in PARTS)]
    if not timed:
        return None
    rollout_steps = len({r.get("rollout_step", r["step"]) for r in timed})
    seconds = {k: sum(r[k] for r in timed) for k in PARTS}
    mean = lambda key: (sum(v) / len(v)) if (v := _numbers(timed, key)) else None  # noqa: E731
    memory = _numbers(timed, "peak_memory_gib")
    return {"steps": len(timed), "rollout_steps": rollout_steps, "wall_hours": sum(_numbers(timed, "step_seconds"))
            / 3600, "per_rollout_step": {k: v / rollout_steps for k, v in seconds.items()},
            "tokens_per_s_per_gpu": mean("tokens_per_s_per_gpu"), "mfu": mean("mfu"),
            "peak_memory_gib": max(memory) if memory else None, "device": timed[-1].get("device")}


def _fmt(value, spec: str) -> str:
    return "—" if value is None else format(value, spec)


def render_cost_table(metrics: dict, models: list[str], study: stapo_study.Study) -> str:
    """results/cost.md: one row per run of ``metrics`` (``(model, run) -> rows``), models in the study's order."""
    lines = [f"# Training cost — study `{study.name}`", "",
             "Per run, from metrics.jsonl (stapo/train/step_cost.py: what each field measures; stapo/report/cost.py). "
             "A training step is one rollout batch; its seconds are split into generation (with rewards), the "
             "no-grad π_old / reference forward and the update (loss forward, backward, optimiser step). MFU: the "
             "update's model FLOPs (6·N·tokens + attention) over its seconds × processes × the device's peak; — "
             "where the device's peak is unknown (CPU).", "",
             "| Model | Run | Device | Steps (rollout) | Wall h | s / step | generation | π_old / ref fwd | update "
             "| tokens/s/GPU | MFU | Peak GiB |", "|" + "---|" * 12]
    for (model, run), rows in sorted(metrics.items(), key=lambda kv: (models.index(kv[0][0]) if kv[0][0] in models
                                                                      else len(models), kv[0])):
        cost, name, run = run_cost(rows), study.label("models", model), _run_label(study, run)
        if cost is None:
            lines.append(f"| {name} | {run} | — | {len(rows)} | no timings logged (a run older than the cost "
                         "fields) |||||||| ")
            continue
        per = cost["per_rollout_step"]
        total = sum(per.values())
        share = [f"{per[k]:.2f} ({100 * per[k] / total:.0f} %)" if total else "—" for k in PARTS]
        lines.append(f"| {name} | {run} | {cost['device'] or '—'} | {cost['steps']} ({cost['rollout_steps']}) | "
                     f"{cost['wall_hours']:.3f} | {total:.2f} | {' | '.join(share)} | "
                     f"{_fmt(cost['tokens_per_s_per_gpu'], ',.0f')} | {_fmt(cost['mfu'], '.2%')} | "
                     f"{_fmt(cost['peak_memory_gib'], '.1f')} |")
    return "\n".join(lines) + "\n"


def time_breakdown(metrics: dict, model: str, runs: list[str]) -> Panel:
    """One series per part of the step (``variant`` = its metrics.jsonl field): per run of ``model`` (``points``),
    its seconds per rollout step; runs without timings are left out."""
    costs = {run: cost for run in runs if (cost := run_cost(metrics.get((model, run), []))) is not None}
    series = tuple(Series(run_part, tuple(costs), tuple(c["per_rollout_step"][key] for c in costs.values()),
                          variant=key, points=tuple(costs)) for key, run_part in PARTS.items()) if costs else ()
    missing = None if costs else "no run of this model logged step timings (metrics.jsonl cost fields)"
    return Panel("time_breakdown", series, "wall seconds per training step (rollout batch), under the machine's "
                 "load", None, missing=missing)


def _run_label(study, run: str) -> str:
    method, seed = stapo_study.split_run(run)
    return study.label("methods", method) + ("" if seed is None else f" seed {seed}")


def _draw(panel: Panel, model: str, study):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = list(panel.series[0].points)
    fig, ax = plt.subplots(figsize=(5.5, 1.6 + 0.45 * len(runs)), dpi=120)
    left = [0.0] * len(runs)
    for s in panel.series:
        ax.barh(range(len(runs)), s.values, left=left, label=s.method, height=0.6)
        left = [a + b for a, b in zip(left, s.values)]
    ax.set_yticks(range(len(runs)), [_run_label(study, r) for r in runs], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(panel.xlabel, fontsize=8)  # the whole label fits the figure's width
    ax.margins(x=0.05, y=0.3)
    ax.set_title(f"{study.label('models', model)}: wall time per training step (not load-normalised)", fontsize=9)
    fig.legend(*ax.get_legend_handles_labels(), fontsize=7, frameon=False, loc="lower center", ncol=3)
    fig.tight_layout(rect=(0, 0.08, 1, 1))  # the legend below the axis
    return fig


def write_costs(out_dir: Path, models: list[str], metrics: dict, study) -> None:
    """Write cost.md (the figure: ``time_breakdown``, written by stapo.report.kinds.write_figures)."""
    atomic_write(Path(out_dir) / "cost.md", render_cost_table(metrics, models, study), inside=out_dir)


def _model_breakdown(model: str, inputs) -> Panel:
    return time_breakdown(inputs.metrics, model, sorted(run for m, run in inputs.metrics if m == model))


register_figure(FigureKind(
    "time_breakdown", _model_breakdown, lambda panel, model, inputs: _draw(panel, model, inputs.study),
    "the paper's 5–7 days per run on 64 GPUs (its cost)", "Wall seconds per training step (rollout batch) of each "
    "run, split into generation, the π_old / reference forward and the update (metrics.jsonl; "
    "stapo.train.step_cost). Wall time under whatever else the machine ran: runs that shared their CPUs or GPUs "
    "with other jobs (make demo runs two at a time on 2 cores) are slower for that, not for their method; compare "
    "methods only between runs made alone on the same machine. Table: [cost.md](cost.md).", GROUPS[6]))
