"""``stapo train``: the four methods inside TRL's GRPOTrainer, with the paper's recipe, metrics and resume.

The trainer is ``trl.GRPOTrainer`` with one change: the loss is :func:`stapo.losses.policy.policy_loss` for the
configured method, fed with TRL's per-token log-probs and entropies from its one policy forward pass
(``_get_per_token_logps_and_entropies``; no full logits, no second pass). Generation, rewards, advantages
(group-normalised, paper Eq. 1), reference model (GRPO's KL), vLLM and DeepSpeed are TRL's and accelerate's.
TRL's private names the trainer overrides, calls or reads are listed, reached and checked in stapo.train.trl_compat.

The run's configuration is a :class:`stapo.study.Plan` (the study's model entry, method objective and train
section; batch semantics and their TRL mapping in stapo/study/train.py). Which rollout rows a process trains on:
``train.balance_batch`` (default, verl's ``_balance_batch``) gathers the rollout batch and keeps this process's
equal-size Karmarkar–Karp partition by sequence length (:func:`rank_share`); off, the rows it generated itself.
``train.mini_batch``: ``shuffled`` is TRL's completion-level shuffle of that share before it is split into
optimiser steps; ``groups`` turns it off, so the steps are consecutive slices of the share in rollout order, as
verl's ``batch.split(ppo_mini_batch_size)`` (which the population of STAPO's mini-batch quantile depends on); without
balancing they are whole prompt groups. Advantages are computed over the whole rollout batch first, either way.

Micro-batches (``train.micro_batch_tokens``): None is TRL's fixed micro-batch of per_device_train_batch_size
completions. A token budget is verl's ``use_dynamic_bsz``: TRL hands each process its whole optimiser step
(gradient_accumulation_steps 1) and :meth:`StapoGRPOTrainer._compute_loss` splits it into micro-batches of about
the budget (stapo.train.partition: Karmarkar–Karp, the same count on every process), each padded only to its own
longest prompt and completion (stapo.train.layout) or packed padding-free (``train.padding_free``; padded on the
token-diagnostics steps, whose statistics read the padded layout: config.yaml's trl.micro_batches says so),
back-propagating all but the last itself (without DDP's gradient sync) and returning the last one's loss to TRL's
backward. Every normaliser below sees the
same micro-batch weights as under fixed micro-batches: a micro-batch of n of the process's N step completions has
share n / N (÷ gradient_accumulation_steps when n is fixed), verl's ``len(data) / ppo_mini_batch_size``.

Gradient accumulation. How each micro-batch's loss is weighted, which normaliser the window uses and how the
step's gradients are rescaled after its last backward is the method's aggregator's (stapo.losses.aggregation, one per
loss_agg_mode, chosen once with the engine): token-mean is exact (each micro-batch back-propagated as S_j / c,
gradients × c·W / K after the step's last backward; under FSDP, the paper configs' engine as verl's, one scalar
times each rank's shards: tests/test_multiprocess.py checks FSDP2 against one process to 1e-6), except under
DeepSpeed, whose engine steps inside the last backward (a per-micro-batch kept-fraction estimate; a warning says
so); token-mean-per-micro-batch and seq-mean-token-mean weigh each micro-batch by its n / N of the process's step.
With a token budget the micro-batches are verl's own (tests/test_batching.py: equal to a transcription of verl
0.4.0's dynamic-bsz update on the same inputs). The run's config.yaml records the engine and the aggregator
(trl.engine, trl.normaliser).

Step unit (stapo.core.schedule): the recipe's max_steps, warmup_steps and save_steps count verl training steps =
rollout batches (the paper's unit); TRL is configured with k = prompts_per_generation / prompts_per_step ×
num_iterations optimiser steps per rollout step, and the LR schedule advances once per rollout batch, as verl's.
metrics.jsonl keeps one line per optimiser step with both ``step`` (optimiser) and ``rollout_step``.

Entropy thresholds at mini-batch scope (stapo.losses.masks, ``quantile_scope: mini_batch``): the no-grad π_old
forward that TRL runs over each rollout batch also returns entropies (when TRL skips it — one optimiser step per
rollout batch — the trainer runs it); before the first micro-batch of each optimiser step the thresholds are taken
over that step's completions on every rank, and every micro-batch of the step uses them.

Precision: ``bf16`` means bf16 compute (autocast) over fp32 master weights. Without DeepSpeed the model is loaded
in fp32 (AdamW on bf16 weights would round away updates of LR 1e-6); under DeepSpeed ZeRO the engine keeps the
fp32 master copy and the model is loaded in bf16. Under FSDP the fp32 parameters are the sharded master weights and
accelerate's MixedPrecisionPolicy casts them to bf16 for forward and backward; its gradient reduction, bf16 by
default, is set to fp32 (verl's reduce_dtype), so the reduce-scatter does not round the step's gradient to bf16.

Stopping: every end-of-turn token of the tokenizer's chat template (Qwen3-Base: ``<|im_end|>`` besides the EOS
``<|endoftext|>``) ends a rollout, in HF generation and in vLLM, and closes the completion mask.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import warnings
from contextlib import nullcontext
from pathlib import Path

import torch
from trl import GRPOTrainer

from stapo.tasks.problems import training_dataset
from stapo.train.diagnostics import TokenDiagnostics
from stapo.core.errors import UserError
from stapo.train import layout, partition, rundir, trl_compat, trl_config
from stapo.train.metrics import MetricsJsonl, StepAccumulator, accuracy_reward
from stapo.models import end_of_turn_token_ids, resolve_model
from stapo.losses.aggregation import aggregation
from stapo.losses.masks import step_thresholds
from stapo.losses.policy import policy_loss
from stapo.losses.registry import Thresholds
from stapo.tasks.rewards import REWARDS
from stapo.core import leave
from stapo.train.continuation import LeaveAtRolloutBoundary
from stapo.train.rundir import CheckpointSentinel, latest_complete_checkpoint, process_state
from stapo.train.step_cost import StepClock, model_flop_params, update_flops
from stapo.core.schedule import optimizer_steps_per_rollout, per_rollout_schedule, rollout_step
from stapo import study
from stapo.study import ObjectiveConfig, Plan, StudyError, TrainSettings, accumulation

__all__ = ["StapoGRPOTrainer", "rank_share", "build_trainer", "train", "latest_complete_checkpoint", "run"]

log = logging.getLogger("stapo.train.trainer")


# ------------------------------------------------------------------------------------------------- trainer


class StapoGRPOTrainer(GRPOTrainer):
    """GRPOTrainer whose loss is ``stapo.losses.policy.policy_loss(objective, ...)`` (see the module docstring)."""

    def __init__(self, *args, objective: ObjectiveConfig, settings: TrainSettings,
                 diagnostics: TokenDiagnostics | None = None, **kwargs):
        self.objective, self.settings = objective, settings
        trl_compat.check_trl()  # before the model loads
        super().__init__(*args, **kwargs)
        trl_compat.check_instance(self)
        self._diagnostics = diagnostics
        if diagnostics is not None:  # every rank observes (collectives under ZeRO-3); rank 0 writes
            diagnostics.writer = self.accelerator.is_main_process
            diagnostics.steps_per_rollout = optimizer_steps_per_rollout(settings)
            diagnostics.attach(self.accelerator.unwrap_model(self.model))
        self._window: StepAccumulator | None = None  # the optimiser step's sums on this process, while it runs
        self._thresholds: Thresholds | None = None  # this optimiser step's entropy thresholds (mini-batch scope)
        self._capture: list | None = None  # entropies of the π_old forward, while one is being captured
        self._clock = StepClock()  # seconds of the rollout and its no-grad forwards in this optimiser step
        self._flop_shape = model_flop_params(self.accelerator.unwrap_model(self.model))  # before FSDP wraps it
        engine = self.accelerator.distributed_type.value
        self._aggregation = aggregation(objective.loss_agg_mode, deepspeed=engine == "DEEPSPEED")
        if settings.micro_batch_tokens is not None and engine == "DEEPSPEED":
            raise UserError("train.micro_batch_tokens: token-budget micro-batches back-propagate inside one TRL "
                            "step, which DeepSpeed's engine (it steps inside backward) cannot; use FSDP "
                            "(configs/accelerate/fsdp*.yaml) or micro_batch_tokens: null")
        if self._aggregation.estimated and objective.uses_thresholds:
            warnings.warn("DeepSpeed: the kept-token normaliser is estimated per micro-batch (see stapo.train.trainer)")
        if engine == "FSDP":
            _fp32_gradient_reduction(self.accelerator.state.fsdp_plugin)  # before train() wraps the model
        trl_compat.stop_at(self, end_of_turn_token_ids(self.processing_class))  # vLLM: grpo_config's stop ids

    @property
    def _mini_batch_scope(self) -> bool:
        return self.objective.step_thresholds

    def create_scheduler(self, num_training_steps: int, optimizer=None):
        """The recipe's schedule in rollout steps, advanced once per rollout batch (stapo.core.schedule)."""
        if self.lr_scheduler is None:
            from transformers import get_scheduler

            k = optimizer_steps_per_rollout(self.settings)
            scheduler = get_scheduler(self.args.lr_scheduler_type, optimizer=optimizer or self.optimizer,
                                      num_warmup_steps=self.settings.warmup_steps,
                                      num_training_steps=rollout_step(num_training_steps, k),
                                      scheduler_specific_kwargs=self.args.lr_scheduler_kwargs)
            if not hasattr(scheduler, "lr_lambdas"):
                raise ValueError(f"train.lr_scheduler_type: {self.args.lr_scheduler_type!r} is not a per-step "
                                 "schedule (LambdaLR); use constant_with_warmup, constant, linear or cosine")
            self.lr_scheduler = per_rollout_schedule(scheduler, k)
            trl_compat.mark_scheduler_created(self)
        return self.lr_scheduler

    # -- entropy thresholds at mini-batch scope --------------------------------------------------------------

    def _get_per_token_logps_and_entropies(self, model, *args, compute_entropy=False, **kwargs):
        if self.settings.micro_batch_tokens is not None and not torch.is_grad_enabled():
            # TRL chunks its no-grad forwards by per_device_train_batch_size, here a whole step: chunk as configured
            kwargs["batch_size"] = min(kwargs.get("batch_size") or self.settings.per_device_train_batch_size,
                                       self.settings.per_device_train_batch_size)
        with self._clock.timing("forward") if self._clock.in_rollout else nullcontext():  # π_old / reference
            if self._capture is None or model is not self.model:
                return super()._get_per_token_logps_and_entropies(model, *args, compute_entropy=compute_entropy,
                                                                  **kwargs)
            logps, entropies, aux = super()._get_per_token_logps_and_entropies(model, *args, compute_entropy=True,
                                                                               **kwargs)
        self._capture.append(entropies)  # TRL's π_old forward: keep its entropies (no second pass)
        return logps, entropies if compute_entropy else None, aux

    def _generate_and_score_completions(self, inputs):
        """TRL's rollout (timed: stapo.train.step_cost), plus π_old's per-token entropies (and log-probs when TRL did
        not compute them) for the mini-batch thresholds, as ``stat_entropies`` / ``stat_logps``: shuffled and split with
        the batch."""
        if not self.model.training:
            return super()._generate_and_score_completions(inputs)
        with self._clock.timing("rollout"):
            return self._balance_ranks(self._rollout_with_entropies(inputs))

    def _balance_ranks(self, out: dict) -> dict:
        """verl's ``_balance_batch`` (``train.balance_batch``): this process's rows become its equal-size
        Karmarkar–Karp partition of the whole rollout batch (stapo.train.partition.rank_partitions), in rollout order;
        the identity on one process."""
        world = self.accelerator.num_processes
        if not self.settings.balance_batch or world == 1:
            return out
        return rank_share(self._gather_rollout(out), self.accelerator.process_index, world)

    def _gather_rollout(self, out: dict) -> dict:
        """Every process's rollout rows in process order (= the sampler's order), prompts left-padded and per-token
        columns right-padded to the widest process's; other entries (scalars, non-tensors) as this process has them."""
        rows, width = out["completion_ids"].size(0), out["completion_ids"].size(1)
        full = {}
        for key, value in out.items():
            if not isinstance(value, torch.Tensor) or value.dim() == 0 or value.size(0) != rows:
                full[key] = value
                continue
            if value.dim() >= 2 and (key.startswith("prompt_") or value.size(1) == width):
                value = self.accelerator.pad_across_processes(value, dim=1, pad_first=key.startswith("prompt_"))
            full[key] = self.accelerator.gather(value)
        return full

    def _rollout_with_entropies(self, inputs):
        if not self._mini_batch_scope:
            return super()._generate_and_score_completions(inputs)
        self._capture = []
        try:
            out = super()._generate_and_score_completions(inputs)
            captured = self._capture
        finally:
            self._capture = None
        if "old_per_token_logps" in out and captured:
            out["stat_entropies"] = captured[0]
        else:  # aligned case (one optimiser step per rollout batch): TRL skips π_old's forward, which is π_θ
            ids, mask = layout.sequence_inputs(out)
            with torch.no_grad(), self._clock.timing("forward"):
                out["stat_logps"], out["stat_entropies"], _ = super()._get_per_token_logps_and_entropies(
                    self.model, ids, mask, out["completion_ids"].size(1),
                    batch_size=self.args.per_device_train_batch_size, compute_entropy=True)
        return out

    def _prepare_inputs(self, generation_batch):
        in_order = self.settings.mini_batch.rollout_order and self.model.training
        with trl_compat.unshuffled() if in_order else nullcontext():  # whole groups, in rollout order (verl)
            inputs = super()._prepare_inputs(generation_batch)
        step = trl_compat.step_micro_batches(self) if self.model.training and self._mini_batch_scope else None
        if step is not None:  # the first micro-batch of a new optimiser step
            cat = lambda key: torch.cat([b[key] for b in step])  # noqa: E731
            self._thresholds = step_thresholds(
                self.objective, logps=cat("old_per_token_logps" if "stat_logps" not in step[0] else "stat_logps"),
                entropies=cat("stat_entropies"), advantages=cat("advantages"), completion_mask=cat("completion_mask"))
        return inputs

    # -- loss ------------------------------------------------------------------------------------------------

    def _compute_loss(self, model, inputs):
        """The loss of TRL's micro-batch; with a token budget, TRL's micro-batch is the process's whole optimiser
        step: all its token-budget micro-batches but the last are back-propagated here, the last one's loss is
        returned for TRL's backward (module docstring)."""
        if self.settings.micro_batch_tokens is None or not self.model.training:
            return self._micro_batch_loss(model, inputs)
        lengths, budget = layout.sequence_lengths(inputs), self.settings.micro_batch_tokens
        count = self._largest_over_processes(partition.micro_batch_count(lengths, budget))
        for j, rows in enumerate(parts := partition.token_budget_partitions(lengths, budget, count)):
            loss = self._micro_batch_loss(model, layout.select_rows(inputs, rows))
            if j == len(parts) - 1:
                return loss
            with self._no_gradient_sync(model):
                self.accelerator.backward(loss)

    def _largest_over_processes(self, count: int) -> int:
        """The largest of every process's micro-batch count, which all use (verl's same_micro_num_in_dp)."""
        if self.accelerator.num_processes == 1:
            return count
        return int(self.accelerator.gather(torch.tensor([count], device=self.accelerator.device)).max())

    def _no_gradient_sync(self, model):
        """DDP: no all-reduce until the step's last micro-batch (as TRL's accumulation); FSDP reduce-scatters
        each backward into the sharded gradients, which sum exactly."""
        ddp = self.accelerator.distributed_type.value in ("MULTI_GPU", "MULTI_CPU", "MULTI_XPU", "MULTI_NPU")
        return self.accelerator.no_sync(model) if ddp else nullcontext()

    def _forward(self, model, inputs):
        """π_θ's per-token log-probs and entropies [B, T] of a micro-batch (TRL's forward, or packed)."""
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        observed = self._diagnostics is not None and self._diagnostics.active  # it reads the padded layout
        if self.settings.padding_free and self.settings.micro_batch_tokens is not None and not observed:
            packed = layout.pack(inputs["prompt_ids"], inputs["prompt_mask"], completion_ids, completion_mask)
            with self.accelerator.autocast():
                out = trl_compat.fused_forward(model, packed.input_ids, packed.position_ids, packed.labels)
            shifted = [(start - 1, n) for start, n in packed.spans]  # the head scores token t + 1 at position t
            width = completion_ids.size(1)
            return layout.unpack(out.log_probs, shifted, width), layout.unpack(out.entropy, shifted, width)
        input_ids, attention_mask = layout.sequence_inputs(inputs)
        logps, entropies, _ = self._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, completion_ids.size(1), compute_entropy=True
        )
        return logps, entropies

    def _micro_batch_loss(self, model, inputs):
        completion_mask = inputs["completion_mask"]
        attention_mask = layout.attention_mask(inputs)
        logps, entropies = self._forward(model, inputs)
        old_logps = inputs.get("old_per_token_logps")
        training = self.model.training
        if training and self._window is None:  # the optimiser step's first micro-batch
            self._window = StepAccumulator(normaliser=self._aggregation.provisional(self._window_tokens(inputs)))
        tokens: dict = {}  # the objective's candidates, for the diagnostics (τ_p tested once per micro-batch)
        loss, metrics = policy_loss(
            self.objective, logps=logps, old_logps=logps.detach() if old_logps is None else old_logps,
            advantages=inputs["advantages"], entropies=entropies, completion_mask=completion_mask,
            ref_logps=inputs.get("ref_per_token_logps") if self.beta != 0.0 else None,
            token_normalizer=self._window.normaliser if training else None,
            thresholds=self._thresholds if training and self._mini_batch_scope else None, tokens=tokens,
        )
        if training and self._diagnostics is not None:  # after the objective, whose candidates it reuses
            self._diagnostics.tau_h = self._thresholds.tau_h if self._thresholds and self._mini_batch_scope else None
            self._diagnostics.observe(model=self.accelerator.unwrap_model(model), inputs=inputs, logps=logps,
                                      old_logps=logps.detach() if old_logps is None else old_logps,
                                      entropies=entropies, candidates=tokens["candidates"])
        if training:  # its weight in the step (stapo.losses.aggregation)
            loss = self._aggregation.weight(loss, share=completion_mask.size(0) / self._step_completions,
                                            kept_and_tokens=lambda: self._kept_and_tokens(metrics, completion_mask))
        if training:
            self._window.add(metrics, completion_mask, loss.detach(), attention_mask)
        return loss

    @property
    def _step_completions(self) -> int:
        """N: completions of one optimiser step on this process."""
        s = self.settings
        return s.prompts_per_step * s.num_generations // self.accelerator.num_processes

    def _window_tokens(self, inputs) -> torch.Tensor:
        """The window's completion tokens per process: TRL's dapo normaliser, the provisional normaliser's base."""
        n = inputs["num_items_in_batch"].float().clamp(min=1.0) / self.accelerator.num_processes
        return n * self.current_gradient_accumulation_steps / self.args.steps_per_generation

    def _kept_and_tokens(self, metrics, completion_mask) -> torch.Tensor:
        """This micro-batch's kept and completion tokens, summed over every rank (a collective)."""
        m = completion_mask.sum().float()
        return self.accelerator.reduce(torch.stack([m * metrics["kept_fraction"], m]), reduction="sum")

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
        w, self._window = self._window.reduced(self.accelerator), None  # Σ over ranks and micro-batches
        for key, value in w.means().items():
            trl_compat.log_metric(self, key, value)
        trl_compat.log_metric(self, "completion_tokens", float(w.tokens))  # the fractions' denominator: counts
        objective_loss, factor = self._aggregation.close(w.loss, w.normaliser, w.kept, self.accelerator.num_processes)
        if factor is not None:  # each micro-batch back-propagated S_j / c: the gradients need × c·W / K
            for p in model.parameters():
                if p.grad is not None:
                    p.grad.mul_(factor)
        if not math.isfinite(objective_loss):  # before the optimiser step: no NaN reaches the weights
            raise rundir.NonFiniteTraining(f"step {self.state.global_step + 1}: the loss is {objective_loss} "
                                    f"(train.learning_rate {self.args.learning_rate:g}); nothing of this step "
                                    "was applied or saved")
        trl_compat.log_metric(self, "objective_loss", objective_loss)
        self._log_step_cost(w)
        if self._diagnostics is not None:
            self._diagnostics.end_step(self.state.global_step + 1)  # global_step advances after this step


    def _log_step_cost(self, w: StepAccumulator) -> None:
        """The step's rollout and forward seconds, tokens and the update's model FLOPs (stapo.train.step_cost)."""
        gen, forward = self._clock.take()
        tokens, tokens_sq = (float(v) for v in w.sequences)
        for key, value in (("gen_seconds", gen), ("forward_seconds", forward), ("step_tokens", tokens),
                           ("step_flops", update_flops(self._flop_shape, tokens, tokens_sq))):
            trl_compat.log_metric(self, key, value)


def rank_share(full: dict, rank: int, world: int) -> dict:
    """Process ``rank``'s rows of the gathered rollout batch ``full`` under verl's ``_balance_batch``: the rank-th
    equal-size partition of its sequence lengths (verl: ``attention_mask.sum(-1)``), indices ascending, each tensor
    trimmed to the share's own padding (stapo.train.layout.select_rows)."""
    rows = partition.rank_partitions(layout.sequence_lengths(full), world)[rank]
    return layout.select_rows(full, rows)


def _fp32_gradient_reduction(plugin) -> None:
    """FSDP bf16: reduce gradients in fp32 (accelerate's policy reduces in its param dtype, bf16; verl: fp32)."""
    policy = plugin.mixed_precision_policy
    if policy is not None and policy.reduce_dtype not in (None, torch.float32):
        from dataclasses import replace

        plugin.mixed_precision_policy = replace(policy, reduce_dtype=torch.float32)


# --------------------------------------------------------------------------------------------------- build





def build_trainer(plan: Plan, out: Path, *, plain: bool = False, callbacks=(), **config_overrides):
    """The StapoGRPOTrainer for ``plan`` (or, ``plain=True``, a stock GRPOTrainer with loss_type="dapo")."""
    from transformers import AutoTokenizer

    model_dir = resolve_model(plan.model_spec)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    state = process_state()
    stop_ids = end_of_turn_token_ids(tokenizer)
    config = trl_config.grpo_config(plan, out, state.num_processes,
                                    deepspeed=trl_config.training_engine() == "deepspeed", stop_token_ids=stop_ids,
                                    **config_overrides)
    s = plan.settings
    kwargs = dict(model=model_dir, reward_funcs=[accuracy_reward(REWARDS[s.reward])], args=config,
                  train_dataset=training_dataset(s.dataset, tokenizer, s.max_prompt_length, prompt=s.prompt,
                                                 example=s.worked_example),
                  processing_class=tokenizer, callbacks=list(callbacks))
    if plain:
        return GRPOTrainer(**kwargs)
    diagnostics = None
    if s.diagnostics_every > 0:
        diagnostics = TokenDiagnostics(out, every=s.diagnostics_every, objective=plan.objective, tokenizer=tokenizer,
                                       temperature=s.temperature, k=s.diagnostics_examples)
    return StapoGRPOTrainer(objective=plan.objective, settings=s, diagnostics=diagnostics, **kwargs)




def train(plan: Plan, out: str | os.PathLike, *, restart: bool = False) -> Path:
    """Run (or resume) one training run into ``out``; returns ``out/final``.

    The run directory's rules (stapo.train.rundir): the config it was started with is recorded and a rerun with another
    one refuses (``restart``: move the old run aside); the resume checkpoint is the newest intact one; one already
    at max_steps only writes final/; final/ counts only once it verifies.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    with rundir.run_lock(out):  # one writer per run directory (rank 0 holds it)
        return _train(plan, out, restart)


def _train(plan: Plan, out: Path, restart: bool) -> Path:
    state = process_state()
    engine = trl_config.training_engine()
    config = trl_config.grpo_config(plan, out, state.num_processes, deepspeed=engine == "deepspeed")
    rundir.claim(out, trl_config.resolved_config(plan, config, engine), restart=restart)  # before any model loads
    if rundir.verify_final(out, config.max_steps):
        log.warning("%s/final exists: the run is complete, nothing to do", out)
        return out / "final"
    resume = rundir.prepare_resume(out)
    if resume is not None and rundir.checkpoint_step(resume) >= config.max_steps:
        return rundir.finalize_from_checkpoint(resume, out)
    k = optimizer_steps_per_rollout(plan.settings)
    leave.record()  # `stapo train` recorded from its start (stapo.cli); a direct call of train() from here on
    leaving = LeaveAtRolloutBoundary(k)
    snapshots = rundir.Snapshots(plan.settings, k)
    callbacks = [rundir.FiniteWeights(plan.settings), MetricsJsonl(out / "metrics.jsonl", k),
                 CheckpointSentinel(keep=plan.settings.save_total_limit), snapshots, leaving]
    trainer = build_trainer(plan, out, callbacks=callbacks)
    snapshots.trainer = trainer
    if trainer.accelerator.num_processes > 1:
        leaving.reduce_max = trainer._largest_over_processes
    try:
        with rundir.disk_full_is_one_line(out):
            trainer.train(resume_from_checkpoint=str(resume) if resume else None)
            if leaving.left_at is not None:
                return rundir.leave_to_continue(out, leaving.left_at, leaving.received, config.max_steps)
            return rundir.save_final(trainer, out)
    finally:
        leave.restore()


# ------------------------------------------------------------------------------------------------------ CLI


def run(args: argparse.Namespace) -> int:
    """``stapo train`` (arguments: stapo.cli.train_arguments; the CLI has validated them and locked ``--out``)."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    recipe = study.read(args.recipe, required=study.TRAIN_SECTIONS, check_runs=False)
    plan = recipe.plan(args.model, args.method, max_steps=args.max_steps, seed=args.seed)
    try:
        accumulation(plan.settings, process_state().num_processes)
    except ValueError as err:
        raise StudyError(f"{args.recipe}: {err}") from err
    final = train(plan, args.out, restart=args.restart)
    print(f"stapo train: {plan.model_key}/{plan.method_key} done -> {final}")
    return 0
