"""The TRL configuration of one run: ``trl.GRPOConfig`` from a :class:`stapo.study.Plan` (batch semantics in
stapo/study/train.py, the step unit in stapo.core.schedule, precision in stapo.train.trainer), the training engine of
this launch, and what the run directory records as the run's config (config.yaml)."""

from __future__ import annotations

import os
from dataclasses import asdict
from pathlib import Path

import torch
from trl import GRPOConfig

from stapo.core.fields import plain
from stapo.core.schedule import optimizer_steps_per_rollout
from stapo.losses.aggregation import aggregation
from stapo.study import Plan, TrainSettings, accumulation
from stapo.study.train import trl_micro_batch
from stapo.train.rundir import process_state
from stapo.vllm_settings import trl_vllm_kwargs

__all__ = ["training_engine", "grpo_config", "micro_batches", "resolved_config"]


def training_engine() -> str:
    """This launch's engine: ``deepspeed``, ``fsdp``, ``ddp`` or ``single``, known before the Accelerator exists
    (accelerate turns a launch into FSDP from ACCELERATE_USE_FSDP only when it builds the Accelerator)."""
    state = process_state()
    if state.distributed_type.value == "DEEPSPEED":
        return "deepspeed"
    if state.distributed_type.value == "FSDP" or os.environ.get("ACCELERATE_USE_FSDP", "").lower() == "true":
        return "fsdp"
    return "ddp" if state.num_processes > 1 else "single"


# transformers 5.x renamed gradient_checkpointing (deprecated alias kept until v6)
_CHECKPOINTING_FIELD = ("activation_checkpointing" if "activation_checkpointing" in GRPOConfig.__dataclass_fields__
                        else "gradient_checkpointing")


def grpo_config(plan: Plan, out: Path, num_processes: int = 1, *, deepspeed: bool = False,
                stop_token_ids: list[int] | None = None, **overrides) -> GRPOConfig:
    """Map the recipe onto ``trl.GRPOConfig`` (module docstring: batch semantics, step unit, precision).

    deepspeed: the run uses a DeepSpeed ZeRO engine (it keeps fp32 master weights, so the model loads in bf16).
    stop_token_ids: end-of-turn token ids that also end a vLLM rollout (HF generation: StapoGRPOTrainer).
    """
    s, obj = plan.settings, plan.objective
    grad_accum, steps_per_generation = accumulation(s, num_processes)
    k = optimizer_steps_per_rollout(s)  # TRL counts optimiser steps; the recipe counts rollout steps
    load_bf16 = s.bf16 and deepspeed
    kwargs = dict(
        output_dir=str(out), max_steps=s.max_steps * k, save_strategy="steps", save_steps=s.save_steps * k,
        save_total_limit=None, logging_steps=1,  # rotation: rundir.CheckpointSentinel
        report_to=s.report_to,
        run_name=f"{plan.model_key}/{plan.method_key}/seed{s.seed}", seed=s.seed, data_seed=s.seed,
        learning_rate=s.learning_rate, lr_scheduler_type=s.lr_scheduler_type, warmup_steps=s.warmup_steps * k,
        weight_decay=s.weight_decay, max_grad_norm=s.max_grad_norm, optim="adamw_torch",
        per_device_train_batch_size=trl_micro_batch(s, num_processes), gradient_accumulation_steps=grad_accum,
        steps_per_generation=steps_per_generation, num_generations=s.num_generations,
        num_iterations=s.num_iterations, max_completion_length=s.max_completion_length,
        temperature=s.temperature, top_p=s.top_p, scale_rewards=s.scale_rewards,
        loss_type=obj.loss_agg_mode.trl_loss_type, beta=obj.kl_beta,  # plain TRL runs and logs read it
        use_bias_correction_kl=False,  # plain k3, as policy_loss computes it
        epsilon=obj.eps_low, epsilon_high=obj.eps_high, mask_truncated_completions=False,
        **trl_vllm_kwargs(s),  # device-aware engine settings + recipe overrides; fails fast without vLLM
        vllm_importance_sampling_correction=False,  # policy_loss has no TIS term (JustRL's verl 0.4 has none)
        bf16=s.bf16, **{_CHECKPOINTING_FIELD: s.gradient_checkpointing},
        use_cpu=not torch.cuda.is_available(), dataloader_num_workers=0,
        model_init_kwargs={"dtype": torch.bfloat16 if load_bf16 else torch.float32},
    )
    kwargs.update(overrides)
    if kwargs["use_vllm"] and stop_token_ids:
        kwargs["generation_kwargs"] = {"stop_token_ids": list(stop_token_ids),
                                       **(kwargs.get("generation_kwargs") or {})}
    return GRPOConfig(**kwargs)


def micro_batches(s: TrainSettings) -> str:
    """How the run's micro-batches are formed, as config.yaml records it: fixed (TRL's), or a token budget, padded
    or packed; packed runs pad the steps that log token diagnostics (stapo.train.trainer), and say so."""
    if s.micro_batch_tokens is None:
        return "fixed"
    if not s.padding_free:
        return "token_budget_padded"
    return "token_budget_packed" + (f", padded on the diagnostics steps (every {s.diagnostics_every})"
                                    if s.diagnostics_every > 0 else "")


def resolved_config(plan: Plan, config: GRPOConfig, engine: str = "single") -> dict:
    """What the run directory records as the run's config (config.yaml): the plan and its TRL mapping."""
    normaliser = aggregation(plan.objective.loss_agg_mode, deepspeed=engine == "deepspeed").name
    return {
        "model": {"key": plan.model_key, "spec": plan.model_spec},
        "method": {"key": plan.method_key, **plan.objective.as_dict()},
        "train": plain(asdict(plan.settings)),
        "trl": {"optimizer_steps_per_rollout": optimizer_steps_per_rollout(plan.settings),
                "max_steps": config.max_steps, "save_steps": config.save_steps,
                "gradient_accumulation_steps": config.gradient_accumulation_steps,
                "steps_per_generation": config.steps_per_generation,
                "generation_batch_size": config.generation_batch_size,
                "per_device_train_batch_size": config.per_device_train_batch_size,
                "num_processes": config.world_size, "loss_type": config.loss_type, "beta": config.beta,
                "model_dtype": str(config.model_init_kwargs["dtype"]).removeprefix("torch."), "bf16": config.bf16,
                "engine": engine, "normaliser": normaliser,  # the report footnotes estimated normalisers
                "micro_batches": micro_batches(plan.settings)},
    }
