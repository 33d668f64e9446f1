"""Benchmark registry: where each benchmark's rows come from, how many there should be, paper N per benchmark.

Every benchmark yields rows ``{id, problem, answer}`` from the ``data_dir`` source:

* ``None`` or ``"bundled"`` (the default): the files shipped in ``stapo/tasks/data`` (``BUNDLED_DATA_DIR``; source,
  row counts and licenses in its README), so a fresh clone evaluates on the real problems offline;
* ``"hub"``: the Hugging Face hub dataset (``hub_id``, ``hub_config``, ``hub_split``, with the field names mapped);
* any other value: a directory holding ``<file>`` in the same jsonl format;
* for ``arith``, always ``stapo.tasks.problems.synthetic_arith_rows`` (the CPU miniature's synthetic benchmark).

A study's own benchmark is data, not code: ``eval.benchmarks.<key>: {file: path.jsonl, label: ..., samples: N}``
reads that file (whatever ``data_dir`` says) through the one generic task ``stapo_file``; a shipped benchmark
given a ``file`` reads it instead of its own.

The loader warns when the row count differs from ``expected_rows`` (OlympiadBench: JustRL's 674 or the original 675).
lm-eval reaches this module through ``custom_dataset`` (named by the task YAMLs), which also renders the training
prompt (``stapo.tasks.problems.build_prompt`` with the model's tokenizer) into a ``prompt`` column.
"""

from __future__ import annotations

import logging
from functools import lru_cache
from dataclasses import dataclass
from pathlib import Path

from stapo.tasks.problems import DEFAULT_EVAL_PROTOCOL, EvalProtocol, build_prompt, synthetic_arith_rows
from stapo.tasks.grading import grade
from stapo.core.jsonl import jsonl_records

__all__ = ["Benchmark", "BENCHMARKS", "SETTINGS", "TASKS_DIR", "BUNDLED_DATA_DIR", "HUB", "load_rows",
           "read_benchmark_file",
           "benchmark_file", "custom_dataset", "task_name",
           "FILE_TASK", "FILE_SAMPLES"]

log = logging.getLogger("stapo.tasks")

TASKS_DIR = Path(__file__).resolve().parent  # lm-eval include_path
BUNDLED_DATA_DIR = TASKS_DIR / "data"  # the six benchmark files shipped with the project (the default source)
BUNDLED, HUB = "bundled", "hub"  # data_dir keywords


@dataclass(frozen=True)
class Benchmark:
    """One evaluation benchmark the harness ships (a study's own file needs none: ``eval.benchmarks.<key>.file``).

    label:         what tables and figures show.
    file:          local jsonl name under the data dir (fields id, problem, answer).
    hub_id:        Hugging Face dataset id used with ``data_dir: hub`` (None: no hub copy, e.g. arith).
    hub_config:    dataset config name on the hub (None: default).
    hub_split:     split holding the problems.
    problem_field: hub column with the problem text.
    answer_field:  hub column with the gold answer (lists are joined with "," as JustRL does).
    expected_rows: accepted row counts; any other count logs a warning.
    samples:       N samples per problem in the paper (avg@N).
    paper:         the key of the paper's results table (None: not one of the paper's six).
    """

    label: str
    file: str
    hub_id: str | None
    hub_config: str | None
    hub_split: str
    problem_field: str
    answer_field: str
    expected_rows: tuple[int, ...]
    samples: int
    paper: str | None = None


BENCHMARKS: dict[str, Benchmark] = {  # the table's column order; each also has its task YAML stapo_<key>.yaml
    "aime24": Benchmark("AIME24", "aime24.jsonl", "HuggingFaceH4/aime_2024", None, "train", "problem", "answer",
                        (30,), 32, paper="aime24"),
    "aime25": Benchmark("AIME25", "aime25.jsonl", "math-ai/aime25", None, "test", "problem", "answer", (30,), 32,
                        paper="aime25"),
    "amc23": Benchmark("AMC23", "amc23.jsonl", "math-ai/amc23", None, "test", "question", "answer", (40,), 32,
                       paper="amc23"),
    "math500": Benchmark("MATH500", "math500.jsonl", "HuggingFaceH4/MATH-500", None, "test", "problem", "answer",
                         (500,), 4, paper="math500"),
    "minerva": Benchmark("Minerva", "minerva_math.jsonl", "math-ai/minervamath", None, "test", "question", "answer",
                         (272,), 4, paper="minerva"),
    "olympiadbench": Benchmark("OlympiadBench", "olympiadbench.jsonl", "Hothan/OlympiadBench", "OE_TO_maths_en_COMP",
                               "train", "question", "final_answer", (674, 675), 4, paper="olympiadbench"),
    # Synthetic arithmetic for the CPU miniature: generated, not downloaded (n rows, see ARITH_DEFAULTS).
    "arith": Benchmark("Arith", "arith.jsonl", None, None, "test", "problem", "answer", (), 4),
}
FILE_TASK = "stapo_file"  # the generic lm-eval task of a study's own benchmark file (stapo_file.yaml)
FILE_SAMPLES = 4  # avg@N of a study's own benchmark unless its entry says (the paper's N for its larger sets)
ARITH_DEFAULTS = dict(n=64, seed=1234, difficulty=1)  # seed differs from the training set's default (0)

# Sampling settings of the paper (Evaluation protocol): the training-aligned one and JustRL's default.
SETTINGS: dict[str, dict[str, float]] = {
    "t1.0_p1.0": {"temperature": 1.0, "top_p": 1.0},
    "t0.7_p0.9": {"temperature": 0.7, "top_p": 0.9},
}


def task_name(benchmark: str) -> str:
    """The lm-eval task of a benchmark key: ``stapo_<key>`` for a shipped one (``math500`` -> ``stapo_math500``),
    the generic ``stapo_file`` for a study's own file."""
    return f"stapo_{benchmark}" if benchmark in BENCHMARKS else FILE_TASK


def get_benchmark(name: str) -> Benchmark:
    if name not in BENCHMARKS:
        raise KeyError(f"benchmark: unknown benchmark {name!r}; expected one of {sorted(BENCHMARKS)}")
    return BENCHMARKS[name]


def read_benchmark_file(path: Path) -> list[dict]:
    """Rows ``{id, problem, answer, answer_justrl}`` of a benchmark jsonl; a bad file raises ValueError naming it
    (and the line). ``answer_justrl`` is the gold ``eval.protocol: justrl`` grades against: the row's
    ``answer_raw`` where it has one (in the shipped files, JustRL's ``reward_model.ground_truth`` where it differs
    from the clean ``answer``: AIME24's ``\\boxed{}``, OlympiadBench's ``$...$``), else ``answer``.

    Checked in full (every line parses, has non-empty id/problem/answer, at least one row) so that ``stapo eval``
    can refuse a bad file before any model loads.
    """
    rows, first_line = [], {}
    try:
        records = jsonl_records(path)  # stapo.core.jsonl: every line a JSON object (a JsonlError: a ValueError)
    except OSError as err:
        raise ValueError(f"{path}: cannot read benchmark file ({err.strerror})") from None
    for line_no, _, row in records:
        missing = sorted(k for k in ("id", "problem", "answer") if row.get(k) is None or str(row[k]).strip() == "")
        if missing:
            raise ValueError(f"{path}:{line_no}: missing field(s) {missing}")
        row_id = str(row["id"])
        if row_id in first_line:  # scores are keyed by problem id: a repeat would merge two problems
            raise ValueError(f"{path}:{line_no}: id {row_id!r} repeats line {first_line[row_id]}")
        first_line[row_id] = line_no
        rows.append({"id": row_id, "problem": row["problem"], "answer": str(row["answer"]),
                     "answer_justrl": str(row.get("answer_raw") or row["answer"])})
    if not rows:
        raise ValueError(f"{path}: benchmark file has no rows")
    return rows


def benchmark_file(name: str, data_dir: str | Path | None, file: str | Path | None = None) -> Path | None:
    """The jsonl a benchmark is read from: its own ``file`` when given (``eval.benchmarks.<key>.file``), else the
    shipped benchmark's file under ``data_dir``; None for the hub and for the generated ``arith``."""
    if file is not None:
        return Path(file)
    bench = get_benchmark(name)
    if name == "arith" or data_dir == HUB:
        return None
    base = BUNDLED_DATA_DIR if data_dir in (None, "", BUNDLED) else Path(data_dir)
    return base / bench.file


def _hub_rows(name: str, bench: Benchmark) -> list[dict]:
    import datasets

    ds = datasets.load_dataset(bench.hub_id, bench.hub_config, split=bench.hub_split)
    rows = []
    for i, row in enumerate(ds):
        answer = row[bench.answer_field]
        if isinstance(answer, (list, tuple)):
            answer = ",".join(str(a) for a in answer)
        rows.append({"id": f"{name}-{i:04d}", "problem": row[bench.problem_field], "answer": str(answer)})
    return rows


def _arith_rows(n: int, seed: int, difficulty: int) -> list[dict]:
    rows = synthetic_arith_rows(n, seed, difficulty)
    return [{"id": str(r.get("id", f"arith-{i:04d}")), "problem": r["problem"], "answer": str(r["answer"])}
            for i, r in enumerate(rows)]


def load_rows(name: str, data_dir: str | Path | None = None, *, file: str | Path | None = None,
              n: int | None = None, seed: int | None = None, difficulty: int | None = None) -> list[dict]:
    """Rows ``{id, problem, answer, answer_justrl}`` of benchmark ``name``: its own ``file``, else from
    ``data_dir`` (see the module docstring; ``answer_justrl``: :func:`read_benchmark_file`, else ``answer``)."""
    if file is not None:
        path = Path(file)
        if not path.is_file():
            raise FileNotFoundError(f"benchmark {name!r}: {path} not found (eval.benchmarks.{name}.file)")
        return read_benchmark_file(path)
    bench = get_benchmark(name)
    if name == "arith":
        d = ARITH_DEFAULTS
        rows = _arith_rows(n or d["n"], d["seed"] if seed is None else seed, difficulty or d["difficulty"])
    elif data_dir == HUB:
        rows = _hub_rows(name, bench)
    else:
        path = benchmark_file(name, data_dir)
        if not path.exists():
            raise FileNotFoundError(f"benchmark {name!r}: {path} not found (data_dir={data_dir})")
        rows = read_benchmark_file(path)
    for row in rows:  # the hub's and arith's golds are the only ones they have
        row.setdefault("answer_justrl", row["answer"])
    if bench.expected_rows and len(rows) not in bench.expected_rows:
        expected = " or ".join(map(str, bench.expected_rows))
        log.warning("benchmark %r has %d rows; expected %s", name, len(rows), expected)
    return rows


@lru_cache(maxsize=4)
def _tokenizer(spec: str | None):
    if not spec:
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(spec)


def custom_dataset(benchmark: str, data_dir: str | None = None, tokenizer: str | None = None,
                   pretrained: str | None = None, arith: dict | None = None, file: str | None = None,
                   name: str | None = None, protocol: str = DEFAULT_EVAL_PROTOCOL.value,
                   worked_example: dict | None = None, **_):
    """lm-eval ``custom_dataset`` hook: a DatasetDict with a ``test`` split and the rendered ``prompt`` column.

    lm-eval passes the task metadata (``stapo eval`` puts ``data_dir`` and ``tokenizer`` there, and for a study's
    own benchmark its ``name`` and ``file``, ``protocol``: eval.protocol, the prompt's style, stapo.tasks.problems, and
    ``worked_example``: eval.worked_example;
    lm-eval's own CLI passes ``pretrained`` from ``--model_args``) and the
    task's ``dataset_kwargs`` (``benchmark``: the shipped benchmark's key, or ``file`` for the generic task).
    """
    import datasets

    if benchmark == "file":
        if not file:
            raise ValueError(f"{FILE_TASK}: needs the benchmark file in the task metadata (stapo eval passes it)")
        rows = load_rows(name or Path(file).stem, file=file)
    else:
        rows = load_rows(benchmark, data_dir, **(arith or {}))
    tok = _tokenizer(tokenizer or pretrained)
    for row in rows:
        row["prompt"] = build_prompt(row["problem"], tok, EvalProtocol(protocol), worked_example)
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})


def process_results(doc: dict, results: list[str]) -> dict:
    """Per-document metric for plain ``lm_eval`` runs: lm-eval's default filter passes the first of the N samples.

    ``stapo eval`` does not use it: it grades every sample itself (avg@N, pass@k, maj@N).
    """
    graded = grade(list(results), [doc["answer"]] * len(results), strict=True)
    return {"acc": sum(g.correct for g in graded) / max(1, len(graded))}
