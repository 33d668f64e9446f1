"""Entry points named by the task YAMLs (``!function hooks.*``); the logic lives in stapo.tasks.registry."""

from stapo.tasks.registry import custom_dataset, process_results  # noqa: F401
