"""stapo.evaluate and stapo.tasks: statistics, config resolution, the lm-eval task group, end-to-end `stapo eval`."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers / huggingface_hub are imported

import json
import logging
from argparse import Namespace
from pathlib import Path

import numpy as np
import pytest

from stapo import evaluate
from stapo.evaluate import avg_at_n, bootstrap_ci, maj_at_n, pass_at_k, resolve_config, summarize

SHARED = Path(__file__).resolve().parents[2] / "shared"
DATA_DIR = SHARED / "data" / "benchmarks"
needs_data = pytest.mark.skipif(not DATA_DIR.is_dir(), reason=f"benchmark data not found at {DATA_DIR} "
                                "(the repo's sibling shared/ checkout)")
LOCAL = ["aime24", "aime25", "amc23", "math500", "minerva", "olympiadbench"]
TINY = "bundled:tiny-qwen3"

# ---------------------------------------------------------------------------------------------- statistics

C = np.array([[1, 0, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]], dtype=bool)


def test_avg_and_pass_at_k_hand_computed():
    assert avg_at_n(C) == pytest.approx(100 * 5 / 12)
    assert pass_at_k(C, 1) == pytest.approx(100 * (0.25 + 1 + 0) / 3)  # pass@1 == avg@N
    assert pass_at_k(C, 2) == pytest.approx(100 * ((1 - 3 / 6) + 1 + 0) / 3)  # 1 - C(3,2)/C(4,2) = 0.5
    assert pass_at_k(C, 4) == pytest.approx(100 * 2 / 3)
    with pytest.raises(ValueError, match="k=5"):
        pass_at_k(C, 5)


def test_maj_at_n_votes_on_normalised_answers():
    extracted = [["5", "6", "6", "7"], ["1", "1", "1", "1"], [None, None, None, None]]
    assert maj_at_n(extracted, C) == pytest.approx(100 / 3)
    # \dfrac and \frac vote together; ties go to the first answer seen
    assert maj_at_n([["\\dfrac{1}{2}", "3", "\\frac{1}{2}", "3"]], np.array([[1, 0, 1, 0]], bool)) == 100.0
    assert maj_at_n([["a", "b"]], np.array([[0, 1]], bool)) == 0.0


def test_bootstrap_ci_hand_computed():
    assert bootstrap_ci(np.array([[1, 0], [0, 1]], bool)) == [50.0, 50.0]  # every problem at 50 %
    # two problems at 0 % and 100 %: resampled means are 0 / 50 / 100 with prob 1/4, 1/2, 1/4
    assert bootstrap_ci(np.array([[0, 0], [1, 1]], bool)) == [0.0, 100.0]
    lo, hi = bootstrap_ci(C)
    assert 0 <= lo < avg_at_n(C) < hi <= 100


def _args(**kw) -> Namespace:
    base = dict(model=TINY, benchmark="math500", setting="t0.7_p0.9", out="x.jsonl", recipe=None, backend=None,
                data_dir=None, samples=None, limit=None, max_new_tokens=None, seed=0, grade_timeout=5.0)
    return Namespace(**{**base, **kw})


def test_summary_keys_and_values():
    cfg = resolve_config(_args(samples=4, backend="hf"))
    records = [{"problem_id": f"p{i}", "sample": k, "completion": "", "extracted": ["5", "1", None][i],
                "gold": "1", "correct": bool(C[i, k]), "status": "unparsable" if i == 2 else "ok"}
               for i in range(3) for k in range(4)]
    s = summarize(records, cfg, "/m")
    assert set(s) == {"benchmark", "setting", "model", "avg_at_n", "ci95", "pass_at_k", "maj_at_n", "n_samples",
                      "problems", "samples", "timeouts", "unparsable", "generation", "lm_eval_version"}
    assert s["avg_at_n"] == pytest.approx(100 * 5 / 12) and s["pass_at_k"]["4"] == pytest.approx(200 / 3)
    assert (s["problems"], s["samples"], s["unparsable"], s["timeouts"]) == (3, 12, 4, 0)
    g = s["generation"]
    assert (g["temperature"], g["top_p"], g["max_new_tokens"], g["n"], g["backend"]) == (0.7, 0.9, 20480, 4, "hf")


# -------------------------------------------------------------------------------------------------- config


def test_paper_defaults_without_recipe():
    assert resolve_config(_args(benchmark="aime24")).n == 32
    assert resolve_config(_args(benchmark="amc23")).n == 32
    cfg = resolve_config(_args(benchmark="olympiadbench", setting="t1.0_p1.0"))
    assert (cfg.n, cfg.max_new_tokens, cfg.temperature, cfg.top_p, cfg.backend) == (4, 20480, 1.0, 1.0, "vllm")
    assert cfg.gen_kwargs()["do_sample"] is True and cfg.gen_kwargs()["top_k"] == -1


def test_recipe_section_and_cli_overrides(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("train: {whatever: 1}\neval:\n  backend: hf\n  max_new_tokens: 64\n  limit: 5\n"
                      "  benchmarks: {math500: {samples: 2}}\n")
    cfg = resolve_config(_args(recipe=str(recipe)))
    assert (cfg.backend, cfg.max_new_tokens, cfg.limit, cfg.n) == ("hf", 64, 5, 2)
    assert resolve_config(_args(benchmark="aime24", recipe=str(recipe))).n == 32  # untouched paper default
    cfg = resolve_config(_args(recipe=str(recipe), samples=3, limit=1, max_new_tokens=8))
    assert (cfg.n, cfg.limit, cfg.max_new_tokens) == (3, 1, 8)
    assert cfg.gen_kwargs()["top_k"] == 0  # HF: no top-k cut, like vLLM


def test_per_benchmark_limit_and_arith_keys(tmp_path):
    recipe = tmp_path / "tiny.yaml"
    recipe.write_text("eval:\n  limit: 2\n  max_new_tokens: 64\n"
                      "  benchmarks: {arith: {samples: 1, n: 10, limit: 10, max_new_tokens: 32}}\n")
    cfg = resolve_config(_args(benchmark="arith", recipe=str(recipe)))
    assert (cfg.n, cfg.limit, cfg.max_new_tokens, cfg.arith) == (1, 10, 32, {"n": 10})
    assert resolve_config(_args(recipe=str(recipe))).limit == 2  # other benchmarks keep the section's limit
    assert resolve_config(_args(benchmark="arith", recipe=str(recipe), limit=3)).limit == 3


def test_config_errors_name_the_bad_key(tmp_path):
    with pytest.raises(KeyError, match="t0.5"):
        resolve_config(_args(setting="t0.5"))
    with pytest.raises(KeyError, match="gsm8k"):
        resolve_config(_args(benchmark="gsm8k"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("eval: {max_tokens: 5}\n")
    with pytest.raises(ValueError, match="max_tokens"):
        resolve_config(_args(recipe=str(bad)))
    bad.write_text("eval: {benchmarks: {math500: {sample: 4}}}\n")
    with pytest.raises(ValueError, match=r"eval.benchmarks.math500: unknown key\(s\) \['sample'\]"):
        resolve_config(_args(recipe=str(bad)))
    with pytest.raises(FileNotFoundError, match="nope.yaml"):
        resolve_config(_args(recipe=str(tmp_path / "nope.yaml")))


# ------------------------------------------------------------------------------------------------ tasks


def test_registry_hub_ids_and_counts():
    from stapo.tasks import BENCHMARKS

    for name in LOCAL:
        b = BENCHMARKS[name]
        assert b.hub_id and b.hub_id.count("/") == 1 and b.expected_rows
    assert BENCHMARKS["olympiadbench"].expected_rows == (674, 675)


def test_hub_rows_map_fields_and_join_multi_answers(monkeypatch, caplog):
    """No network in tests: datasets.load_dataset is replaced; the registry's id/config/split/fields are checked."""
    import datasets

    from stapo.tasks import load_rows

    calls = []

    def fake_load(path, name=None, split=None):
        calls.append((path, name, split))
        return [{"question": f"q{i}", "final_answer": ["69", "84"]} for i in range(3)]

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    with caplog.at_level(logging.WARNING, logger="stapo.tasks"):
        rows = load_rows("olympiadbench")
    assert calls == [("Hothan/OlympiadBench", "OE_TO_maths_en_COMP", "train")]
    assert rows[0] == {"id": "olympiadbench-0000", "problem": "q0", "answer": "69,84"}
    assert "has 3 rows; expected 674 or 675" in caplog.text


@needs_data
def test_local_rows_and_count_warning(tmp_path, caplog):
    from stapo.tasks import load_rows

    assert [len(load_rows(b, DATA_DIR)) for b in LOCAL] == [30, 30, 40, 500, 272, 674]
    (tmp_path / "aime24.jsonl").write_text((DATA_DIR / "aime24.jsonl").read_text().splitlines()[0] + "\n")
    with caplog.at_level(logging.WARNING, logger="stapo.tasks"):
        assert len(load_rows("aime24", tmp_path)) == 1
    assert "has 1 rows; expected 30" in caplog.text
    with pytest.raises(FileNotFoundError, match="amc23.jsonl"):
        load_rows("amc23", tmp_path)


def test_arith_rows_come_from_stapo_data():
    from stapo.data import synthetic_arith_rows
    from stapo.tasks import load_rows

    rows = load_rows("arith", n=5, seed=3, difficulty=2)
    assert [r["answer"] for r in rows] == [str(r["answer"]) for r in synthetic_arith_rows(5, 3, 2)]


@needs_data
def test_task_group_loads_with_include_path_and_uses_the_training_prompt():
    from lm_eval.tasks import TaskManager
    from transformers import AutoTokenizer

    from stapo.data import build_prompt
    from stapo.models import resolve_model
    from stapo.tasks import TASKS_DIR

    tok_path = resolve_model(TINY)
    tm = TaskManager(include_path=str(TASKS_DIR), include_defaults=False,
                     metadata={"data_dir": str(DATA_DIR), "tokenizer": tok_path})
    loaded = tm.load(["stapo_math"])
    assert sorted(loaded["tasks"]) == sorted(f"stapo_{b}" for b in LOCAL)
    task = loaded["tasks"]["stapo_aime25"]
    assert task.config.repeats == 32 and task.config.generation_kwargs["do_sample"] is True
    doc = task.test_docs()[0]
    assert task.doc_to_text(doc) == build_prompt(doc["problem"], AutoTokenizer.from_pretrained(tok_path))
    assert len(task.test_docs()) == 30


# ---------------------------------------------------------------------------------------------- end to end


def _eval(tmp_path: Path, bench: str, setting: str, **kw) -> dict:
    from stapo.cli import main

    out = tmp_path / bench / f"{setting}.jsonl"
    argv = ["eval", "--model", TINY, "--benchmark", bench, "--setting", setting, "--out", str(out), "--backend", "hf",
            "--samples", str(kw.get("samples", 2)), "--limit", str(kw.get("limit", 3)),
            "--max-new-tokens", str(kw.get("max_new_tokens", 8))]
    if bench != "arith":
        argv += ["--data-dir", str(DATA_DIR)]
    assert main(argv) == 0
    return json.loads(evaluate.summary_path(out).read_text())


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow
@needs_data
@pytest.mark.parametrize("setting", ["t1.0_p1.0", "t0.7_p0.9"])
def test_end_to_end_every_local_benchmark(tmp_path, setting):
    for bench in LOCAL:
        s = _eval(tmp_path, bench, setting)
        assert (s["benchmark"], s["setting"], s["problems"], s["samples"], s["n_samples"]) == (bench, setting, 3, 6, 2)
        assert s["generation"]["temperature"] == {"t1.0_p1.0": 1.0, "t0.7_p0.9": 0.7}[setting]
        assert 0.0 <= s["avg_at_n"] <= 100.0 and s["lm_eval_version"] == "0.4.13"
        recs = _records(tmp_path / bench / f"{setting}.jsonl")
        assert [(r["problem_id"], r["sample"]) for r in recs] == [
            (f"{'minerva_math' if bench == 'minerva' else bench}-{i:04d}", k) for i in range(3) for k in range(2)]
        assert all(set(r) == {"problem_id", "sample", "completion", "extracted", "gold", "correct", "status"}
                   for r in recs)


@pytest.mark.slow
def test_end_to_end_arith(tmp_path):
    s = _eval(tmp_path, "arith", "t0.7_p0.9", limit=2)
    assert s["problems"] == 2 and s["samples"] == 4


class SimulatedKill(RuntimeError):
    pass


class _Counter:
    """Counts the requests that reach the real model (HFLM.generate_until) and the prompts it sees."""

    def __init__(self, monkeypatch, fail_after: int | None = None):
        from lm_eval.models.huggingface import HFLM

        self.requests, self.prompts = 0, []
        real = getattr(HFLM.generate_until, "real", HFLM.generate_until)  # not a previous counter

        def counted(lm, requests, disable_tqdm=False):
            if fail_after is not None and self.requests >= fail_after:
                raise SimulatedKill("killed after the first chunk")
            self.requests += len(requests)
            self.prompts += [r.args[0] for r in requests]
            return real(lm, requests, disable_tqdm)

        counted.real = real
        monkeypatch.setattr(HFLM, "generate_until", counted)


@pytest.mark.slow
@needs_data
def test_rerun_does_not_regenerate(tmp_path, monkeypatch):
    """Kill mid-way (after the first cached chunk), rerun: only the rest is generated; a third run generates 0."""
    from transformers import AutoTokenizer

    from stapo.data import build_prompt
    from stapo.models import resolve_model
    from stapo.tasks import load_rows

    monkeypatch.setitem(evaluate.CHUNK_REQUESTS, "hf", 4)
    killed = _Counter(monkeypatch, fail_after=4)
    with pytest.raises(SimulatedKill):
        _eval(tmp_path, "math500", "t1.0_p1.0", samples=3, limit=4)  # 12 requests, 4 cached before the kill
    out = tmp_path / "math500" / "t1.0_p1.0.jsonl"
    assert killed.requests == 4 and not out.exists()

    first = _Counter(monkeypatch)
    _eval(tmp_path, "math500", "t1.0_p1.0", samples=3, limit=4)
    assert first.requests == 8
    tok = AutoTokenizer.from_pretrained(resolve_model(TINY))
    problems = {r["problem"] for r in load_rows("math500", DATA_DIR)[:4]}
    assert {p for p in first.prompts} <= {build_prompt(p, tok) for p in problems}  # the training prompt
    before = _records(out)

    out.unlink()
    evaluate.summary_path(out).unlink()
    second = _Counter(monkeypatch)
    _eval(tmp_path, "math500", "t1.0_p1.0", samples=3, limit=4)
    assert second.requests == 0
    assert _records(out) == before
    assert len({r["completion"] for r in before if r["problem_id"] == "math500-0000"}) > 1  # repeats differ
