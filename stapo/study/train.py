"""The ``train`` section of a study: the shared RL recipe, and how its batch sizes map onto TRL.

Batch semantics (paper, Training Details; verl ``train_batch_size`` / ``ppo_mini_batch_size``):
    prompts_per_generation × num_generations completions are sampled per rollout (256 × 8);
    every prompts_per_step × num_generations of them (64 × 8) make one optimiser step, so one rollout batch
    gives prompts_per_generation / prompts_per_step optimiser steps (4), each over fresh samples (num_iterations 1).
In TRL terms (micro-batch = per_device_train_batch_size completions on each of W processes):
    gradient_accumulation_steps = prompts_per_step · G / (per_device_train_batch_size · W)
    steps_per_generation        = gradient_accumulation_steps · prompts_per_generation / prompts_per_step
With a token budget (``micro_batch_tokens``, verl's ``use_dynamic_bsz``) TRL hands the trainer a process's whole
optimiser step at once (per_device_train_batch_size = prompts_per_step · G / W, gradient_accumulation_steps 1)
and stapo.train.trainer splits it into token-budget micro-batches itself (stapo.train.partition).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from stapo.core.fields import Choice, check_fields, from_mapping, option
from stapo.tasks.problems import DatasetError, TrainPrompt, check_worked_example, validate_source
from stapo.core.limits import BOUNDS, check_bound
from stapo.tasks.rewards import REWARDS

__all__ = ["TrainSettings", "MiniBatch", "train_settings", "accumulation", "trl_micro_batch"]


class MiniBatch(Choice):
    """``train.mini_batch``: which completions make an optimiser step.

    groups    each process's share of the rollout batch in rollout order, split into consecutive optimiser steps:
              verl's ``batch.split(ppo_mini_batch_size)``, the shuffle off. Without ``balance_batch`` a process's
              share is whole prompt groups (so prompts_per_step divides by the processes); with it (verl's default)
              the share is the process's balanced partition and a group may span processes and steps
    shuffled  TRL's completion-level shuffle of each process's share before it is split (the default)
    """

    GROUPS = "groups"
    SHUFFLED = "shuffled"

    @property
    def rollout_order(self) -> bool:
        """A process's steps are consecutive slices of its share in rollout order (TRL's shuffle off)."""
        return self is MiniBatch.GROUPS


@dataclass
class TrainSettings:
    """The ``train`` section of a recipe: the shared RL recipe (paper, Training Details; JustRL/DAPO scripts). Values
    are checked by :func:`train_settings` (and their sizes by stapo.core.limits)."""

    dataset: dict = option(help="training source, see stapo.tasks.problems ({name: dapo-math-17k}, {name: "
                                "synthetic-arith, ...}, {path: file.jsonl})",
                           default_factory=lambda: {"name": "dapo-math-17k"})
    prompt: TrainPrompt = option(
        TrainPrompt.STRIPPED, "how a training row becomes the prompt (stapo.tasks.problems.TrainPrompt): stripped "
        "(default; the DAPO-Math instruction wrapper stripped, the problem, a blank line, the paper's \\boxed{} "
        "instruction) or justrl_raw (JustRL's: the raw DAPO-Math text, wrapper included, two newlines, the "
        "instruction; thunlp/JustRL rl_dataset.py use_boxed_suffix_prompt)")
    reward: str = option("dapo_strict", "dapo_strict (paper: JustRL's DAPO verifier, +-1), dapo_lenient, "
                         "math_verify (+-1) or math_verify_01 (1/0), or any reward registered in "
                         "stapo.tasks.rewards.REWARDS (no schema enum: the registry may grow at run time; "
                         "train_settings checks it)")
    max_steps: int = option(3000, "training steps in the paper's unit, rollout batches (verl steps; curves run past "
                            "3,000)")
    save_steps: int = option(20, "resume checkpoint every N rollout steps (weights, optimiser, RNG, data position); "
                             "checkpoint-<N> directories are named by TRL's optimiser step: rollout step x k "
                             "(stapo.core.schedule). A job asked to leave (SIGUSR1/SIGTERM) also saves one at its next "
                             "rollout boundary (stapo.train.continuation)")
    save_total_limit: int | None = option(1, "resume checkpoints kept: the newest N complete ones, the older deleted "
                                          "once a new one is complete (null = all)", minimum=1)
    snapshot_steps: list[int] = option(
        help="rollout steps after which an evaluation snapshot is written: snapshot-<N>/, the weights only, in the "
        "dtype the evaluation loads (bf16 when bf16 is true, else fp32), safetensors (stapo.train.rundir). The "
        "workflow sets it from workflow.eval_every and workflow.checkpoints; by hand: none",
        default_factory=list, items={"type": "integer", "minimum": 1})
    learning_rate: float = option(1e-6, "AdamW learning rate (paper: constant 1e-6 after warm-up)")
    warmup_steps: int = option(10, "warm-up rollout steps; the schedule advances once per rollout step, as verl's")
    lr_scheduler_type: str = option("constant_with_warmup", "transformers' scheduler name")
    weight_decay: float = option(0.1, "AdamW weight decay (JustRL script: 0.1)")
    max_grad_norm: float = option(1.0, "gradient clipping norm (1.0)")
    prompts_per_generation: int = option(256, "prompts per rollout batch (paper 256)")
    num_generations: int = option(8, "rollouts per prompt (paper 8)")
    prompts_per_step: int = option(64, "prompts per optimiser step, the PPO mini-batch (paper 64)")
    per_device_train_batch_size: int = option(
        1, "completions per micro-batch per process when micro_batch_tokens is null, and the chunk of TRL's no-grad "
        "forwards (pi_old, reference) either way")
    micro_batch_tokens: int | None = option(
        None, "token budget of a micro-batch per process (prompt + completion tokens; verl's "
        "ppo_max_token_len_per_gpu with use_dynamic_bsz; JustRL's script: 32,768); null = fixed micro-batches of "
        "per_device_train_batch_size completions. stapo.train.partition: ceil(tokens / budget) micro-batches (the "
        "largest over processes), Karmarkar-Karp balanced, as verl 0.4 does")
    padding_free: bool = option(False, "token-budget micro-batches are packed into one row (position ids restart at "
                                "every sequence; no padding) instead of padded to their longest prompt and completion")
    mini_batch: MiniBatch = option(MiniBatch.SHUFFLED, "which completions make an optimiser step: groups (each "
                                   "process's share in rollout order, split into consecutive steps: verl's "
                                   "batch.split(ppo_mini_batch_size), shuffle off) or shuffled (TRL's completion-level "
                                   "shuffle of the share before it is split)")
    balance_batch: bool = option(True, "which completions each process trains on: true (verl's _balance_batch, on by "
                                 "default in verl 0.4 and in JustRL's run; stapo.train.partition.rank_partitions): "
                                 "the rollout batch split into equal-size Karmarkar-Karp partitions of balanced "
                                 "prompt + completion tokens, process r the r-th; false: each process its own "
                                 "generated prompts (TRL's contiguous share). Identical on one process")
    num_iterations: int = option(1, "PPO epochs over each rollout batch (paper 1)")
    max_prompt_length: int = option(1024, "prompts longer than this (tokens) are dropped, as verl's "
                                    "filter_overlong_prompts (1,024)")
    max_completion_length: int = option(15360, "response budget in tokens (15,360)")
    temperature: float = option(1.0, "rollout sampling temperature (1.0)")
    top_p: float = option(1.0, "rollout nucleus sampling (1.0)")
    scale_rewards: str = option("group", "TRL advantage scaling (group: (r - mean) / std within the group, as "
                                "GRPO/DAPO)")
    bf16: bool = option(True, "bf16 compute with fp32 master weights; false on CPU")
    gradient_checkpointing: bool = option(True, "recompute activations in the backward (GPU memory); false on CPU")
    use_vllm: bool = option(True, "vLLM rollouts (colocated on GPU; off on CPU)")
    vllm_mode: str = option("colocate", "TRL's vllm_mode")
    vllm_gpu_memory_utilization: float | None = option(
        None, "vLLM's memory fraction; null = the device's default (stapo.vllm_settings: 0.5 GPU, 0.1 CPU)")
    vllm: dict = option(help="further TRL vllm_* options, keys without the prefix (e.g. {enable_sleep_mode: true}), "
                        "over the device defaults of stapo.vllm_settings", default_factory=dict)
    seed: int = option(0, "seeds sampling and the data order")
    report_to: str | list[str] = option(
        "none", "experiment trackers, passed to TRL as report_to (none, the default, or one or a list of "
        "tensorboard, wandb, trackio, mlflow, ...: transformers' integrations); the run name is "
        "<model>/<method>/seed<seed>. TensorBoard writes to <run dir>/runs/; wandb / trackio read their own "
        "environment (WANDB_PROJECT, WANDB_MODE=offline, ...)")
    worked_example: dict | None = option(
        None, "{problem, solution}: one worked exchange shown before every prompt (stapo.tasks.problems.build_prompt; "
              "the CPU "
        "miniature's SmolLM2-135M writes \\boxed{} only when shown how); null (the paper) = none")
    logging_steps: int = option(1, "always 1 (metrics.jsonl has one line per optimiser step); kept for completeness")
    diagnostics_every: int = option(0, "every N optimiser steps, log the paper's token analysis "
                                       "(stapo.train.diagnostics: "
                                    "gradient norm per probability x entropy quadrant, entropy quantiles, "
                                    "silenced-token examples); 0 = off")
    diagnostics_examples: int = option(8, "silenced-token examples written per diagnostics step")


_POSITIVE = ("max_steps", "save_steps", "prompts_per_generation", "num_generations", "prompts_per_step",
             "per_device_train_batch_size", "num_iterations", "max_prompt_length", "max_completion_length")



_NUMBERS = ("learning_rate", "weight_decay", "max_grad_norm", "temperature", "top_p")


def _validate(s: TrainSettings, where: str) -> None:
    check_fields(s, f"{where}.")  # prompt, mini_batch: their enums
    for key in _NUMBERS:
        value = getattr(s, key)
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise ValueError(f"{where}.{key}: must be a number, got {value!r}")
    for key in _POSITIVE:
        value = getattr(s, key)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{where}.{key}: must be a positive integer, got {value!r}")
    for f in dataclasses.fields(s):  # every number that sizes work or diverges, within stapo.core.limits' bound
        if f.name in BOUNDS:
            check_bound(f.name, getattr(s, f.name), f"{where}.{f.name}")
    if s.num_generations < 2:
        raise ValueError(f"{where}.num_generations: must be >= 2 (advantages are normalised within each prompt's "
                         f"group of rollouts), got {s.num_generations}")
    if s.prompts_per_generation % s.prompts_per_step:
        raise ValueError(f"{where}.prompts_per_generation ({s.prompts_per_generation}) must be a multiple of "
                         f"{where}.prompts_per_step ({s.prompts_per_step})")
    if s.micro_batch_tokens is not None:
        longest = s.max_prompt_length + s.max_completion_length
        if isinstance(s.micro_batch_tokens, bool) or not isinstance(s.micro_batch_tokens, int):
            raise ValueError(f"{where}.micro_batch_tokens: an integer or null, got {s.micro_batch_tokens!r}")
        if s.micro_batch_tokens < longest:
            raise ValueError(f"{where}.micro_batch_tokens ({s.micro_batch_tokens}) must hold the longest sequence, "
                             f"max_prompt_length + max_completion_length = {longest} (verl asserts the same)")
    elif s.padding_free:
        raise ValueError(f"{where}.padding_free: needs micro_batch_tokens (token-budget micro-batches)")
    if s.reward not in REWARDS:
        raise ValueError(f"{where}.reward: unknown reward {s.reward!r}; expected one of {sorted(REWARDS)}")
    if not 0.0 < s.temperature or not 0.0 < s.top_p <= 1.0:
        raise ValueError(f"{where}.temperature/top_p: need temperature > 0 and top_p in (0, 1], got "
                         f"{s.temperature}, {s.top_p}")
    if s.save_total_limit is not None and (isinstance(s.save_total_limit, bool)
                                           or not isinstance(s.save_total_limit, int) or s.save_total_limit < 1):
        raise ValueError(f"{where}.save_total_limit: a positive integer (resume checkpoints kept) or null (all), got "
                         f"{s.save_total_limit!r}")
    steps = s.snapshot_steps
    if not isinstance(steps, list) or not all(isinstance(n, int) and not isinstance(n, bool) and 0 < n for n in steps):
        raise ValueError(f"{where}.snapshot_steps: a list of rollout steps >= 1, got {str(steps)[:80]}")
    if s.diagnostics_every < 0 or s.diagnostics_examples < 0:
        raise ValueError(f"{where}.diagnostics_every and {where}.diagnostics_examples must be >= 0")
    if s.learning_rate <= 0 or s.warmup_steps < 0 or s.max_grad_norm < 0 or s.weight_decay < 0:
        raise ValueError(f"{where}.learning_rate must be > 0 and {where}.warmup_steps/max_grad_norm/weight_decay "
                         ">= 0")
    _validate_trackers(s.report_to, where)
    check_worked_example(s.worked_example, where)
    try:
        validate_source(s.dataset)
    except DatasetError as err:
        raise ValueError(str(err)) from None  # names train.dataset.<key> or the file


# transformers' reporting integrations (transformers.integrations.INTEGRATION_TO_CALLBACK, 5.24), named here so a
# study is checked without importing transformers; "none" and "all" are TrainingArguments' own values.
TRACKERS = ("none", "all", "azure_ml", "clearml", "codecarbon", "comet_ml", "dagshub", "dvclive", "flyte", "kubeflow",
            "mlflow", "neptune", "swanlab", "tensorboard", "trackio", "wandb")


def _validate_trackers(report_to, where: str) -> None:
    names = [report_to] if isinstance(report_to, str) else report_to
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise ValueError(f"{where}.report_to: a tracker name or a list of them, got {report_to!r}")
    unknown = [n for n in names if n not in TRACKERS]
    if unknown:
        raise ValueError(f"{where}.report_to: unknown tracker(s) {unknown}; expected some of {list(TRACKERS)}")
    if len(names) > 1 and ("none" in names or "all" in names):
        raise ValueError(f"{where}.report_to: 'none' and 'all' stand alone, got {names}")


def train_settings(section: dict, where: str = "train") -> TrainSettings:
    """The validated TrainSettings of a ``train`` section (``where`` prefixes the key an error names)."""
    settings = from_mapping(TrainSettings, section, where)
    _validate(settings, where)
    return settings


def trl_micro_batch(settings: TrainSettings, num_processes: int) -> int:
    """TRL's per_device_train_batch_size: the fixed micro-batch, or, with a token budget, the process's whole
    optimiser step (stapo.train.trainer splits it into token-budget micro-batches)."""
    if settings.micro_batch_tokens is None:
        return settings.per_device_train_batch_size
    per_step = settings.prompts_per_step * settings.num_generations
    if per_step % num_processes:
        raise ValueError(f"train.prompts_per_step × num_generations ({per_step}) must be a multiple of the "
                         f"processes ({num_processes})")
    return per_step // num_processes


def accumulation(settings: TrainSettings, num_processes: int) -> tuple[int, int]:
    """(gradient_accumulation_steps, steps_per_generation) for TRL (see the module docstring)."""
    per_step = settings.prompts_per_step * settings.num_generations
    if settings.mini_batch.rollout_order and not settings.balance_batch and settings.prompts_per_step % num_processes:
        raise ValueError(f"train.mini_batch groups: train.prompts_per_step ({settings.prompts_per_step}) must be a "
                         f"multiple of the processes ({num_processes}), so that each holds whole prompt groups")
    micro = trl_micro_batch(settings, num_processes) * num_processes
    if per_step % micro:
        raise ValueError(f"train.prompts_per_step × num_generations ({per_step}) must be a multiple of "
                         f"train.per_device_train_batch_size × processes ({micro})")
    grad_accum = per_step // micro
    return grad_accum, grad_accum * (settings.prompts_per_generation // settings.prompts_per_step)
