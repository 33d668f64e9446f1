"""The one registry of the names a study uses: key -> display label -> the paper table's key.

Every stage takes its names from here: the study schema's enums (``workflow/schemas/config.schema.yaml``, checked
against this module by ``tests/test_study.py``), the benchmark registry (``stapo.tasks.registry``), the method
registry (``stapo.study.METHODS``), the report's labels and its lookup of the paper's numbers
(``stapo/reference/paper_v2_table.csv``, keyed by ``Name.paper``).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Name", "MODELS", "METHODS", "MAIN_METHODS", "BASE", "BENCHMARKS", "PAPER_BENCHMARKS", "SETTINGS",
           "label", "paper_key"]


@dataclass(frozen=True)
class Name:
    """One name.

    key:   what configs, paths and CLI flags use (``entropy20``).
    label: what tables and figures show (``20-Entropy``).
    paper: the key of the paper's results table (``stapo/reference/paper_v2_table.csv``), or None when the paper
           reports no number for it (ablations, the synthetic ``arith`` benchmark, models outside the paper).
    """

    key: str
    label: str
    paper: str | None = None


def _registry(*names: Name) -> dict[str, Name]:
    return {n.key: n for n in names}


MODELS = _registry(
    Name("qwen3-1.7b-base", "Qwen3-1.7B-Base", "Qwen3-1.7B-Base"),
    Name("qwen3-8b-base", "Qwen3-8B-Base", "Qwen3-8B-Base"),
    Name("qwen3-14b-base", "Qwen3-14B-Base", "Qwen3-14B-Base"),
)

BASE = "base"  # method and checkpoint key of the untrained model
METHODS = _registry(  # the table's row order
    Name(BASE, "Base"),
    Name("grpo", "GRPO", "GRPO"),
    Name("entropy20", "20-Entropy", "20-Entropy"),
    Name("justrl", "JustRL", "JustRL"),
    Name("stapo", "STAPO", "STAPO"),
    # ablations of the S2T mask (paper, Ablations; configs/ablations.yaml): no row in the paper's table
    Name("stapo_high", "STAPO (mask high-H)"),
    Name("stapo_random", "STAPO (mask random)"),
    Name("stapo_full", "STAPO (mask all candidates)"),
)
MAIN_METHODS = ("grpo", "entropy20", "justrl", "stapo")  # the paper's four trained methods

BENCHMARKS = _registry(  # the table's column order
    Name("aime24", "AIME24", "aime24"),
    Name("aime25", "AIME25", "aime25"),
    Name("amc23", "AMC23", "amc23"),
    Name("math500", "MATH500", "math500"),
    Name("minerva", "Minerva", "minerva"),
    Name("olympiadbench", "OlympiadBench", "olympiadbench"),
    Name("arith", "Arith"),  # synthetic arithmetic of the CPU miniature
)
PAPER_BENCHMARKS = tuple(k for k, n in BENCHMARKS.items() if n.paper)  # the six of the paper (its Avg column)

SETTINGS = _registry(  # the paper's two sampling settings; a table cell reads "first (second)"
    Name("t1.0_p1.0", "T1.0", "t1.0_p1.0"),  # training-aligned: temperature 1.0, top-p 1.0
    Name("t0.7_p0.9", "T0.7", "t0.7_p0.9"),  # JustRL's evaluation default: temperature 0.7, top-p 0.9
)


def label(registry: dict[str, Name], key: str) -> str:
    """Display label of ``key`` (the key itself for names outside the registry, e.g. a user's own model)."""
    return registry[key].label if key in registry else key


def paper_key(registry: dict[str, Name], key: str) -> str | None:
    """The paper table's key of ``key``, or None when the paper has no number for it."""
    return registry[key].paper if key in registry else None
