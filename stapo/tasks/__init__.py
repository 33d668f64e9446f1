"""lm-eval task group for the STAPO evaluation suite (``include_path=stapo.tasks.TASKS_DIR``).

Tasks ``stapo_<benchmark>`` for aime24, aime25, amc23, math500, minerva, olympiadbench (group ``stapo_math``) and
the synthetic ``stapo_arith``; see registry.py for data sources and the named sampling settings.
"""

from stapo.tasks.registry import BENCHMARKS, SETTINGS, TASKS_DIR, Benchmark, get_benchmark, load_rows, task_name

__all__ = ["BENCHMARKS", "SETTINGS", "TASKS_DIR", "Benchmark", "get_benchmark", "load_rows", "task_name"]
