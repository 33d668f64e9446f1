"""Every entry point answers every bad input with one line naming the culprit (the key, file, file:line or
option), exit status != 0, no traceback, before any model or heavy import: the table of
benchmarks/bench_bad_inputs.py. The ``stapo`` and ``vllm_settings`` cases run in ONE separate process, each by a
call of its entry's ``main`` with stdout and stderr captured at the file descriptors (bench_bad_inputs.run_batch):
that process shows which heavy modules (torch, TRL, lm-eval ...) each case imported and its peak memory; the
``snakemake -n`` cases run as processes, one each. Time to each error is printed (``-s``) and bounded generously
here (a shared machine); the 3 s target, per case as a user starts it, is measured by the benchmark script."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("bench_bad_inputs", ROOT / "benchmarks" / "bench_bad_inputs.py")
bad = sys.modules["bench_bad_inputs"] = importlib.util.module_from_spec(_spec)  # its dataclass needs the entry
_spec.loader.exec_module(bad)

GENEROUS_S = 30.0  # no case loads a model; the target (3 s) is the benchmark's to measure


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    work = tmp_path_factory.mktemp("bad-inputs")
    bad.make_fixtures(work)
    holders = bad.Holders(work)  # the processes holding the locks of the 'in use' cases
    yield work
    holders.close()


@pytest.fixture(scope="module")
def canary_before(work) -> dict[str, str]:
    """The checksums of the tree outside the scratch directory that the planted links point into, before any
    case has run."""
    return bad.checksums(bad.canary(work))


@pytest.fixture(scope="module")
def batch(work, canary_before) -> dict[str, dict]:
    """The in-process cases' results, by name: all of them run once, in one process of their own."""
    return {r["name"]: r for r in bad.run_batch(work)}


def test_the_table_covers_every_entry_point():
    assert len(bad.CASES) >= 129 and len({c.name for c in bad.CASES}) == len(bad.CASES)
    assert sum(c.bounded for c in bad.CASES) >= 50 and len(bad.HOSTILE) >= 45
    # a link at every file a training run, an evaluation and a report write (tests/test_integrity.py lists them
    # from a real run)
    assert {c.name.removeprefix("train: planted link ") for c in bad.HOSTILE if "train: planted" in c.name} \
        == set(bad.TRAIN_LINKS)
    assert {c.entry for c in bad.CASES} == {"stapo", "snakemake", "vllm_settings"}
    assert {c.args[0] for c in bad.CASES if c.entry == "stapo" and c.args} == {"nope", "train", "eval", "report",
                                                                               "plan"}


@pytest.mark.parametrize("case", bad.CASES, ids=[c.name for c in bad.CASES])
def test_bad_input_is_one_line_naming_the_culprit(work, batch, case):
    result = batch[case.name] if case.entry in bad.IN_PROCESS else bad.run_case(case, work)
    print(f"{result['seconds']:.2f} s {result['peak_mb']:.0f} MB  {case.name}: {(result['lines'] or [''])[-1]}")
    assert result["rc"] != 0, result
    assert not result["traceback"], "\n".join(result["lines"])
    assert len(result["lines"]) == 1, "\n".join(result["lines"])
    assert not result["missing"], f"{result['lines']} lacks {result['missing']}"
    assert result["seconds"] < GENEROUS_S
    assert not case.needs_model
    if case.bounded:  # refused before anything is sized from the input, and nothing written
        assert result["peak_mb"] <= bad.MAX_PEAK_MB and not result["wrote"], result
    if case.entry in bad.IN_PROCESS:  # before any heavy import (peak_mb: the batch's running peak, a stricter bound)
        assert result["heavy"] == [], result["heavy"]


def test_the_batch_sees_a_heavy_import_and_a_traceback(work, monkeypatch):
    """The in-process runner can fail: a case whose entry imports a 'heavy' module (here a stdlib one standing in
    for torch, which cannot be imported twice) and crashes is reported with both."""
    import sys

    case = bad.Case("crash", "stapo", ("plan",), ("never",))

    def crash(args):
        import colorsys  # noqa: F401

        raise RuntimeError("boom")

    monkeypatch.setattr(bad, "_entry_main", lambda entry: crash)
    monkeypatch.setattr(bad, "HEAVY_MODULES", ("colorsys",))
    monkeypatch.delitem(sys.modules, "colorsys", raising=False)
    result = bad.run_in_process(case, work)
    assert result["rc"] == 1 and result["traceback"] and result["heavy"] == ["colorsys"] and not bad.ok(result, case)
    assert result["missing"] == ["never"] and result["lines"][-1] == "RuntimeError: boom"


def test_debug_keeps_the_traceback(work):
    case = next(c for c in bad.CASES if c.name == "train: num_generations 1")
    import os
    import subprocess

    res = subprocess.run([*bad.command(case, work)[:1], "--debug", *bad.command(case, work)[1:]], cwd=ROOT,
                         env=bad.env(), capture_output=True, text=True, timeout=120)
    assert res.returncode != 0 and "Traceback" in res.stderr and "StudyError" in res.stderr
    assert os.environ.get("STAPO_DEBUG", "0") in ("", "0")


def test_nothing_outside_the_scratch_directory_changed(work, canary_before, batch):
    """Every planted link points into a canary tree beside the scratch directory: after the whole in-process batch
    (each link case refused in one line) its files are byte for byte what they were."""
    assert len(canary_before) == 2 and bad.checksums(bad.canary(work)) == canary_before
    assert all(batch[c.name]["rc"] == 2 for c in bad.HOSTILE if "planted link" in c.name)
