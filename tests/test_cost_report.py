"""stapo.report.cost: the cost table and the time-breakdown figure from synthetic metrics.jsonl cost fields."""

from __future__ import annotations

import json
import random

import pytest

from stapo.report import cost as cost_report, table as report
from stapo import study as stapo_study


def _rows(seed: int, steps: int = 6, k: int = 2, gpu: bool = True) -> list[dict]:
    """k optimiser steps per rollout step; the rollout's seconds on the first of them, as stapo.train.step_cost logs."""
    rng, rows = random.Random(seed), []
    for step in range(1, steps + 1):
        first = step % k == 1
        gen, fwd = (rng.uniform(5, 9), rng.uniform(1, 2)) if first else (0.0, 0.0)
        upd, tokens = rng.uniform(2, 4), rng.randint(1000, 2000)
        rows.append({"step": step, "rollout_step": (step - 1) // k + 1, "gen_seconds": gen, "forward_seconds": fwd,
                     "update_seconds": upd, "step_seconds": gen + fwd + upd, "step_tokens": tokens,
                     "tokens_per_s_per_gpu": tokens / (gen + fwd + upd) / 8, "mfu": rng.uniform(0.02, 0.3) if gpu
                     else None, "device": "NVIDIA H200" if gpu else "cpu", "peak_memory_gib": rng.uniform(20, 40)
                     if gpu else None})
    return rows


def _write(runs, model, run, rows):
    path = runs / model / run / "metrics.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_run_cost_sums_parts_per_rollout_step():
    rows = _rows(0)
    cost = cost_report.run_cost(rows)
    assert (cost["steps"], cost["rollout_steps"]) == (6, 3)
    for key in cost_report.PARTS:
        assert cost["per_rollout_step"][key] == pytest.approx(sum(r[key] for r in rows) / 3)
    assert cost["wall_hours"] == pytest.approx(sum(r["step_seconds"] for r in rows) / 3600)
    assert cost["mfu"] == pytest.approx(sum(r["mfu"] for r in rows) / 6)
    assert cost["peak_memory_gib"] == max(r["peak_memory_gib"] for r in rows)
    cpu = cost_report.run_cost(_rows(1, gpu=False))
    assert cpu["mfu"] is None and cpu["peak_memory_gib"] is None and cpu["device"] == "cpu"
    assert cost_report.run_cost([{"step": 1, "loss": 0.1}]) is None  # a run from before the cost fields


def test_report_writes_cost_table_and_time_breakdown(tmp_path):
    runs = tmp_path / "runs"
    rows = {"justrl": _rows(2), "stapo": _rows(3), "grpo": _rows(4, gpu=False)}
    for run, r in rows.items():
        _write(runs, "m", run, r)
    _write(runs, "m", "entropy20", [{"step": 1, "loss": 0.0}])  # no timings
    (tmp_path / "scores").mkdir()
    out = tmp_path / "results"
    study = stapo_study.parse({"study": "cost", "models": {"m": {"spec": "x"}}}, required=(), check_runs=False)
    report.write_report(tmp_path / "scores", runs, out, study)
    table = (out / "cost.md").read_text()
    lines = {line.split("|")[2].strip(): [c.strip() for c in line.strip("|").split("|")]
             for line in table.splitlines() if line.startswith("| m ")}
    assert set(lines) == {"JustRL", "STAPO", "GRPO", "20-Entropy"}
    stapo = cost_report.run_cost(rows["stapo"])
    per = stapo["per_rollout_step"]
    assert lines["STAPO"][5] == f"{sum(per.values()):.2f}"
    assert lines["STAPO"][8] == f"{per['update_seconds']:.2f} ({100 * per['update_seconds'] / sum(per.values()):.0f} %)"
    assert lines["STAPO"][10] == f"{stapo['mfu']:.2%}" and lines["GRPO"][10] == "—" and lines["GRPO"][11] == "—"
    assert "no timings logged" in lines["20-Entropy"][4]
    panel = cost_report.time_breakdown(report.load_metrics(runs), "m", ["grpo", "justrl", "stapo", "entropy20"])
    assert [s.variant for s in panel.series] == list(cost_report.PARTS)
    assert panel.series[2].points == ("grpo", "justrl", "stapo")  # the run without timings has no bar
    assert panel.series[2].values[2] == pytest.approx(per["update_seconds"])
    png = out / "figures" / "m_time_breakdown.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.with_suffix(".pdf").exists()
    assert "figures/m_time_breakdown.png" in (out / "figures.md").read_text()


def test_no_timings_skip_the_figure_and_say_why(tmp_path):
    panel = cost_report.time_breakdown({("m", "stapo"): [{"step": 1}]}, "m", ["stapo"])
    assert panel.series == () and "no run of this model logged step timings" in panel.missing
