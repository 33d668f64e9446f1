"""Prompts and datasets: the paper's prompt template, training sets, benchmark rows.

The prompt (paper, Training Details): the problem followed by the \\boxed{} instruction, as the user turn of the
tokenizer's chat template (plain text when the tokenizer has no template). Training and evaluation use the same
function, :func:`build_prompt`; only the join between problem and instruction differs by ``style``, an
:class:`EvalProtocol` (``eval.protocol``) or a :class:`TrainPrompt` (``train.prompt``):

* ``justrl`` (``eval.protocol: justrl``, the paper's evaluation): the stripped problem, ONE space, the instruction,
  as JustRL's ``evals/gen_vllm.py`` (thunlp/JustRL @ cf444e9: ``PROMPT_TEMPLATE = "{problem} Please reason step by
  step, ..."`` over ``prompt[0]["content"].strip()``, sent with ``llm.chat``, i.e. the model's chat template with
  the generation prompt);
* ``harness`` (``eval.protocol: harness``) and ``stripped`` (``train.prompt: stripped``, the default): the stripped
  problem, a blank line, the instruction (this harness's original prompt);
* ``justrl_raw`` (``train.prompt: justrl_raw``): the row's text as it is (for DAPO-Math-17k the raw text, the
  DAPO instruction wrapper included, not stripped), ``"\\n\\n"``, the instruction, as JustRL's training data
  (``train/verl/utils/dataset/rl_dataset.py``, ``use_boxed_suffix_prompt``: ``content + "\\n\\nPlease reason step by
  step, ..."``, set by ``train/examples/justrl/run_scaling_ssh_distill.sh``).
"""

from __future__ import annotations

import io
import logging
import random
from pathlib import Path

from stapo.core.fields import Choice, check_keys
from stapo.core import bounded, limits
from stapo.core.jsonl import JsonlError, jsonl_records

__all__ = ["PROMPT_SUFFIX", "EvalProtocol", "DEFAULT_EVAL_PROTOCOL", "TrainPrompt", "build_prompt",
           "check_worked_example"]

log = logging.getLogger("stapo.tasks.problems")
PROMPT_SUFFIX = "Please reason step by step, and put your final answer within \\boxed{}."


class EvalProtocol(Choice):
    """``eval.protocol``: how an evaluation's prompt, reported rule stage, gold and verifier inputs are made.

    justrl   (the paper's, JustRL's evals/) the prompt joins the stripped problem and the instruction with one
             space; the reported verdict is JustRL's grade_answer_verl against JustRL's gold; CompassVerifier sees
             no question and its reply must be exactly one letter
    harness  the prompt joins them with a blank line; the reported verdict is the strict final \\boxed{} by
             math-verify against the clean gold; the verifier sees the problem and its reply is parsed leniently
    """

    JUSTRL = "justrl"
    HARNESS = "harness"

    def prompt(self, problem: str) -> str:
        """The user turn (before any chat template)."""
        join = " " if self is EvalProtocol.JUSTRL else "\n\n"
        return f"{problem.strip()}{join}{PROMPT_SUFFIX}"

    @property
    def justrl_rule_stage(self) -> bool:
        """The reported verdict and gold are JustRL's (else the strict final box's against the clean gold)."""
        return self is EvalProtocol.JUSTRL

    @property
    def rule_stage(self) -> str:
        """The rule stage its avg_at_n is, in words (a summary's "grading"; the report's footnotes)."""
        if self is EvalProtocol.JUSTRL:
            return ("JustRL's grade_answer_verl (last \\boxed{}; mathd normalisation, then sympy) against JustRL's "
                    "golds")
        return "strict: the final \\boxed{} answer (math-verify)"

    @property
    def verifier_sees_problem(self) -> bool:
        """CompassVerifier's ``{question}`` is the problem (JustRL's grade.py leaves it empty)."""
        return self is EvalProtocol.HARNESS

    @property
    def exact_verdict(self) -> bool:
        """The verifier's reply counts only when it is exactly one verdict letter (JustRL's grade.py)."""
        return self is EvalProtocol.JUSTRL


DEFAULT_EVAL_PROTOCOL = EvalProtocol.JUSTRL  # the paper's; the study's default (stapo.study.evaluation)


class TrainPrompt(Choice):
    """``train.prompt``: how a training row becomes the prompt.

    stripped    the stripped problem, a blank line, the instruction (the harness's, the default)
    justrl_raw  the row's text as it is (DAPO-Math-17k's own instruction wrapper kept), "\\n\\n", the instruction
                (JustRL's training data)
    """

    STRIPPED = "stripped"
    JUSTRL_RAW = "justrl_raw"

    def prompt(self, problem: str) -> str:
        """The user turn (before any chat template)."""
        return f"{problem if self.raw_rows else problem.strip()}\n\n{PROMPT_SUFFIX}"

    @property
    def raw_rows(self) -> bool:
        """The training rows keep their source's text (DAPO's wrapper included), unstripped."""
        return self is TrainPrompt.JUSTRL_RAW


def build_prompt(problem: str, tokenizer, style: EvalProtocol | TrainPrompt, example: dict | None = None) -> str:
    """The text the policy is conditioned on: chat-templated user turn when the tokenizer has a template.

    ``example`` (``train.worked_example`` / ``eval.worked_example``, {problem, solution}): one worked exchange
    before the problem — the example's prompt as a user turn and its solution as the assistant's reply — for a
    small model that writes the final ``\\boxed{}`` only when shown how (the CPU miniature's SmolLM2-135M). The
    paper's prompts have none.
    """
    turns = [{"role": "user", "content": style.prompt(problem)}]
    if example:
        turns = [{"role": "user", "content": style.prompt(example["problem"])},
                 {"role": "assistant", "content": example["solution"]}, *turns]
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        return "\n\n".join(t["content"] for t in turns)
    return tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)


def check_worked_example(example, where: str) -> None:
    """A ``worked_example`` is null or a mapping of exactly ``problem`` and ``solution`` strings (ValueError)."""
    if example is None:
        return
    if not isinstance(example, dict) or set(example) != {"problem", "solution"} or not all(
            isinstance(v, str) and v.strip() for v in example.values()):
        raise ValueError(f"{where}.worked_example: need {{problem: <text>, solution: <text>}} (non-empty strings), "
                         f"got {example!r}")


# ------------------------------------------------------------------------------------------- training sets
#
# A training source is the recipe's ``train.dataset`` mapping:
#     {name: dapo-math-17k}                                   BytedTsinghua-SIA/DAPO-Math-17k, deduplicated
#     {name: dapo-math-17k-processed, config: en}             open-r1/DAPO-Math-17k-Processed ("all", "en", "cn")
#     {name: synthetic-arith, n: 512, difficulty: 1, seed: 0} generated here, offline and deterministic
#     {path: file.jsonl | file.json | file.parquet}           local rows with ``problem`` and ``answer`` fields
# Every loader returns rows {problem, answer} (answer a string); training_dataset turns them into prompts.

__all__ += [
    "DAPO_PREFIX", "DAPO_SUFFIX", "DatasetError", "synthetic_arith_rows", "read_rows", "strip_dapo_wrapper",
    "dapo_math_rows", "load_problems", "validate_source", "training_dataset",
]

DAPO_HUB_ID = "BytedTsinghua-SIA/DAPO-Math-17k"
DAPO_PROCESSED_HUB_ID = "open-r1/DAPO-Math-17k-Processed"
DAPO_PREFIX = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
)
DAPO_SUFFIX = '\n\nRemember to put your answer on its own line after "Answer:".'
SOURCE_KEYS = {"name", "path", "n", "difficulty", "seed", "config", "split", "limit"}
SYNTHETIC_LEVELS = (1, 2, 3, 4)


class DatasetError(ValueError):
    """A training/benchmark data problem; the message names the file (and line) or the recipe key."""


def synthetic_arith_rows(n: int, seed: int = 0, difficulty: int = 1, prefix: str = "arith") -> list[dict]:
    """``n`` deterministic arithmetic problems as benchmark rows {id, problem, answer}.

    Levels: 1 = a + b with a, b in 1..9 (a 135M chat model gets roughly a quarter right in 48 tokens);
    2 = a ± b with two-digit operands; 3 = a × b + c with two-digit operands; 4 = (a + b) × c − d, three digits.
    The same (n, seed, difficulty) always gives the same rows (own ``random.Random``; no global state).
    """
    if difficulty not in SYNTHETIC_LEVELS:
        raise DatasetError(f"train.dataset.difficulty: must be one of {list(SYNTHETIC_LEVELS)}, got {difficulty!r}")
    if n <= 0:
        raise DatasetError(f"train.dataset.n: must be positive, got {n!r}")
    rng = random.Random(f"synthetic-arith/{seed}/{difficulty}")
    rows = []
    for i in range(n):
        if difficulty == 1:
            a, b = rng.randint(1, 9), rng.randint(1, 9)
            expr, value = f"{a} + {b}", a + b
        elif difficulty == 2:
            a, b, op = rng.randint(10, 99), rng.randint(10, 99), rng.choice("+-")
            expr, value = f"{a} {op} {b}", a + b if op == "+" else a - b
        elif difficulty == 3:
            a, b, c = rng.randint(10, 99), rng.randint(2, 20), rng.randint(10, 99)
            expr, value = f"{a} \\times {b} + {c}", a * b + c
        else:
            a, b, c, d = rng.randint(100, 999), rng.randint(100, 999), rng.randint(2, 9), rng.randint(100, 999)
            expr, value = f"({a} + {b}) \\times {c} - {d}", (a + b) * c - d
        rows.append({"id": f"{prefix}-{i:05d}", "problem": f"What is ${expr}$?", "answer": str(value)})
    return rows


def _check_row(row, where: str) -> dict:
    if not isinstance(row, dict):
        raise DatasetError(f"{where}: expected an object with fields 'problem' and 'answer', got {type(row).__name__}")
    for field in ("problem", "answer"):
        if row.get(field) is None or (isinstance(row[field], str) and not row[field].strip()):
            raise DatasetError(f"{where}: missing field {field!r}")
    return {"problem": str(row["problem"]), "answer": str(row["answer"]).strip()}


def read_rows(path: str | Path) -> list[dict]:
    """Rows {problem, answer} of a local .jsonl, .json (a list) or .parquet file.

    A malformed row raises DatasetError naming the file, the line (jsonl; the row index otherwise) and the field.
    """
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"train.dataset.path: data file not found: {path}")
    if path.suffix == ".jsonl":  # stapo.core.jsonl's policy: a file written whole, so any bad line is an error
        try:
            records = jsonl_records(path)
        except JsonlError as err:
            raise DatasetError(str(err)) from None
        return [_check_row(r.row, f"{path}:{r.line}") for r in records]
    if path.suffix == ".json":
        data = bounded.load_json(path, limits.MAX_DATA_BYTES, "a data file")
        if not isinstance(data, list):
            raise DatasetError(f"{path}: expected a JSON list of rows, got {type(data).__name__}")
        return [_check_row(obj, f"{path}: row {i}") for i, obj in enumerate(data)]
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        data = io.BytesIO(bounded.read_bytes(path, limits.MAX_DATA_BYTES, "a data file"))
        return [_check_row(obj, f"{path}: row {i}") for i, obj in enumerate(pq.read_table(data).to_pylist())]
    raise DatasetError(f"train.dataset.path: unsupported file type {path.suffix!r} (use .jsonl, .json or .parquet)")


def strip_dapo_wrapper(text: str) -> str:
    """The bare problem inside DAPO-Math-17k's instruction wrapper (exact prefix/suffix; unchanged if absent)."""
    if text.startswith(DAPO_PREFIX):
        text = text[len(DAPO_PREFIX):]
    if text.endswith(DAPO_SUFFIX):
        text = text[: -len(DAPO_SUFFIX)]
    return text.strip()


def _dapo_fields(row: dict) -> tuple[str, str]:
    """(wrapped prompt text, gold) of a row of either hub copy of DAPO-Math-17k."""
    prompt = row["prompt"]
    if isinstance(prompt, list):  # BytedTsinghua-SIA: one user turn as a message list
        prompt = next(m["content"] for m in prompt if m.get("role") == "user")
    gold = row.get("solution") or row["reward_model"]["ground_truth"]
    return prompt, str(gold)


def dapo_math_rows(records, where: str = DAPO_HUB_ID, raw: bool = False) -> list[dict]:
    """Rows {problem, answer} from DAPO-Math-17k records, deduplicated by prompt (first occurrence kept); the problem
    is the bare problem (wrapper stripped), or with ``raw`` the record's text as it is (``train.prompt:
    justrl_raw``)."""
    seen, rows = set(), []
    for i, record in enumerate(records):
        try:
            prompt, gold = _dapo_fields(record)
        except (KeyError, StopIteration) as err:
            raise DatasetError(f"{where}: row {i}: missing field {err}") from None
        if prompt in seen:
            continue
        seen.add(prompt)
        problem = prompt if raw else strip_dapo_wrapper(prompt)
        rows.append(_check_row({"problem": problem, "answer": gold}, f"{where}: row {i}"))
    return rows


def _hub_rows(name: str, source: dict, raw: bool = False) -> list[dict]:
    import datasets

    if name == "dapo-math-17k":
        records = datasets.load_dataset(DAPO_HUB_ID, split=source.get("split", "train"))
        return dapo_math_rows(records, DAPO_HUB_ID, raw)
    records = datasets.load_dataset(DAPO_PROCESSED_HUB_ID, source.get("config", "en"),
                                    split=source.get("split", "train"))
    return dapo_math_rows(records, DAPO_PROCESSED_HUB_ID, raw)


def validate_source(source: dict) -> None:
    """Check a ``train.dataset`` mapping without loading it (file existence, names, keys)."""
    if not isinstance(source, dict) or ("name" in source) == ("path" in source):
        raise DatasetError("train.dataset: give exactly one of 'name' or 'path'")
    try:
        check_keys(source, SOURCE_KEYS, "train.dataset")
    except ValueError as err:
        raise DatasetError(str(err)) from None
    if "path" in source and not Path(source["path"]).is_file():
        raise DatasetError(f"train.dataset.path: data file not found: {source['path']}")
    names = ("synthetic-arith", "dapo-math-17k", "dapo-math-17k-processed")
    if "name" in source and source["name"] not in names:
        raise DatasetError(f"train.dataset.name: unknown dataset {source['name']!r}; expected one of {list(names)}")


def load_problems(source: dict, raw: bool = False) -> list[dict]:
    """Rows {problem, answer} for a ``train.dataset`` mapping (see the section comment above); ``raw``: DAPO-Math
    rows keep their instruction wrapper (``train.prompt: justrl_raw``)."""
    validate_source(source)
    if "path" in source:
        rows = read_rows(source["path"])
    elif source["name"] == "synthetic-arith":
        gen = synthetic_arith_rows(int(source.get("n", 512)), int(source.get("seed", 0)),
                                   int(source.get("difficulty", 1)))
        rows = [{"problem": r["problem"], "answer": r["answer"]} for r in gen]
    else:
        rows = _hub_rows(source["name"], source, raw)
    if source.get("limit"):
        rows = rows[: int(source["limit"])]
    if not rows:
        raise DatasetError(f"train.dataset: {source} gave no rows")
    return rows


def training_dataset(source: dict, tokenizer, max_prompt_length: int, prompt: TrainPrompt,
                     example: dict | None = None):
    """A datasets.Dataset with ``prompt`` (paper prompt, chat-templated, in the ``train.prompt`` style) and
    ``answer`` columns; prompts longer than ``max_prompt_length`` tokens are dropped (verl's
    filter_overlong_prompts), with a warning."""
    from datasets import Dataset

    style, rows, dropped = TrainPrompt(prompt), [], 0
    for row in load_problems(source, raw=style.raw_rows):
        prompt = build_prompt(row["problem"], tokenizer, style, example)
        if len(tokenizer(prompt)["input_ids"]) > max_prompt_length:
            dropped += 1
            continue
        rows.append({"prompt": prompt, "answer": row["answer"]})
    if dropped:
        log.warning("dropped %d prompts longer than train.max_prompt_length=%d", dropped, max_prompt_length)
    if not rows:
        raise ValueError("train.max_prompt_length: every prompt is longer than the limit")
    return Dataset.from_list(rows)
