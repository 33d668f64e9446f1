"""Set-up shared by every test module, applied before any of them is imported.

- Offline: no hub look-up from transformers, huggingface_hub or datasets (this machine has no hub).
- One CPU thread per test process, and for the processes the tests start (OMP_NUM_THREADS is inherited): the suite
  runs on 2 cores under pytest-xdist (two workers), and oversubscribed OpenMP threads make tiny matmuls ~100x slower.
- ``shared_dir``: where an expensive result (a trained tiny run) is built once per test run and shared by the tests,
  on every xdist worker, that only read it (tests/helpers/shared.py's ``build_once``).
"""

from __future__ import annotations

import os
from pathlib import Path

for _var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
    os.environ.setdefault(_var, "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)


# ----------------------------------------------------------------- results built once per test run, read by many


@pytest.fixture(scope="session")
def shared_dir(tmp_path_factory) -> Path:
    """A directory every pytest-xdist worker of this test run sees (the parent of the workers' own base temp
    directories; the base temp directory itself without xdist)."""
    base = tmp_path_factory.getbasetemp()
    return (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "shared"
