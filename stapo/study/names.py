"""The names a study uses: key -> display label -> the paper table's key.

Methods and benchmarks are declared once, where they are defined (stapo/study/methods.py, stapo.tasks.registry); this
module derives their names from those declarations and adds the models and sampling settings of the paper. The
study schema's name enums (stapo.study.check_schema fills them from here), the report's labels and its lookup of
the paper's numbers (``stapo/reference/paper_v2_table.csv``, keyed by ``Name.paper``) read this module. A study
may label its own keys (``methods.<key>.label``, ``eval.benchmarks.<key>.label``, ``eval.settings.<key>.label``;
stapo.study.Study.label).
"""

from __future__ import annotations

from dataclasses import dataclass

from stapo.study.methods import METHODS as _DECLARED_METHODS
from stapo.tasks.registry import BENCHMARKS as _DECLARED_BENCHMARKS

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
METHODS = _registry(Name(BASE, "Base"), *(Name(k, m.label, m.paper) for k, m in _DECLARED_METHODS.items()))
MAIN_METHODS = tuple(k for k, m in _DECLARED_METHODS.items() if m.main)  # the paper's four trained methods

BENCHMARKS = _registry(*(Name(k, b.label, b.paper) for k, b in _DECLARED_BENCHMARKS.items()))  # column order
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
