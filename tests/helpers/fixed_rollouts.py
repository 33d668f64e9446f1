"""`stapo train` with a test double for generation, for the 1-process vs 2-process equivalence test.

Run as ``python tests/helpers/fixed_rollouts.py train ...`` or under ``accelerate launch``. Everything is the real
trainer except two things a test must pin down to compare runs with different process counts:
- ``GRPOTrainer._generate_single_turn`` returns completions drawn from a RNG keyed by (generation call, GLOBAL
  sample index = rank × local batch + position), so every sample is the same whatever the process count;
- reward ``coin``: a deterministic ±1 from the completion text (a random model never solves a problem).
"""

from __future__ import annotations

import random
import sys
import zlib

import torch

torch.set_num_threads(1)

from trl import GRPOTrainer  # noqa: E402

from stapo import cli  # noqa: E402
from stapo.rewards import REWARDS  # noqa: E402


def fixed_completions(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
    self._fixed_calls = getattr(self, "_fixed_calls", 0) + 1
    rank, n_local = self.accelerator.process_index, len(prompt_ids)
    out = []
    for i in range(n_local):
        rng = random.Random(f"{self._fixed_calls}-{rank * n_local + i}")
        ids = [rng.randrange(100, 5000) for _ in range(rng.randint(2, 7))]
        if rng.random() < 0.7:  # most end with EOS, the rest are truncated
            ids.append(self.eos_token_ids[0])
        out.append(ids)
    return out, None


def coin(prompts=None, completions=None, **kwargs):
    return [1.0 if zlib.crc32(str(c).encode()) % 2 else -1.0 for c in completions]


GRPOTrainer._generate_single_turn = fixed_completions
REWARDS["coin"] = coin

if __name__ == "__main__":
    sys.exit(cli.main(sys.argv[1:]))
