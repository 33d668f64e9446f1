"""``make mini-study`` (benchmarks/mini_study.py over configs/mini-study.yaml): what it plans, and the docs folder it
writes from a finished study (the 2-hour run itself is not a test: its outputs are committed in docs/mini-study/)."""

from __future__ import annotations

import importlib.util
import json

import pytest

from test_workflow import REPO, TINY, job_counts, snakemake

MINI = REPO / "configs" / "mini-study.yaml"


def _script():
    spec = importlib.util.spec_from_file_location("mini_study", REPO / "benchmarks" / "mini_study.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_mini_study_plans_4_methods_x_3_seeds_and_their_curve(tmp_path):
    res = snakemake("-n", "--quiet", "rules", "--configfile", TINY, MINI, "--", "results/table.md", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    # 12 runs; each final on arith at 2 settings + checkpoint-15 at T 1.0 (the accuracy curve) = 36, base 2; each
    # run's checkpoint-15 snapshot moved out of its run directory (rule snapshot)
    assert job_counts(res.stdout) == {"train": 12, "snapshot": 12, "evaluate": 12 * 3 + 2, "report": 1}


def test_the_command_runs_the_two_configs_in_its_own_resumable_directory(tmp_path):
    cmd = _script().snakemake_command(tmp_path / "run", "2")
    assert cmd[cmd.index("--directory") + 1] == str(tmp_path / "run") and "--rerun-incomplete" in cmd
    files = cmd[cmd.index("--configfile") + 1:cmd.index("--")]
    assert files == [str(TINY), str(MINI)] and cmd[-1] == "results/table.md"


def test_a_run_killed_before_any_final_model_counts_as_resumed(tmp_path):
    has_earlier_work = _script().has_earlier_work
    assert not has_earlier_work(tmp_path)
    (tmp_path / "runs" / "m" / "stapo" / "seed0" / "checkpoint-15").mkdir(parents=True)  # killed at step 20
    assert has_earlier_work(tmp_path)
    assert not has_earlier_work(tmp_path / "scores-only")
    (tmp_path / "scores-only" / "scores" / "m").mkdir(parents=True)  # the base model's evaluation ran first
    assert has_earlier_work(tmp_path / "scores-only")


def test_docs_get_the_tables_figures_and_provenance(tmp_path):
    results = tmp_path / "run" / "results"
    (results / "figures").mkdir(parents=True)
    for name in ("table.md", "seeds.md", "scores.csv", "silenced_examples.md"):  # figures.md links the last
        (results / name).write_text(f"{name} body\n")
    (results / "figures.md").write_text("- m: [png](figures/m_entropy.png) · [pdf](figures/m_entropy.pdf)\n")
    (results / "figures" / "m_entropy.png").write_bytes(b"png")
    (results / "figures" / "m_entropy.pdf").write_bytes(b"pdf")
    provenance = {"command": "make mini-study", "snakemake": "snakemake ...", "commit": "abc123", "dirty": False,
                  "started": "2026-12-04 12:14 UTC", "resumed": True, "cores": 2, "load": "0.1 0.1 0.1",
                  "wall_min": 101.25, "packages": {"torch": "2.13.0+cpu", "vllm": None},
                  "weights_sha256": {"model.safetensors": "ab" * 32}}
    docs = tmp_path / "docs"
    _script().write_docs(tmp_path / "run", docs, provenance)
    assert (docs / "seeds.md").read_text() == "seeds.md body\n"
    assert (docs / "silenced_examples.md").read_text() == "silenced_examples.md body\n"  # the index's link works
    assert sorted(p.name for p in (docs / "figures").iterdir()) == ["m_entropy.png"]  # png only
    assert (docs / "figures.md").read_text() == "- m: [png](figures/m_entropy.png)\n"  # no link to a missing pdf
    run = (docs / "RUN.md").read_text()
    assert "commit: `abc123`\n" in run and "wall time 101.2 min (resumed: earlier invocations not counted)" in run
    assert "- packages: torch 2.13.0+cpu\n" in run and f"model.safetensors sha256 `{'ab' * 32}`" in run
    assert json.loads(run.split("```json\n", 1)[1].split("```", 1)[0]) == provenance
    (results / "seeds.md").unlink()  # a one-seed study writes no seeds.md: the mini-study must have it
    with pytest.raises(FileNotFoundError, match=r"results/seeds.md not found"):
        _script().write_docs(tmp_path / "run", tmp_path / "docs2", provenance)
