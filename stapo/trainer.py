"""``stapo train``: the four methods inside TRL's GRPOTrainer, with the paper's recipe, metrics and resume.

The trainer is ``trl.GRPOTrainer`` with one change: the loss is :func:`stapo.objectives.policy_loss` for the
configured method, fed with TRL's per-token log-probs and entropies from its one policy forward pass
(``_get_per_token_logps_and_entropies``; no full logits, no second pass). Generation, rewards, advantages
(group-normalised, paper Eq. 1), reference model (GRPO's KL), vLLM and DeepSpeed are TRL's and accelerate's.

Batch semantics (paper, Training Details; verl ``train_batch_size`` / ``ppo_mini_batch_size``):
    prompts_per_generation × num_generations completions are sampled per rollout (256 × 8);
    every prompts_per_step × num_generations of them (64 × 8) make one optimiser step, so one rollout batch
    gives prompts_per_generation / prompts_per_step optimiser steps (4), each over fresh samples (num_iterations 1).
In TRL terms (micro-batch = per_device_train_batch_size completions on each of W processes):
    gradient_accumulation_steps = prompts_per_step · G / (per_device_train_batch_size · W)
    steps_per_generation        = gradient_accumulation_steps · prompts_per_generation / prompts_per_step
TRL shuffles the rollout batch at completion level before splitting it, so an optimiser step holds 512 random
completions rather than 64 whole groups; advantages are computed over the whole rollout batch first, so the loss
is unaffected.

Gradient accumulation, token-mean methods (justrl, entropy20, stapo) — exact. The step's loss is
Σ_j S_j / K, S_j the kept per-token surrogate sum of micro-batch j and K the kept-token count of the whole
optimiser step (all micro-batches, all ranks). K depends on masks computed from the current policy during each
micro-batch's forward, so it is unknown when micro-batch 1 is back-propagated. Each micro-batch is therefore
back-propagated as S_j / c with a constant provisional normaliser c (TRL's dapo normaliser: the window's
completion-token count per rank), the kept counts are summed over the window, and after the last micro-batch's
backward (gradients already all-reduced, before clipping and the optimizer step) every gradient is multiplied
by c·W / K. The masks are constants of θ, which does not change within a window, so this equals back-propagating
Σ_j S_j / K exactly. Under DeepSpeed (whose engine steps inside the last backward, so gradients cannot be
rescaled) the per-micro-batch normaliser is c times the micro-batch's global kept fraction — exact for justrl,
approximate (error ~ the silenced fraction, < 1e-4 in the paper) for stapo/entropy20; a warning says so.
GRPO (sequence-mean) is divided by gradient_accumulation_steps, as TRL does for its "grpo" loss.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import os
import shutil
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import yaml
from transformers import TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from stapo.atomic import append_line, atomic_write
from stapo.data import DatasetError, build_prompt, load_problems, validate_source
from stapo.diagnostics import TokenDiagnostics
from stapo.models import resolve_model
from stapo.objectives import ObjectiveConfig, get_objective, policy_loss
from stapo.rewards import REWARDS
from stapo.vllm_settings import trl_vllm_kwargs

__all__ = ["TrainSettings", "Plan", "load_recipe", "resolve_plan", "StapoGRPOTrainer", "build_trainer", "train",
           "latest_complete_checkpoint", "add_arguments", "run"]

log = logging.getLogger("stapo.trainer")
COMPLETE = "STAPO_CHECKPOINT_COMPLETE"  # sentinel written after a checkpoint is fully saved
STEP_METRICS = ("entropy_mean", "candidate_fraction", "silenced_fraction", "kept_fraction", "clip_fraction",
                "clip_fraction_low", "clip_fraction_high", "ratio_mean", "kl_mean")


# -------------------------------------------------------------------------------------------------- recipe


@dataclass
class TrainSettings:
    """The ``train`` section of a recipe: the shared RL recipe (paper, Training Details; JustRL/DAPO scripts).

    Attributes:
        dataset: training source, see stapo.data (``{name: dapo-math-17k}``, ``{name: synthetic-arith, ...}``,
            ``{path: file.jsonl}``).
        reward: ``dapo_strict`` (paper: DAPO verifier, ±1), ``math_verify`` (±1) or ``math_verify_01`` (1/0).
        max_steps: optimiser steps (paper curves run past 3,000).
        save_steps: checkpoint every N optimiser steps (paper evaluates every 20); a multiple of the optimiser
            steps per rollout batch, so a checkpoint never falls inside a rollout batch.
        save_total_limit: keep only the newest N checkpoints (None = all).
        learning_rate, warmup_steps, lr_scheduler_type: AdamW, constant 1e-6 after 10 warm-up steps.
        weight_decay: 0.1 (JustRL script). max_grad_norm: 1.0.
        prompts_per_generation: prompts per rollout batch (paper 256). num_generations: rollouts per prompt (8).
        prompts_per_step: prompts per optimiser step, the PPO mini-batch (paper 64).
        per_device_train_batch_size: completions per micro-batch per process (paper: 1 per GPU).
        num_iterations: PPO epochs over each rollout batch (paper 1).
        max_prompt_length: prompts longer than this (tokens) are dropped, as verl's filter_overlong_prompts (1,024).
        max_completion_length: response budget in tokens (15,360).
        temperature, top_p: rollout sampling (1.0, 1.0).
        scale_rewards: TRL advantage scaling ("group": (r − mean) / std within the group, as GRPO/DAPO).
        bf16, gradient_checkpointing: GPU memory settings (both false on CPU).
        use_vllm, vllm_mode, vllm_gpu_memory_utilization: vLLM rollouts (colocated on GPU; off on CPU);
            vllm_gpu_memory_utilization None = the device's default (stapo.vllm_settings: 0.5 GPU, 0.1 CPU).
        vllm: further TRL ``vllm_*`` options, keys without the prefix (e.g. ``{enable_sleep_mode: true}``),
            over the device defaults of stapo.vllm_settings.
        seed: seeds model init-free RNG, sampling and the data order.
        logging_steps: always 1 (metrics.jsonl has one line per optimiser step); kept for completeness.
        diagnostics_every: every N optimiser steps, log the paper's token analysis (stapo.diagnostics: gradient
            norm per probability × entropy quadrant, entropy quantiles, silenced-token examples); 0 = off.
        diagnostics_examples: silenced-token examples written per diagnostics step.
    """

    dataset: dict = field(default_factory=lambda: {"name": "dapo-math-17k"})
    reward: str = "dapo_strict"
    max_steps: int = 3000
    save_steps: int = 20
    save_total_limit: int | None = None
    learning_rate: float = 1e-6
    warmup_steps: int = 10
    lr_scheduler_type: str = "constant_with_warmup"
    weight_decay: float = 0.1
    max_grad_norm: float = 1.0
    prompts_per_generation: int = 256
    num_generations: int = 8
    prompts_per_step: int = 64
    per_device_train_batch_size: int = 1
    num_iterations: int = 1
    max_prompt_length: int = 1024
    max_completion_length: int = 15360
    temperature: float = 1.0
    top_p: float = 1.0
    scale_rewards: str = "group"
    bf16: bool = True
    gradient_checkpointing: bool = True
    use_vllm: bool = True
    vllm_mode: str = "colocate"
    vllm_gpu_memory_utilization: float | None = None
    vllm: dict = field(default_factory=dict)
    seed: int = 0
    logging_steps: int = 1
    diagnostics_every: int = 0
    diagnostics_examples: int = 8


_POSITIVE = ("max_steps", "save_steps", "prompts_per_generation", "num_generations", "prompts_per_step",
             "per_device_train_batch_size", "num_iterations", "max_prompt_length", "max_completion_length")


def _validate_settings(s: TrainSettings) -> None:
    for key in _POSITIVE:
        value = getattr(s, key)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"train.{key}: must be a positive integer, got {value!r}")
    if s.prompts_per_generation % s.prompts_per_step:
        raise ValueError(f"train.prompts_per_generation ({s.prompts_per_generation}) must be a multiple of "
                         f"train.prompts_per_step ({s.prompts_per_step})")
    if s.reward not in REWARDS:
        raise ValueError(f"train.reward: unknown reward {s.reward!r}; expected one of {sorted(REWARDS)}")
    if not 0.0 < s.temperature or not 0.0 < s.top_p <= 1.0:
        raise ValueError(f"train.temperature/top_p: need temperature > 0 and top_p in (0, 1], got "
                         f"{s.temperature}, {s.top_p}")
    if s.diagnostics_every < 0 or s.diagnostics_examples < 0:
        raise ValueError("train.diagnostics_every and train.diagnostics_examples must be >= 0")
    if s.learning_rate <= 0 or s.warmup_steps < 0 or s.max_grad_norm < 0 or s.weight_decay < 0:
        raise ValueError("train.learning_rate must be > 0 and train.warmup_steps/max_grad_norm/weight_decay >= 0")
    steps_per_rollout = s.prompts_per_generation // s.prompts_per_step * s.num_iterations
    if s.save_steps % steps_per_rollout:
        raise ValueError(f"train.save_steps ({s.save_steps}) must be a multiple of the optimiser steps per rollout "
                         f"batch ({steps_per_rollout}), so that a checkpoint never falls inside a rollout batch")
    try:
        validate_source(s.dataset)
    except DatasetError as err:
        raise ValueError(str(err)) from None


def _settings(section: dict, where: str = "train") -> TrainSettings:
    known = {f.name for f in dataclasses.fields(TrainSettings)}
    unknown = sorted(set(section) - known)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}; expected some of {sorted(known)}")
    settings = TrainSettings(**section)
    _validate_settings(settings)
    return settings


@dataclass
class Plan:
    """Everything one ``stapo train`` run needs, resolved and validated (written to DIR/config.yaml)."""

    model_key: str
    model_spec: str
    method_key: str
    objective: ObjectiveConfig
    settings: TrainSettings


def load_recipe(path: str | os.PathLike) -> dict:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"--recipe: recipe file not found: {path}")
    recipe = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    for key in ("models", "methods", "train"):
        if not isinstance(recipe.get(key), dict):
            raise ValueError(f"{path}: missing or invalid section {key!r}")
    return recipe


def _objective(recipe: dict, method_key: str) -> ObjectiveConfig:
    methods = recipe["methods"]
    if method_key not in methods:
        raise ValueError(f"methods: unknown method {method_key!r}; the recipe defines {sorted(methods)}")
    entry = dict(methods[method_key] or {})
    name = entry.pop("objective", method_key)
    known = {f.name for f in dataclasses.fields(ObjectiveConfig)} - {"method"}
    unknown = sorted(set(entry) - known)
    if unknown:
        raise ValueError(f"methods.{method_key}: unknown key(s) {unknown}; expected some of {sorted(known)}")
    try:
        return get_objective(name, **entry)
    except (ValueError, TypeError) as err:
        raise ValueError(f"methods.{method_key}.{err}") from None


def resolve_plan(recipe: dict, model_key: str, method_key: str, *, max_steps: int | None = None,
                 seed: int | None = None) -> Plan:
    """Validate the recipe's models/methods/train sections for one (model, method) and resolve overrides.

    A model entry may carry ``train:`` overrides (e.g. a smaller micro-batch for 14B). Fails before any
    loading, with a message naming the bad key.
    """
    models = recipe["models"]
    if model_key not in models:
        raise ValueError(f"models: unknown model {model_key!r}; the recipe defines {sorted(models)}")
    entry = models[model_key] or {}
    if "spec" not in entry:
        raise ValueError(f"models.{model_key}.spec: missing (a hub id, local directory or bundled:NAME)")
    objective = _objective(recipe, method_key)
    section = {**recipe["train"], **(entry.get("train") or {})}
    if max_steps is not None:
        section["max_steps"] = max_steps
    if seed is not None:
        section["seed"] = seed
    return Plan(model_key, str(entry["spec"]), method_key, objective, _settings(section))


def accumulation(settings: TrainSettings, num_processes: int) -> tuple[int, int]:
    """(gradient_accumulation_steps, steps_per_generation) for TRL (see the module docstring)."""
    per_step = settings.prompts_per_step * settings.num_generations
    micro = settings.per_device_train_batch_size * num_processes
    if per_step % micro:
        raise ValueError(f"train.prompts_per_step × num_generations ({per_step}) must be a multiple of "
                         f"train.per_device_train_batch_size × processes ({micro})")
    grad_accum = per_step // micro
    return grad_accum, grad_accum * (settings.prompts_per_generation // settings.prompts_per_step)


# ------------------------------------------------------------------------------------------------- trainer


class StapoGRPOTrainer(GRPOTrainer):
    """GRPOTrainer whose loss is ``stapo.objectives.policy_loss(objective, ...)`` (see the module docstring)."""

    def __init__(self, *args, objective: ObjectiveConfig, diagnostics: TokenDiagnostics | None = None, **kwargs):
        self.objective = objective
        super().__init__(*args, **kwargs)
        self._diagnostics = diagnostics
        if diagnostics is not None:  # every rank observes (collectives under ZeRO-3); rank 0 writes
            diagnostics.writer = self.accelerator.is_main_process
            diagnostics.attach(self.accelerator.unwrap_model(self.model))
        self._window = None  # per-optimiser-step accumulators (local to this process)
        self._deepspeed = self.accelerator.distributed_type.value == "DEEPSPEED"
        if self._deepspeed and objective.method in ("stapo", "entropy20"):
            warnings.warn("DeepSpeed: the kept-token normaliser is estimated per micro-batch (see stapo.trainer)")

    # -- loss ------------------------------------------------------------------------------------------------

    def _compute_loss(self, model, inputs):
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        input_ids = torch.cat([inputs["prompt_ids"], completion_ids], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], completion_mask], dim=1)
        logps, entropies, _ = self._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, completion_ids.size(1), compute_entropy=True
        )
        old_logps = inputs.get("old_per_token_logps")
        training = self.model.training
        if training and self._diagnostics is not None:
            self._diagnostics.observe(model=self.accelerator.unwrap_model(model), inputs=inputs, logps=logps,
                                      old_logps=logps.detach() if old_logps is None else old_logps,
                                      entropies=entropies)
        token_mean = self.objective.method != "grpo"
        normalizer = self._provisional_normalizer(inputs) if (training and token_mean) else None
        loss, metrics = policy_loss(
            self.objective, logps=logps, old_logps=logps.detach() if old_logps is None else old_logps,
            advantages=inputs["advantages"], entropies=entropies, completion_mask=completion_mask,
            ref_logps=inputs.get("ref_per_token_logps") if self.beta != 0.0 else None,
            token_normalizer=normalizer,
        )
        if training and self._deepspeed and token_mean:
            loss = loss * self._kept_fraction_correction(metrics, completion_mask)
        if training and not token_mean:
            loss = loss / self.current_gradient_accumulation_steps  # TRL's grpo loss scaling
        if training:
            self._accumulate(metrics, completion_mask, loss.detach())
        return loss

    def _provisional_normalizer(self, inputs) -> torch.Tensor:
        """The constant c of the window: TRL's dapo normaliser (window completion tokens per process)."""
        if self._window is None:
            n = inputs["num_items_in_batch"].float().clamp(min=1.0) / self.accelerator.num_processes
            c = n * self.current_gradient_accumulation_steps / self.args.steps_per_generation
            self._window = {"c": c.clamp(min=1.0), "sums": None}
        return self._window["c"]

    def _kept_fraction_correction(self, metrics, completion_mask) -> float:
        """DeepSpeed only: 1 / (global kept fraction of this micro-batch), so c·f estimates the kept count."""
        m = completion_mask.sum().float()
        stats = self.accelerator.reduce(torch.stack([m * metrics["kept_fraction"], m]), reduction="sum")
        return float(stats[1] / stats[0]) if float(stats[0]) > 0 else 1.0

    def _accumulate(self, metrics: dict, completion_mask, loss) -> None:
        """Token-weighted sums of the objective's metrics over the window, and the loss bookkeeping."""
        if self._window is None:
            self._window = {"c": None, "sums": None}
        n = completion_mask.sum().float()
        row = [n * metrics[k] for k in STEP_METRICS] + [n, n * metrics["kept_fraction"], loss]
        row = torch.stack([torch.as_tensor(v, dtype=torch.float64, device=n.device) for v in row])
        w = self._window
        w["sums"] = row if w["sums"] is None else w["sums"] + row

    # -- optimiser-step boundary ---------------------------------------------------------------------------

    def training_step(self, model, inputs, num_items_in_batch):
        if self._diagnostics is not None and self._window is None:  # first micro-batch of an optimiser step
            self._diagnostics.begin_step(self.state.global_step + 1)
        loss = super().training_step(model, inputs, num_items_in_batch)
        if self.model.training and self.accelerator.sync_gradients and self._window is not None:
            self._close_window(model)
        return loss

    def _close_window(self, model) -> None:
        """Rescale gradients to the exact kept-token mean and log the step's token-weighted metrics."""
        w, self._window = self._window, None
        sums = self.accelerator.reduce(w["sums"], reduction="sum")
        n_tokens, kept = sums[len(STEP_METRICS)], sums[len(STEP_METRICS) + 1]
        for i, key in enumerate(STEP_METRICS):
            self._metrics["train"][key].append(float(sums[i] / n_tokens.clamp(min=1.0)))
        loss_sum, world = sums[-1], self.accelerator.num_processes  # Σ over ranks and micro-batches
        if self.objective.method == "grpo" or self._deepspeed:
            objective_loss = float(loss_sum) / world  # already scaled per micro-batch: the ranks' mean
        else:
            # each micro-batch back-propagated S_j / c: the exact loss is Σ S / K and the gradients need × c·W / K
            c = w["c"]
            objective_loss = float(loss_sum * c / kept.clamp(min=1.0))
            factor = float(c * world / kept) if float(kept) > 0 else 1.0
            for p in model.parameters():
                if p.grad is not None:
                    p.grad.mul_(factor)
        self._metrics["train"]["objective_loss"].append(objective_loss)
        if self._diagnostics is not None:
            self._diagnostics.end_step(self.state.global_step + 1)  # global_step advances after this step


def _accuracy_reward(reward_fn):
    """Wrap a ±1 / 1-0 reward so each call also logs ``accuracy`` (fraction of completions with reward > 0)."""

    def reward(prompts=None, completions=None, log_metric=None, **kwargs):
        values = reward_fn(prompts=prompts, completions=completions, **kwargs)
        if log_metric is not None and values:
            log_metric("accuracy", sum(v > 0 for v in values) / len(values))
        return values

    reward.__name__ = reward_fn.__name__
    return reward


# ----------------------------------------------------------------------------------------------- callbacks

# metrics.jsonl field <- key in TRL's per-step logs (TRL averages its per-micro-batch lists over the step)
_LOG_FIELDS = {
    "loss": "objective_loss", "reward_mean": "reward", "reward_std": "reward_std", "accuracy": "accuracy",
    "grad_norm": "grad_norm", "response_length_mean": "completions/mean_length", "lr": "learning_rate",
    **{k: k for k in STEP_METRICS},
}


class MetricsJsonl(TrainerCallback):
    """Append one JSON line per optimiser step to ``path`` (flushed + fsynced, so a kill loses at most a line)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._t0 = None
        self._seconds = None

    def on_step_begin(self, args, state, control, **kwargs):
        self._t0 = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self._seconds = time.perf_counter() - self._t0 if self._t0 is not None else None

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs or "reward" not in logs:
            return
        row = {"step": state.global_step}
        for name, key in _LOG_FIELDS.items():
            value = logs.get(key)
            row[name] = None if value is None or (isinstance(value, float) and math.isnan(value)) else value
        row["step_seconds"] = self._seconds
        append_line(self.path, json.dumps(row))


class CheckpointSentinel(TrainerCallback):
    """Mark ``checkpoint-<step>/`` complete once the Trainer has finished writing it (model, optimizer, RNG)."""

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            ckpt = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            if ckpt.is_dir():
                atomic_write(ckpt / COMPLETE, f"{state.global_step}\n")


def _is_complete(ckpt: Path) -> bool:
    has_weights = any((ckpt / name).exists() for name in ("model.safetensors", "model.safetensors.index.json",
                                                           "pytorch_model.bin", "pytorch_model.bin.index.json"))
    return (ckpt / COMPLETE).is_file() and (ckpt / "trainer_state.json").is_file() and has_weights


def _checkpoints(out: Path) -> list[tuple[int, Path]]:
    found = []
    for path in out.glob("checkpoint-*"):
        suffix = path.name[len("checkpoint-"):]
        if path.is_dir() and suffix.isdigit():
            found.append((int(suffix), path))
    return sorted(found)


def latest_complete_checkpoint(out: str | os.PathLike) -> Path | None:
    """The newest checkpoint-<N> with the sentinel, trainer_state.json and weights; half-written ones are skipped."""
    complete = [path for _, path in _checkpoints(Path(out)) if _is_complete(path)]
    return complete[-1] if complete else None


def _prepare_resume(out: Path) -> Path | None:
    """Pick the resume checkpoint; drop newer half-written checkpoints and metrics lines past its step.

    Every rank picks the same checkpoint; only the main process deletes and rewrites (then all ranks wait).
    """
    from accelerate import PartialState

    state = PartialState()
    ckpt = latest_complete_checkpoint(out)
    if state.is_main_process:
        _clean_after(out, int(ckpt.name.split("-")[1]) if ckpt else 0)
    state.wait_for_everyone()
    return ckpt


def _clean_after(out: Path, step: int) -> None:
    """Remove checkpoints newer than ``step`` or incomplete, and metrics/diagnostics lines past ``step``."""
    for n, path in _checkpoints(out):
        if n > step or not _is_complete(path):
            log.warning("removing incomplete checkpoint %s", path)
            shutil.rmtree(path, ignore_errors=True)
    for name in ("metrics.jsonl", *TokenDiagnostics.FILES):
        path = out / name
        if path.exists():
            kept = [line for line in path.read_text(encoding="utf-8").splitlines()
                    if line.strip() and json.loads(line)["step"] <= step]
            atomic_write(path, "".join(line + "\n" for line in kept))


# --------------------------------------------------------------------------------------------------- build


# transformers 5.x renamed gradient_checkpointing (deprecated alias kept until v6)
_CHECKPOINTING_FIELD = ("activation_checkpointing" if "activation_checkpointing" in GRPOConfig.__dataclass_fields__
                        else "gradient_checkpointing")


def grpo_config(plan: Plan, out: Path, num_processes: int = 1, **overrides) -> GRPOConfig:
    """Map the recipe onto ``trl.GRPOConfig`` (module docstring: batch semantics)."""
    s, obj = plan.settings, plan.objective
    grad_accum, steps_per_generation = accumulation(s, num_processes)
    kwargs = dict(
        output_dir=str(out), max_steps=s.max_steps, save_strategy="steps", save_steps=s.save_steps,
        save_total_limit=s.save_total_limit, logging_steps=1, report_to="none", seed=s.seed, data_seed=s.seed,
        learning_rate=s.learning_rate, lr_scheduler_type=s.lr_scheduler_type, warmup_steps=s.warmup_steps,
        weight_decay=s.weight_decay, max_grad_norm=s.max_grad_norm, optim="adamw_torch",
        per_device_train_batch_size=s.per_device_train_batch_size, gradient_accumulation_steps=grad_accum,
        steps_per_generation=steps_per_generation, num_generations=s.num_generations,
        num_iterations=s.num_iterations, max_completion_length=s.max_completion_length,
        temperature=s.temperature, top_p=s.top_p, scale_rewards=s.scale_rewards,
        loss_type="grpo" if obj.method == "grpo" else "dapo", beta=obj.kl_beta,
        epsilon=obj.eps_low, epsilon_high=obj.eps_high, mask_truncated_completions=False,
        **trl_vllm_kwargs(s),  # device-aware engine settings + recipe overrides; fails fast without vLLM
        vllm_importance_sampling_correction=False,  # policy_loss has no TIS term (the paper's verl runs had none)
        bf16=s.bf16, **{_CHECKPOINTING_FIELD: s.gradient_checkpointing},
        use_cpu=not torch.cuda.is_available(), dataloader_num_workers=0,
        model_init_kwargs={"dtype": torch.bfloat16 if s.bf16 else torch.float32},
    )
    kwargs.update(overrides)
    return GRPOConfig(**kwargs)


def training_dataset(plan: Plan, tokenizer):
    """A datasets.Dataset with ``prompt`` (paper prompt, chat-templated) and ``answer`` columns."""
    from datasets import Dataset

    rows, dropped = [], 0
    for row in load_problems(plan.settings.dataset):
        prompt = build_prompt(row["problem"], tokenizer)
        if len(tokenizer(prompt)["input_ids"]) > plan.settings.max_prompt_length:
            dropped += 1
            continue
        rows.append({"prompt": prompt, "answer": row["answer"]})
    if dropped:
        log.warning("dropped %d prompts longer than train.max_prompt_length=%d", dropped,
                    plan.settings.max_prompt_length)
    if not rows:
        raise ValueError("train.max_prompt_length: every prompt is longer than the limit")
    return Dataset.from_list(rows)


def build_trainer(plan: Plan, out: Path, *, plain: bool = False, callbacks=(), **config_overrides):
    """The StapoGRPOTrainer for ``plan`` (or, ``plain=True``, a stock GRPOTrainer with loss_type="dapo")."""
    from accelerate import PartialState
    from transformers import AutoTokenizer

    model_dir = resolve_model(plan.model_spec)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    config = grpo_config(plan, out, PartialState().num_processes, **config_overrides)
    kwargs = dict(model=model_dir, reward_funcs=[_accuracy_reward(REWARDS[plan.settings.reward])], args=config,
                  train_dataset=training_dataset(plan, tokenizer), processing_class=tokenizer,
                  callbacks=list(callbacks))
    if plain:
        return GRPOTrainer(**kwargs)
    s = plan.settings
    diagnostics = None
    if s.diagnostics_every > 0:
        diagnostics = TokenDiagnostics(out, every=s.diagnostics_every, objective=plan.objective, tokenizer=tokenizer,
                                       temperature=s.temperature, k=s.diagnostics_examples)
    return StapoGRPOTrainer(objective=plan.objective, diagnostics=diagnostics, **kwargs)


def _resolved_config(plan: Plan, config: GRPOConfig) -> dict:
    return {
        "model": {"key": plan.model_key, "spec": plan.model_spec},
        "method": {"key": plan.method_key, **asdict(plan.objective)},
        "train": asdict(plan.settings),
        "trl": {"gradient_accumulation_steps": config.gradient_accumulation_steps,
                "steps_per_generation": config.steps_per_generation,
                "generation_batch_size": config.generation_batch_size,
                "per_device_train_batch_size": config.per_device_train_batch_size,
                "num_processes": config.world_size, "loss_type": config.loss_type, "beta": config.beta},
    }


def _save_final(trainer, out: Path) -> Path:
    """Write DIR/final (weights + tokenizer) through a temporary sibling and one rename, on every rank's watch."""
    final, tmp = out / "final", out / ".final.tmp"
    acc = trainer.accelerator
    if acc.is_main_process and tmp.exists():
        shutil.rmtree(tmp)
    acc.wait_for_everyone()
    trainer.save_model(str(tmp))  # all ranks: ZeRO-3 gathers the weights
    acc.wait_for_everyone()
    if acc.is_main_process:
        trainer.processing_class.save_pretrained(str(tmp))
        os.replace(tmp, final)
    acc.wait_for_everyone()
    return final


def train(plan: Plan, out: str | os.PathLike) -> Path:
    """Run (or resume) one training run into ``out``; returns ``out/final``."""
    out = Path(out)
    if (out / "final").is_dir():
        log.warning("%s/final exists: the run is complete, nothing to do", out)
        return out / "final"
    out.mkdir(parents=True, exist_ok=True)
    resume = _prepare_resume(out)
    trainer = build_trainer(plan, out, callbacks=[MetricsJsonl(out / "metrics.jsonl"), CheckpointSentinel()])
    if trainer.accelerator.is_main_process:
        atomic_write(out / "config.yaml", yaml.safe_dump(_resolved_config(plan, trainer.args), sort_keys=False))
    trainer.train(resume_from_checkpoint=str(resume) if resume else None)
    return _save_final(trainer, out)


# ------------------------------------------------------------------------------------------------------ CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--recipe", required=True, help="recipe YAML (configs/paper.yaml, configs/tiny.yaml)")
    parser.add_argument("--model", required=True, help="model KEY in the recipe's models section")
    parser.add_argument("--method", required=True, help="method KEY in the recipe's methods section")
    parser.add_argument("--out", required=True, help="run directory (metrics.jsonl, checkpoint-N/, final/)")
    parser.add_argument("--max-steps", type=int, default=None, help="override train.max_steps")
    parser.add_argument("--seed", type=int, default=None, help="override train.seed")


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    plan = resolve_plan(load_recipe(args.recipe), args.model, args.method, max_steps=args.max_steps, seed=args.seed)
    final = train(plan, args.out)
    print(f"stapo train: {plan.model_key}/{plan.method_key} done -> {final}")
    return 0
