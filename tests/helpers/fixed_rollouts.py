"""`stapo train` with a test double for generation, for the 1-process vs 2-process equivalence test.

Run as ``python tests/helpers/fixed_rollouts.py train ...`` or under ``accelerate launch``. Everything is the real
trainer except two things a test must pin down to compare runs with different process counts:
- ``GRPOTrainer._generate_single_turn`` returns completions drawn from a RNG keyed by (rollout step, GLOBAL
  sample index = rank × local batch + position), so every sample is the same whatever the process count;
- reward ``coin``: a deterministic ±1 from the completion text (a random model never solves a problem).

FSDP on CPU: accelerate enables FSDP only for accelerator device types (AcceleratorState turns an FSDP launch on
CPU ranks into MULTI_CPU, plain data parallel), although torch's FSDP2 runs on CPU over gloo. Under an FSDP launch
(``ACCELERATE_USE_FSDP=true``) on CPU ranks this launcher lifts that one gate — the state becomes FSDP with the
launch's plugin, as it would on GPUs — so everything downstream (accelerate's fully_shard wrapping, transformers'
and TRL's FSDP branches, the trainer's engine detection) is the real FSDP path.

With ``STAPO_TEST_GRAD_DUMP=<file>`` it also saves the first optimiser step's gradient as the optimiser will see
it — after the trainer's normaliser rescale (``_close_window``), before clipping — unsharded (an FSDP2 shard is a
DTensor: ``full_tensor()``, a collective every rank enters), with the engine and each rank's token counts.
``STAPO_TEST_NORMALISER=<aggregator name>`` forces the trainer's aggregator (stapo.losses.aggregation; e.g.
``deepspeed_kept_fraction``, DeepSpeed's estimate, under FSDP).
``STAPO_TEST_SHARE_DUMP=<dir>``: each rank writes, for every rollout, the rows it generated and the rows it trains on
after ``train.balance_batch`` (completion token ids, prompt + completion lengths) to ``<dir>/rank<r>-<k>.json``.
``STAPO_TEST_HOLD_AFTER_SAVE=<step>``: every rank but rank 0 stops (sleeps until killed) once checkpoint <step> is
complete, so a test can kill a machine at a known point whatever the machine's load (rank 0 waits for the others in
the next step's first collective, as it would for a machine that hangs).
"""

from __future__ import annotations

import os
import random
import sys
import time
import zlib

import torch

torch.set_num_threads(1)

from accelerate.state import AcceleratorState, PartialState  # noqa: E402
from accelerate.utils import DistributedType  # noqa: E402
from trl import GRPOTrainer  # noqa: E402

from stapo import cli  # noqa: E402
from stapo.train.rundir import CheckpointSentinel  # noqa: E402
from stapo.tasks.rewards import REWARDS  # noqa: E402
import stapo.train.trainer as trainer_module  # noqa: E402
from stapo.train.trainer import StapoGRPOTrainer  # noqa: E402


def fixed_completions(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
    # keyed by the optimiser step the rollout starts at, + 1 (not by a count of calls, which restarts at 1 in a
    # resumed process): a resumed run generates what the uninterrupted one did at the same step. The + 1 keeps the
    # completions every other test was written against (call n = step n - 1 + 1 with one generation per step).
    rollout = self.state.global_step + 1
    rank, n_local = self.accelerator.process_index, len(prompt_ids)
    out = []
    for i in range(n_local):
        rng = random.Random(f"{rollout}-{rank * n_local + i}")
        ids = [rng.randrange(100, 5000) for _ in range(rng.randint(2, 7))]
        if rng.random() < 0.7:  # most end with EOS, the rest are truncated
            ids.append(self.eos_token_ids[0])
        out.append(ids)
    return out, None


def coin(prompts=None, completions=None, **kwargs):
    return [1.0 if zlib.crc32(str(c).encode()) % 2 else -1.0 for c in completions]


def fsdp_on_cpu(init):
    def wrapped(self, *args, fsdp_plugin=None, **kwargs):
        init(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        if self.distributed_type == DistributedType.MULTI_CPU and fsdp_plugin is not None:  # what a GPU run does:
            self.distributed_type, self.fsdp_plugin = DistributedType.FSDP, fsdp_plugin
            if self._mixed_precision != "no":
                fsdp_plugin.set_mixed_precision(self._mixed_precision)
            PartialState._shared_state["distributed_type"] = DistributedType.FSDP

    return wrapped


def dump_first_step_gradient(close_window, path: str):
    def wrapped(self, model):
        local = torch.stack([self._window.tokens, self._window.kept])  # this rank's completion / kept tokens
        close_window(self, model)
        if getattr(self, "_grad_dumped", False):
            return
        self._grad_dumped = True
        from torch.distributed.tensor import DTensor

        sharded, grads = False, {}
        for name, p in model.named_parameters():
            if p.grad is not None:
                sharded |= isinstance(p.grad, DTensor)
                grads[name] = (p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad).detach().clone()
        per_rank = self.accelerator.gather(local.reshape(1, 2)).tolist()
        plugin = getattr(self.accelerator.state, "fsdp_plugin", None)
        if self.accelerator.is_main_process:
            torch.save({"grads": grads, "engine": self.accelerator.distributed_type.value, "sharded": sharded,
                        "fsdp_version": getattr(plugin, "fsdp_version", None), "normaliser": self._aggregation.name,
                        "reduce_dtype": str(getattr(getattr(plugin, "mixed_precision_policy", None), "reduce_dtype",
                                                    None)),
                        "tokens_per_rank": [t for t, _ in per_rank], "kept_per_rank": [k for _, k in per_rank]},
                       path)

    return wrapped


GRPOTrainer._generate_single_turn = fixed_completions
REWARDS["coin"] = coin
if os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true" and not torch.cuda.is_available():
    AcceleratorState.__init__ = fsdp_on_cpu(AcceleratorState.__init__)
if os.environ.get("STAPO_TEST_NORMALISER"):
    _forced, _aggregation = os.environ["STAPO_TEST_NORMALISER"], trainer_module.aggregation

    def _forced_aggregation(mode, *, deepspeed=False):
        found = [a for a in (_aggregation(mode), _aggregation(mode, deepspeed=True)) if a.name == _forced]
        if not found:
            raise ValueError(f"STAPO_TEST_NORMALISER={_forced}: no aggregator of that name for {mode}")
        return found[0]

    trainer_module.aggregation = _forced_aggregation
if os.environ.get("STAPO_TEST_GRAD_DUMP"):
    StapoGRPOTrainer._close_window = dump_first_step_gradient(StapoGRPOTrainer._close_window,
                                                              os.environ["STAPO_TEST_GRAD_DUMP"])

def dump_shares(balance, directory: str):
    import json
    from pathlib import Path

    from stapo.train import layout

    def rows(out: dict) -> dict:
        ids = [c[m.bool()].tolist() for c, m in zip(out["completion_ids"], out["completion_mask"])]
        return {"completions": ids, "lengths": layout.sequence_lengths(out)}

    def wrapped(self, out):
        share = balance(self, out)
        self._share_dumps = getattr(self, "_share_dumps", 0) + 1
        path = Path(directory) / f"rank{self.accelerator.process_index}-{self._share_dumps}.json"
        path.write_text(json.dumps({"generated": rows(out), "trained": rows(share)}))
        return share

    return wrapped


if os.environ.get("STAPO_TEST_SHARE_DUMP"):
    StapoGRPOTrainer._balance_ranks = dump_shares(StapoGRPOTrainer._balance_ranks, os.environ["STAPO_TEST_SHARE_DUMP"])

if os.environ.get("STAPO_TEST_HOLD_AFTER_SAVE"):
    _hold_at, _on_save = int(os.environ["STAPO_TEST_HOLD_AFTER_SAVE"]), CheckpointSentinel.on_save

    def _hold_after_save(self, args, state, control, **kwargs):
        _on_save(self, args, state, control, **kwargs)  # the checkpoint's manifest: it is complete
        if state.global_step == _hold_at and int(os.environ.get("RANK", "0")) != 0:
            time.sleep(3600)

    CheckpointSentinel.on_save = _hold_after_save

if __name__ == "__main__":
    sys.exit(cli.main(sys.argv[1:]))
