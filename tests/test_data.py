"""Training data: the synthetic arithmetic generator, local files with located errors, DAPO-Math-17k parsing."""

from __future__ import annotations

import json
import re

import pytest

from stapo.data import DAPO_PREFIX, DAPO_SUFFIX, PROMPT_SUFFIX, DatasetError, build_prompt, dapo_math_rows, \
    load_problems, read_rows, strip_dapo_wrapper, synthetic_arith_rows, validate_source


def _evaluate(problem: str) -> int:
    expr = re.fullmatch(r"What is \$(.*)\$\?", problem).group(1).replace("\\times", "*")
    return eval(expr)  # noqa: S307 - our own generated arithmetic


@pytest.mark.parametrize("difficulty", [1, 2, 3, 4])
def test_synthetic_arith_is_deterministic_and_correct(difficulty):
    rows = synthetic_arith_rows(50, seed=3, difficulty=difficulty)
    assert rows == synthetic_arith_rows(50, seed=3, difficulty=difficulty)
    assert rows != synthetic_arith_rows(50, seed=4, difficulty=difficulty)
    assert [r["id"] for r in rows[:2]] == ["arith-00000", "arith-00001"]
    for row in rows:
        assert set(row) == {"id", "problem", "answer"}
        assert int(row["answer"]) == _evaluate(row["problem"])


def test_synthetic_arith_levels_get_harder():
    easy = synthetic_arith_rows(200, seed=0, difficulty=1)
    assert all(2 <= int(r["answer"]) <= 18 for r in easy)  # a + b, single digits
    assert max(abs(int(r["answer"])) for r in synthetic_arith_rows(200, seed=0, difficulty=4)) > 1000
    with pytest.raises(DatasetError, match="difficulty"):
        synthetic_arith_rows(5, difficulty=9)
    with pytest.raises(DatasetError, match="train.dataset.n"):
        synthetic_arith_rows(0)


def test_read_rows_jsonl_json_parquet(tmp_path):
    rows = [{"problem": "1+1?", "answer": 2, "id": "a"}, {"problem": "2+2?", "answer": "4"}]
    (tmp_path / "d.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    (tmp_path / "d.json").write_text(json.dumps(rows))
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist([{"problem": r["problem"], "answer": str(r["answer"])} for r in rows]),
                   tmp_path / "d.parquet")
    expected = [{"problem": "1+1?", "answer": "2"}, {"problem": "2+2?", "answer": "4"}]
    for name in ("d.jsonl", "d.json", "d.parquet"):
        assert read_rows(tmp_path / name) == expected
    assert load_problems({"path": str(tmp_path / "d.jsonl"), "limit": 1}) == expected[:1]


def test_malformed_rows_name_file_line_and_field(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"problem": "ok", "answer": "1"}\n\n{"problem": "no answer"}\n')
    with pytest.raises(DatasetError, match=rf"{re.escape(str(path))}:3: missing field 'answer'"):
        read_rows(path)
    path.write_text('{"problem": "ok", "answer": "1"}\n{"answer": "2", "problem": "  "}\n')
    with pytest.raises(DatasetError, match=r"bad\.jsonl:2: missing field 'problem'"):
        read_rows(path)
    path.write_text('{"problem": "ok", "answer": "1"}\n{not json}\n')
    with pytest.raises(DatasetError, match=r"bad\.jsonl:2: invalid JSON"):
        read_rows(path)
    (tmp_path / "bad.json").write_text(json.dumps([{"problem": "p", "answer": "1"}, {"problem": "q"}]))
    with pytest.raises(DatasetError, match=r"bad\.json: row 1: missing field 'answer'"):
        read_rows(tmp_path / "bad.json")
    with pytest.raises(DatasetError, match="train.dataset.path: data file not found"):
        read_rows(tmp_path / "missing.jsonl")
    with pytest.raises(DatasetError, match="unsupported file type '.csv'"):
        (tmp_path / "x.csv").write_text("a")
        read_rows(tmp_path / "x.csv")


def test_validate_source_names_keys(tmp_path):
    with pytest.raises(DatasetError, match="exactly one of 'name' or 'path'"):
        validate_source({"name": "synthetic-arith", "path": "x"})
    with pytest.raises(DatasetError, match=r"train\.dataset\.name: unknown dataset 'gsm8k'"):
        validate_source({"name": "gsm8k"})
    with pytest.raises(DatasetError, match=r"unknown key\(s\) \['size'\]"):
        validate_source({"name": "synthetic-arith", "size": 3})
    with pytest.raises(DatasetError, match="data file not found"):
        validate_source({"path": str(tmp_path / "nope.jsonl")})


def test_dapo_wrapper_is_stripped_exactly_and_prompts_deduplicated():
    wrapped = DAPO_PREFIX + "Find $x$ if $x+1=3$." + DAPO_SUFFIX
    assert strip_dapo_wrapper(wrapped) == "Find $x$ if $x+1=3$."
    # exact prefix/suffix, not character sets: a problem that merely starts with "Solve" keeps its words
    assert strip_dapo_wrapper("Solve the equation $x=1$.") == "Solve the equation $x=1$."
    hub = [  # BytedTsinghua-SIA layout (message list + reward_model) with upstream duplicates
        {"prompt": [{"role": "user", "content": wrapped}], "reward_model": {"ground_truth": "2"}},
        {"prompt": [{"role": "user", "content": wrapped}], "reward_model": {"ground_truth": "2"}},
        {"prompt": [{"role": "user", "content": DAPO_PREFIX + "What is 2*3?" + DAPO_SUFFIX}],
         "reward_model": {"ground_truth": "6"}},
    ]
    assert dapo_math_rows(hub) == [{"problem": "Find $x$ if $x+1=3$.", "answer": "2"},
                                   {"problem": "What is 2*3?", "answer": "6"}]
    processed = [{"prompt": wrapped, "solution": "2"}]  # open-r1/DAPO-Math-17k-Processed layout
    assert dapo_math_rows(processed) == [{"problem": "Find $x$ if $x+1=3$.", "answer": "2"}]
    with pytest.raises(DatasetError, match="row 0: missing field"):
        dapo_math_rows([{"prompt": "p"}])


def test_build_prompt_plain_text_without_template():
    assert build_prompt("  What is 1+1? ") == "What is 1+1?\n\n" + PROMPT_SUFFIX


def test_load_synthetic_source():
    rows = load_problems({"name": "synthetic-arith", "n": 4, "difficulty": 2, "seed": 1})
    assert [r["answer"] for r in rows] == [r["answer"] for r in synthetic_arith_rows(4, seed=1, difficulty=2)]
    assert set(rows[0]) == {"problem", "answer"}
