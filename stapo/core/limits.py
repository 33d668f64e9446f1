"""Bounds on every input that sizes work: each number a study or a command line sets, the YAML a study is read from,
and every file the harness reads (caps read by stapo.core.bounded at call time: a test lowers them), the keys that
name directories and the sizes of a bundled test model. One declaration per bound, with its reason; the study schema
(stapo.study.study_schema), the ``train`` section (stapo.study.train), ``stapo train`` and ``stapo eval`` read them
from here.

A bound is far above anything the paper or a plausible extension needs (the paper: 3,000 rollout steps, avg@32,
20,480 new tokens); it exists so that a typo (``max_steps: 10**12``) or a hostile file is refused in one line,
before any list, job or tensor is sized from it. :func:`check_tree` bounds the YAML itself: a 4.5 KB alias bomb
expands to 9^9 values, and every walk over the config (the schema check, a JSON dump of the recipe) would expand it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["Bound", "BOUNDS", "MAX_YAML_BYTES", "MAX_VALUES", "MAX_DEPTH", "MAX_KEY_CHARS", "MAX_JSON_BYTES",
           "MAX_LINE_BYTES", "MAX_LOG_BYTES", "MAX_SAMPLES_BYTES", "MAX_DATA_BYTES", "MAX_DIGITS", "TINY_QWEN3_BOUNDS",
           "check_tree", "check_bound"]


@dataclass(frozen=True)
class Bound:
    """``minimum <= value <= maximum``; ``why`` says where the maximum comes from."""

    maximum: float
    why: str
    minimum: float = 0


_STEPS = Bound(1_000_000, "the paper trains 3,000 rollout steps; a million is months of a 64-GPU cluster")
_SEED = Bound(2**32 - 1, "numpy's and vLLM's seeds are 32-bit")
_TOKENS = Bound(131_072, "Qwen3's longest context (with YaRN); the paper generates 20,480 tokens")
_GPUS = Bound(1_024, "GPUs of one job; the paper uses 64")
_NODES = Bound(1_024, "nodes of one job; the paper uses 8", minimum=1)
_CPUS = Bound(65_536, "CPUs of one job")
_MEM_MB = Bound(16 * 1024**2, "16 TiB: no node has more memory")
_MINUTES = Bound(525_600, "one year, in minutes")
_PROBLEMS = Bound(1_000_000, "problems of a benchmark; the largest shipped one has 674")
_BATCH = Bound(65_536, "prompts or completions of one batch; the paper's rollout batch has 2,048 completions")

# key (as it appears in a study's section, or a command-line flag's dest) -> bound. Keys are matched by their last
# component wherever they appear (train.max_steps and --max-steps are one declaration).
BOUNDS: dict[str, Bound] = {
    "max_steps": Bound(_STEPS.maximum, _STEPS.why, minimum=1),
    "save_steps": Bound(_STEPS.maximum, _STEPS.why, minimum=1),
    "save_total_limit": Bound(_STEPS.maximum, _STEPS.why, minimum=1),
    "warmup_steps": _STEPS,
    "eval_every": Bound(_STEPS.maximum, _STEPS.why, minimum=1),
    "diagnostics_every": _STEPS,
    "diagnostics_examples": Bound(10_000, "silenced-token examples written per diagnostics step"),
    "seed": _SEED,
    "learning_rate": Bound(1.0, "an AdamW step above 1 diverges at once; the paper uses 1e-6"),
    "weight_decay": Bound(10.0, "AdamW's decoupled decay; the paper uses 0.1"),
    "max_grad_norm": Bound(1e6, "gradient clipping norm; the paper uses 1.0"),
    "temperature": Bound(100.0, "sampling temperature; the paper samples at 1.0 and 0.7"),
    "prompts_per_generation": Bound(_BATCH.maximum, _BATCH.why, minimum=1),
    "prompts_per_step": Bound(_BATCH.maximum, _BATCH.why, minimum=1),
    "per_device_train_batch_size": Bound(_BATCH.maximum, _BATCH.why, minimum=1),
    "num_generations": Bound(1_024, "rollouts per prompt; the paper samples 8", minimum=1),
    "num_iterations": Bound(100, "PPO epochs over a rollout batch; the paper runs 1", minimum=1),
    "max_prompt_length": Bound(_TOKENS.maximum, _TOKENS.why, minimum=1),
    "max_completion_length": Bound(_TOKENS.maximum, _TOKENS.why, minimum=1),
    "max_new_tokens": Bound(_TOKENS.maximum, _TOKENS.why, minimum=1),
    "micro_batch_tokens": Bound(16 * _TOKENS.maximum, "tokens of one micro-batch per process; JustRL's verl script "
                                "packs 32,768", minimum=1),
    "samples": Bound(1_024, "samples per problem; the paper's largest is avg@32", minimum=1),
    "limit": Bound(_PROBLEMS.maximum, _PROBLEMS.why, minimum=1),
    "n": Bound(_PROBLEMS.maximum, "generated arith problems", minimum=1),
    "difficulty": Bound(100, "arith operand digits", minimum=1),
    "grade_timeout": Bound(3_600.0, "seconds to grade one answer; math-verify needs well under one"),
    "gpus": _GPUS,
    "nodes": _NODES,
    "eval_gpus": _GPUS,
    "train_cpus": Bound(_CPUS.maximum, _CPUS.why, minimum=1),
    "eval_cpus": Bound(_CPUS.maximum, _CPUS.why, minimum=1),
    "threads": Bound(_CPUS.maximum, _CPUS.why, minimum=1),
    "train_mem_mb": Bound(_MEM_MB.maximum, _MEM_MB.why, minimum=1),
    "eval_mem_mb": Bound(_MEM_MB.maximum, _MEM_MB.why, minimum=1),
    "train_runtime": Bound(_MINUTES.maximum, _MINUTES.why, minimum=1),
    "eval_runtime": Bound(_MINUTES.maximum, _MINUTES.why, minimum=1),
}
MAX_SEEDS = 100  # workflow.seeds: runs per (model, method); the mini-study runs 3
MAX_CURVE_POINTS = 1_000  # checkpoints on one accuracy curve; the paper's has 150 (3,000 / 20)

MAX_YAML_BYTES = 1024**2  # a study file: configs/paper.yaml is 9 KB
MAX_VALUES = 100_000  # values of a study once YAML aliases are expanded: configs/paper.yaml has ~600
MAX_KEY_CHARS = 64  # a key of models / methods / eval.settings names a directory; the longest shipped one has 17

# Files the harness reads (stapo.core.bounded reads each under its cap, read here at call time so a test can lower
# them). A cap is far above any real file and far below what would exhaust a node's memory; a device or FIFO is
# refused whatever its cap.
MAX_DEPTH = 64  # nesting of a JSON or YAML value, checked before it is parsed (the parsers recurse: a 2 KB
#                 `x: [[[...]]]` once ended in a RecursionError); configs/paper.yaml nests 5 deep, a summary 3
MAX_JSON_BYTES = 16 * 1024**2  # a summary, manifest, lock or run config.yaml: a few KB each
MAX_LINE_BYTES = 16 * 1024**2  # one JSON line: a completion of 131,072 tokens is ~0.6 MB of text
MAX_LOG_BYTES = 1024**3  # metrics.jsonl, diagnostics.jsonl, silenced_examples.jsonl: ~1 KB per step, the paper's
#                          run 3,000 steps
MAX_SAMPLES_BYTES = 4 * 1024**3  # a per-sample file: avg@32 of 675 problems at 20,480 tokens is ~2 GB at worst
MAX_DATA_BYTES = 1024**3  # a benchmark or training data file: DAPO-Math-17k is ~10 MB, MATH500 0.4 MB
MAX_DIGITS = 4_300  # digits of an integer in JSON (Python's own int-parsing limit, sys.get_int_max_str_digits)

# bundled:tiny-qwen3?key=value: each size a random-init test model may take (stapo.models); the defaults are 2 layers
# of width 64. hidden=10**7 once asked for a 606 GB allocation inside the job, heads=0 a ZeroDivisionError.
TINY_QWEN3_BOUNDS: dict[str, Bound] = {
    "layers": Bound(64, "layers of a test model; Qwen3-14B has 40", minimum=1),
    "hidden": Bound(8_192, "width of a test model; Qwen3-14B's is 5,120", minimum=1),
    "heads": Bound(128, "attention heads; Qwen3-14B has 40", minimum=1),
    "kv_heads": Bound(128, "key-value heads; Qwen3-14B has 8", minimum=1),
    "intermediate": Bound(32_768, "MLP width; Qwen3-14B's is 17,408", minimum=1),
    "seed": _SEED,
    "parameters": Bound(2e9, "weights of a random-init test model (the vocabulary's 151,669 embeddings included): "
                        "2 billion are 8 GB in float32; the paper's smallest model has 1.7 billion"),
}


def check_bound(key: str, value, where: str, bounds: dict[str, Bound] | None = None) -> None:
    """ValueError naming ``where`` unless ``value`` is a finite number within ``BOUNDS[key]`` (or ``bounds[key]``;
    None passes)."""
    bound = (BOUNDS if bounds is None else bounds)[key]
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return  # types are the schema's / dataclass's to check
    if not math.isfinite(value):
        raise ValueError(f"{where}: must be a finite number, got {value}")
    if not bound.minimum <= value <= bound.maximum:
        raise ValueError(f"{where}: must be in [{_number(bound.minimum)}, {_number(bound.maximum)}] ({bound.why}), "
                         f"got {_number(value)}")


def _number(x) -> str:
    return f"{int(x):,}" if float(x).is_integer() and abs(x) < 1e18 else f"{x:g}"


def check_tree(doc) -> None:
    """A loaded study: at most MAX_VALUES values once aliases are expanded (counted without expanding them, so a
    self-referencing or exponential alias structure is refused in bounded time and memory) and no NaN or infinity
    anywhere (``.nan`` passes every ``minimum`` / ``maximum`` comparison)."""
    stack: list[tuple[str, object]] = [("", doc)]
    seen = 0
    while stack:
        path, node = stack.pop()
        seen += 1
        if seen > MAX_VALUES:
            raise ValueError(f"more than {MAX_VALUES:,} values once YAML aliases (*name) are expanded; "
                             "a study has hundreds")
        if isinstance(node, float) and not math.isfinite(node):
            raise ValueError(f"{path or 'top level'}: must be a finite number, got {node}")
        if isinstance(node, dict):
            stack.extend((f"{path}.{k}" if path else str(k), v) for k, v in node.items())
        elif isinstance(node, (list, tuple)):
            stack.extend((f"{path}[{i}]", v) for i, v in enumerate(node))
