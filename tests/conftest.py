"""Set-up shared by every test module, applied before any of them is imported.

- Offline: no hub look-up from transformers, huggingface_hub or datasets (this machine has no hub).
- One CPU thread per test process, and for the processes the tests start (OMP_NUM_THREADS is inherited): the suite
  runs on 2 cores under pytest-xdist (two workers), and oversubscribed OpenMP threads make tiny matmuls ~100x slower.
"""

from __future__ import annotations

import os

for _var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
    os.environ.setdefault(_var, "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

torch.set_num_threads(1)
