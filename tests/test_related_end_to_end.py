"""The miniature of configs/related.yaml (issue 43): every declared method of the paper, of verl and of TRL trained on
bundled:tiny-qwen3 at configs/tiny.yaml's batch shape, its final model evaluated (arith, both sampling settings), and
each in the report's table under its family's heading. Slow: ``make test-slow`` (2026-12-07: 610 s on one CPU core
with 2 steps per method, 18 trainings of 20-31 s and 38 evaluations; 374 s on a quiet machine with 1 step).

A random-init model never writes the answer, so the strict reward would be −1 everywhere (Â = 0, a zero gradient):
training uses the tests' coin reward (±1 from a hash of the completion), so every loss gets non-zero advantages.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest
import yaml

import stapo.train.trainer as T
from stapo import study
from stapo.cli import main as cli
from stapo.report import table as report
from stapo.study.methods import METHODS, Family
from stapo.tasks.rewards import REWARDS

from test_trainer import coin_reward

ROOT = Path(__file__).resolve().parents[1]
MODEL = "tiny-qwen3"


def miniature_recipe() -> dict:
    """configs/tiny.yaml with configs/related.yaml's methods, the coin reward, 1 step, arith's first 8 problems."""
    recipe = study.load(ROOT / "configs" / "tiny.yaml")
    recipe["methods"].update(yaml.safe_load((ROOT / "configs" / "related.yaml").read_text())["methods"])
    recipe["train"].update(reward="coin", max_steps=1, save_steps=1)  # one step shows it trains
    recipe["eval"].update(max_new_tokens=16, benchmarks={"arith": {"samples": 1, "n": 8, "limit": 8}})
    recipe["workflow"].update(models=[MODEL])
    return recipe


@pytest.mark.slow
def test_every_method_trains_is_evaluated_and_in_the_table(tmp_path, monkeypatch):
    monkeypatch.setitem(REWARDS, "coin", coin_reward)
    recipe = miniature_recipe()
    methods = list(recipe["methods"])
    assert {METHODS[m].family for m in methods} == {Family.PAPER, Family.VERL, Family.TRL} and len(methods) == 18
    config = tmp_path / "study.yaml"
    config.write_text(yaml.safe_dump(recipe, sort_keys=False))
    runs, scores, timings = tmp_path / "runs", tmp_path / "scores", {}
    for method in methods:
        start = time.monotonic()
        T.train(study.resolve_plan(recipe, MODEL, method), runs / MODEL / method)
        rows = [json.loads(line) for line in (runs / MODEL / method / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in rows] == [1], method
        assert all(math.isfinite(r["loss"]) and r["grad_norm"] > 0 for r in rows), (method, rows)
        timings[method] = round(time.monotonic() - start, 1)
    for method in ["base", *methods]:
        model = "bundled:tiny-qwen3" if method == "base" else str(runs / MODEL / method / "final")
        for setting in recipe["eval"]["settings"]:
            out = scores / MODEL / method / ("base" if method == "base" else "final") / "arith" / f"{setting}.jsonl"
            assert cli(["eval", "--model", model, "--benchmark", "arith", "--setting", setting, "--recipe",
                        str(config), "--backend", "hf", "--out", str(out)]) == 0, (method, setting)
    report.write_report(scores, runs, tmp_path / "results", study.read(config, required=(), check_runs=False))
    table = (tmp_path / "results" / "table.md").read_text()
    labels = [line.split("|")[1].strip() for line in table.splitlines() if line.startswith("| ")][1:]
    expected = ["Base"] + [row for family in (Family.PAPER, Family.VERL, Family.TRL)
                           for row in [f"**{family.title}**"] + [METHODS[m].label for m in methods
                                                                  if METHODS[m].family is family]]
    print(f"trained (s): {timings}\n{table}")
    assert labels == expected
