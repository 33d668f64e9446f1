"""Training data: the synthetic arithmetic generator, local files with located errors, DAPO-Math-17k parsing."""

from __future__ import annotations

import json
import re

import pytest

from stapo.tasks.problems import (DAPO_PREFIX, DAPO_SUFFIX, PROMPT_SUFFIX, DatasetError, EvalProtocol, TrainPrompt,
                                  build_prompt, dapo_math_rows, load_problems, read_rows, strip_dapo_wrapper,
                                  synthetic_arith_rows, training_dataset, validate_source)


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
    with pytest.raises(DatasetError, match=r"train.dataset.size: unknown key"):
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
    assert build_prompt("  What is 1+1? ", None, EvalProtocol.HARNESS) == "What is 1+1?\n\n" + PROMPT_SUFFIX


def test_load_synthetic_source():
    rows = load_problems({"name": "synthetic-arith", "n": 4, "difficulty": 2, "seed": 1})
    assert [r["answer"] for r in rows] == [r["answer"] for r in synthetic_arith_rows(4, seed=1, difficulty=2)]
    assert set(rows[0]) == {"problem", "answer"}


# JustRL's evaluation prompt (thunlp/JustRL @ cf444e9, evals/gen_vllm.py): PROMPT_TEMPLATE = "{problem} Please reason
# step by step, and put your final answer within \boxed{}." over df.at[i, "prompt"][0]["content"].strip(), sent by
# llm.chat([{"role": "user", "content": ...}]) = the model's chat template with the generation prompt. The strings
# below are written out by hand from the first rows of its data/{AIME24,AMC23,MATH-500}/test.parquet (our bundled
# files' first rows; the problem texts are identical), in the Qwen3 chat template of the bundled tokenizer
# (Qwen3-Base's template: no system turn, no <think> block when enable_thinking is not given).
JUSTRL_EVAL_PROMPTS = {
    "aime24": (
        "<|im_start|>user\nEvery morning Aya goes for a $9$-kilometer-long walk and stops at a coffee shop afterwards. "
        "When she walks at a constant speed of $s$ kilometers per hour, the walk takes her 4 hours, including $t$ "
        "minutes spent in the coffee shop. When she walks $s+2$ kilometers per hour, the walk takes her 2 hours and "
        "24 minutes, including $t$ minutes spent in the coffee shop. Suppose Aya walks at $s+\\frac{1}{2}$ "
        "kilometers per hour. Find the number of minutes the walk takes her, including the $t$ minutes spent in the "
        "coffee shop. Please reason step by step, and put your final answer within \\boxed{}.<|im_end|>\n"
        "<|im_start|>assistant\n"),
    "amc23": (
        "<|im_start|>user\nCities $A$ and $B$ are $45$ miles apart. Alicia lives in $A$ and Beth lives in $B$. "
        "Alicia bikes towards $B$ at 18 miles per hour. Leaving at the same time, Beth bikes toward $A$ at 12 miles "
        "per hour. How many miles from City $A$ will they be when they meet? Please reason step by step, and put "
        "your final answer within \\boxed{}.<|im_end|>\n<|im_start|>assistant\n"),
    "math500": (
        "<|im_start|>user\nConvert the point $(0,3)$ in rectangular coordinates to polar coordinates.  Enter your "
        "answer in the form $(r,\\theta),$ where $r > 0$ and $0 \\le \\theta < 2 \\pi.$ Please reason step by step, "
        "and put your final answer within \\boxed{}.<|im_end|>\n<|im_start|>assistant\n"),
}


@pytest.fixture(scope="module")
def qwen3_tokenizer():
    from transformers import AutoTokenizer

    from stapo.models import resolve_model

    return AutoTokenizer.from_pretrained(resolve_model("bundled:tiny-qwen3"))


@pytest.mark.parametrize("benchmark", sorted(JUSTRL_EVAL_PROMPTS))
def test_justrl_eval_prompt_matches_justrls_byte_for_byte(benchmark, qwen3_tokenizer):
    from stapo.tasks import load_rows
    from stapo.tasks.registry import custom_dataset

    row = load_rows(benchmark)[0]
    assert build_prompt(row["problem"], qwen3_tokenizer, EvalProtocol.JUSTRL) == JUSTRL_EVAL_PROMPTS[benchmark]
    # the harness protocol differs only in the join: a blank line instead of one space
    harness = build_prompt(row["problem"], qwen3_tokenizer, EvalProtocol.HARNESS)
    assert harness == JUSTRL_EVAL_PROMPTS[benchmark].replace(" Please reason", "\n\nPlease reason", 1)
    # what lm-eval's task renders (stapo eval passes eval.protocol in the task metadata); justrl by default
    tok = qwen3_tokenizer.name_or_path
    for kwargs, expected in (({}, JUSTRL_EVAL_PROMPTS[benchmark]), ({"protocol": "harness"}, harness)):
        rendered = custom_dataset(benchmark, tokenizer=tok, **kwargs)["test"][0]["prompt"]
        assert rendered == expected


def test_prompt_per_style_and_unknown_style():
    """Each eval.protocol / train.prompt value's user turn, by hand; every value is covered (a new one needs its line
    here); an unknown value is refused naming the option."""
    expected = {EvalProtocol.JUSTRL: "1+1? " + PROMPT_SUFFIX, EvalProtocol.HARNESS: "1+1?\n\n" + PROMPT_SUFFIX,
                TrainPrompt.STRIPPED: "1+1?\n\n" + PROMPT_SUFFIX,
                TrainPrompt.JUSTRL_RAW: " 1+1? \n\n\n" + PROMPT_SUFFIX}  # as given, not stripped
    assert set(expected) == set(EvalProtocol) | set(TrainPrompt)
    for style, text in expected.items():
        assert style.prompt(" 1+1? \n") == text
    assert [p.raw_rows for p in TrainPrompt] == [False, True]
    with pytest.raises(ValueError, match="'verl' is not a valid EvalProtocol"):
        EvalProtocol("verl")


# A DAPO-Math-17k row as BytedTsinghua-SIA/DAPO-Math-17k ships it (the instruction wrapper around the problem).
DAPO_RECORD = {"prompt": [{"role": "user", "content": DAPO_PREFIX + "Find $x$ if $x+1=3$." + DAPO_SUFFIX}],
               "reward_model": {"ground_truth": "2", "style": "rule"}}
# JustRL's training prompt for it (thunlp/JustRL train/verl/utils/dataset/rl_dataset.py, use_boxed_suffix_prompt:
# doc["prompt"][0]["content"] + "\n\nPlease reason step by step, ..."), written out by hand:
JUSTRL_RAW_TRAIN_TEXT = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
    "Find $x$ if $x+1=3$.\n\n"
    "Remember to put your answer on its own line after \"Answer:\".\n\n"
    "Please reason step by step, and put your final answer within \\boxed{}.")


def test_train_prompt_stripped_and_justrl_raw(qwen3_tokenizer):
    stripped = dapo_math_rows([DAPO_RECORD])[0]["problem"]
    raw = dapo_math_rows([DAPO_RECORD], raw=True)[0]["problem"]
    assert build_prompt(stripped, None, TrainPrompt.STRIPPED) == "Find $x$ if $x+1=3$.\n\n" + PROMPT_SUFFIX
    assert build_prompt(raw, None, TrainPrompt.JUSTRL_RAW) == JUSTRL_RAW_TRAIN_TEXT
    assert build_prompt(raw, qwen3_tokenizer, TrainPrompt.JUSTRL_RAW) == (
        "<|im_start|>user\n" + JUSTRL_RAW_TRAIN_TEXT + "<|im_end|>\n<|im_start|>assistant\n")


def test_training_dataset_prompt_option(tmp_path, qwen3_tokenizer):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"problem": " What is $1+1$? ", "answer": "2"}) + "\n")
    for prompt, text in (("stripped", "What is $1+1$?\n\n"), ("justrl_raw", " What is $1+1$? \n\n")):
        ds = training_dataset({"path": str(path)}, qwen3_tokenizer, 1024, prompt=prompt)
        assert ds[0]["prompt"] == f"<|im_start|>user\n{text}{PROMPT_SUFFIX}<|im_end|>\n<|im_start|>assistant\n"
    with pytest.raises(ValueError, match="'raw' is not a valid TrainPrompt"):
        training_dataset({"path": str(path)}, qwen3_tokenizer, 1024, prompt="raw")


def test_train_prompt_key_is_validated_and_defaults_to_stripped():
    from stapo.study.train import train_settings

    assert train_settings({}).prompt == "stripped"
    assert train_settings({"prompt": "justrl_raw"}).prompt == "justrl_raw"
    with pytest.raises(ValueError, match=r"train.prompt: unknown value 'raw'; expected one of \['stripped', "
                                         r"'justrl_raw'\]"):
        train_settings({"prompt": "raw"})


EXAMPLE = {"problem": "What is 7 + 5?", "solution": "7 + 5 = 12.\n\n\\boxed{12}"}


def test_worked_example_is_one_exchange_before_the_problem(qwen3_tokenizer):
    """eval/train.worked_example: the example's prompt as a user turn and its solution as the assistant's reply,
    then the problem, in the same style; lm-eval's task renders the same string."""
    from stapo.tasks.registry import custom_dataset

    prompt = build_prompt("What is 2 + 2?", qwen3_tokenizer, EvalProtocol.JUSTRL, EXAMPLE)
    assert prompt == ("<|im_start|>user\nWhat is 7 + 5? " + PROMPT_SUFFIX + "<|im_end|>\n"
                      "<|im_start|>assistant\n7 + 5 = 12.\n\n\\boxed{12}<|im_end|>\n"
                      "<|im_start|>user\nWhat is 2 + 2? " + PROMPT_SUFFIX + "<|im_end|>\n"
                      "<|im_start|>assistant\n")
    assert build_prompt("What is 2 + 2?", None, EvalProtocol.HARNESS, EXAMPLE) == (
        f"What is 7 + 5?\n\n{PROMPT_SUFFIX}\n\n7 + 5 = 12.\n\n\\boxed{{12}}\n\nWhat is 2 + 2?\n\n{PROMPT_SUFFIX}")
    rows = custom_dataset("arith", tokenizer=qwen3_tokenizer.name_or_path, arith={"n": 2},
                          worked_example=EXAMPLE)["test"]
    assert all(r["prompt"].startswith("<|im_start|>user\nWhat is 7 + 5? ") for r in rows)
    assert rows[0]["prompt"].endswith(f"{rows[0]['problem']} {PROMPT_SUFFIX}<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.parametrize("bad", [{"problem": "x"}, {"problem": "x", "solution": ""}, "x", {"q": "a", "solution": "b"}])
def test_worked_example_is_checked_in_both_sections(bad):
    from stapo.study import StudyError, parse

    for section in ("train", "eval"):
        with pytest.raises(StudyError, match=rf"{section}\.worked_example: "):
            parse({section: {"worked_example": bad}}, required=())
