"""The one place that touches TRL's (and the transformers Trainer's) private API, and the check that it is still there.

StapoGRPOTrainer overrides GRPOTrainer methods that TRL calls, calls others, reads and writes attributes set in
its ``__init__``, and stapo.train.diagnostics runs TRL's chunked log-prob kernel. None of this is public API: a TRL
release may rename it, change its parameters or stop calling it, and the trainer would then silently train with
TRL's own loss, or fail deep inside a run. The rule: every such name is listed here; the trainer reaches the
attributes and the kernel only through the accessors below; :func:`check_trl` (called before the model loads)
and :func:`check_instance` (right after TRL's ``__init__``) compare the installed TRL with these expectations and
raise a RuntimeError naming the TRL version and every changed name.

- OVERRIDDEN: methods TRL calls on the trainer with its own arguments, so their parameters must match exactly.
- CALLED: methods and functions the trainer calls; their leading parameters must match (new trailing optional
  parameters are harmless).
- CALL_SITES: TRL code that must still call an override, index the rollout buffer or return what the trainer
  assumes. BATCH_KEYS: the rollout batch's keys the trainer reads.
- ATTRIBUTES: instance attributes of TRL's GRPOTrainer / transformers' Trainer the trainer reads or writes.
"""

from __future__ import annotations

import inspect
from contextlib import contextmanager

__all__ = ["TESTED_TRL", "check_trl", "check_instance", "log_metric", "step_micro_batches", "stop_at", "unshuffled",
           "fused_forward",
           "mark_scheduler_created", "gathered_lm_head", "log_sum_sq_probs"]

TESTED_TRL = "1.16"

OVERRIDDEN = {
    "_compute_loss": ("self", "model", "inputs"),
    "_generate_and_score_completions": ("self", "inputs"),
    "_prepare_inputs": ("self", "generation_batch"),
    "training_step": ("self", "model", "inputs", "num_items_in_batch"),
    "create_scheduler": ("self", "num_training_steps", "optimizer"),
}
CALLED = {
    "_get_per_token_logps_and_entropies": ("self", "model", "input_ids", "attention_mask", "logits_to_keep",
                                           "batch_size", "compute_entropy"),
}
CALL_SITES = (
    ("compute_loss", "self._compute_loss(model, inputs)"),
    ("_prepare_inputs", "self._generate_and_score_completions(generation_batch)"),
    ("_prepare_inputs", "self._buffered_inputs[self._step % self.args.steps_per_generation]"),
    ("_prepare_inputs", "shuffle_sequence_dict(generation_batch)"),  # unshuffled() replaces it
    ("training_step", "self._step += 1"),
    ("_get_per_token_logps_and_entropies", "return logps, entropies, aux_loss"),
)
BATCH_KEYS = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "advantages", "num_items_in_batch",
              "old_per_token_logps", "ref_per_token_logps")
ATTRIBUTES = ("_metrics", "_buffered_inputs", "_step", "_created_lr_scheduler", "eos_token_ids", "use_vllm")
HF_GENERATION_ATTRIBUTES = ("generation_kwargs", "generation_config")  # without vLLM
KERNEL_PARAMETERS = ("ctx", "hidden", "weight", "bias", "targets", "temperature", "chunk_size",
                     "final_logit_softcapping", "logit_scale", "outputs")
FUSED_HEAD = "def _fused_forward(\n        self, *args, fused_lm_head=False, labels=None"  # position_ids pass in kwargs
KERNEL_RETURN = "return logprobs, entropy, log_sum_sq_probs"  # log Σπ² is output 2 (stapo.train.diagnostics)


def _parameters(fn) -> tuple[str, ...]:
    return tuple(inspect.signature(fn).parameters)


def _source(fn) -> str:
    try:
        return inspect.getsource(fn)
    except (OSError, TypeError):
        return ""


def _problems(grpo, kernel, gather) -> list[str]:
    problems = []
    for name, expected in {**OVERRIDDEN, **CALLED}.items():
        fn = getattr(grpo, name, None)
        if not callable(fn):
            problems.append(f"GRPOTrainer.{name} is missing")
            continue
        got = _parameters(fn)
        if (got if name in OVERRIDDEN else got[: len(expected)]) != expected:
            problems.append(f"GRPOTrainer.{name}{got} no longer has the parameters {expected}")
    for name, snippet in CALL_SITES:
        if snippet not in _source(getattr(grpo, name, None)):
            problems.append(f"GRPOTrainer.{name} no longer contains `{snippet}`")
    rollout = _source(getattr(grpo, "_generate_and_score_completions", None))
    problems += [f"GRPOTrainer._generate_and_score_completions no longer returns {key!r}"
                 for key in BATCH_KEYS if f'"{key}"' not in rollout]
    forward = getattr(kernel, "forward", None)
    if forward is None or _parameters(forward)[: len(KERNEL_PARAMETERS)] != KERNEL_PARAMETERS:
        problems.append(f"trl.kernels.ChunkedLogProbFunction.forward no longer has the parameters {KERNEL_PARAMETERS}")
    elif KERNEL_RETURN not in _source(forward):
        problems.append(f"trl.kernels.ChunkedLogProbFunction.forward no longer does `{KERNEL_RETURN}`")
    if gather is None or [p.kind for p in inspect.signature(gather).parameters.values()] != [
            inspect.Parameter.VAR_POSITIONAL]:
        problems.append("trl.trainer.utils.maybe_gather_lm_head_ctx(*params) is missing or changed")
    return problems


def _fail(problems: list[str]) -> None:
    if problems:
        import trl

        raise RuntimeError(f"TRL {trl.__version__}: its private API that stapo.train.trainer relies on changed "
                           f"(stapo is written against TRL {TESTED_TRL}; see stapo/train/trl_compat.py):\n  - "
                           + "\n  - ".join(problems))


def check_trl() -> None:
    """Raise a RuntimeError naming every OVERRIDDEN/CALLED/CALL_SITES/kernel expectation the installed TRL breaks."""
    import trl
    import trl.kernels
    import trl.trainer.utils

    problems = _problems(trl.GRPOTrainer, getattr(trl.kernels, "ChunkedLogProbFunction", None),
                         getattr(trl.trainer.utils, "maybe_gather_lm_head_ctx", None))
    if FUSED_HEAD not in _source(getattr(trl.trainer.utils, "add_fused_lm_head", None)):  # fused_forward's packed call
        problems.append(f"trl.trainer.utils.add_fused_lm_head no longer defines `{FUSED_HEAD}`")
    _fail(problems)


def check_instance(trainer) -> None:
    """Raise a RuntimeError if TRL's ``__init__`` no longer sets the ATTRIBUTES (``_metrics`` with a train log)."""
    names = ATTRIBUTES + (HF_GENERATION_ATTRIBUTES if not getattr(trainer, "use_vllm", True) else ())
    problems = [f"GRPOTrainer.__init__ no longer sets self.{name}" for name in names if not hasattr(trainer, name)]
    if hasattr(trainer, "_metrics") and "train" not in trainer._metrics:
        problems.append("GRPOTrainer._metrics has no 'train' log")
    _fail(problems)


# ------------------------------------------------------------------------------------------------ accessors


def log_metric(trainer, key: str, value: float) -> None:
    """Add one value to TRL's per-step training log (TRL averages each key's values over the logging step)."""
    trainer._metrics["train"][key].append(value)


def step_micro_batches(trainer) -> list[dict] | None:
    """In ``_prepare_inputs``: this process's micro-batches of the optimiser step that starts now (from TRL's
    buffered rollout batch), or None when the micro-batch being prepared is not the step's first."""
    accumulation = trainer.current_gradient_accumulation_steps
    if trainer._step % accumulation:
        return None
    first = trainer._step % trainer.args.steps_per_generation
    return trainer._buffered_inputs[first : first + accumulation]


def stop_at(trainer, token_ids: list[int]) -> None:
    """Also end HF-generated rollouts, and close TRL's completion mask, at each of ``token_ids``."""
    trainer.eos_token_ids = list(dict.fromkeys([*trainer.eos_token_ids, *token_ids]))
    if not trainer.use_vllm:
        trainer.generation_kwargs["eos_token_id"] = trainer.eos_token_ids
        trainer.generation_config.eos_token_id = trainer.eos_token_ids


@contextmanager
def unshuffled():
    """Within it, TRL's ``_prepare_inputs`` splits the rollout batch in the order it was generated (its module's
    ``shuffle_sequence_dict`` is the identity): whole prompt groups per optimiser step, as verl."""
    import trl.trainer.grpo_trainer as grpo

    shuffle = grpo.shuffle_sequence_dict
    grpo.shuffle_sequence_dict = lambda batch: batch
    try:
        yield
    finally:
        grpo.shuffle_sequence_dict = shuffle


def fused_forward(model, input_ids, position_ids, labels):
    """TRL's patched forward with its fused LM head (``add_fused_lm_head``: ``log_probs`` and ``entropy`` [B, L - 1]
    of token t + 1 at position t, where ``labels`` is not -100) on a packed row: no attention mask, position ids
    restarting at every sequence (transformers masks attention to each sequence)."""
    return model(input_ids=input_ids, position_ids=position_ids, labels=labels, fused_lm_head=True)


def mark_scheduler_created(trainer) -> None:
    """Tell the transformers Trainer it created ``lr_scheduler`` itself (so a later ``train()`` rebuilds it)."""
    trainer._created_lr_scheduler = True


def gathered_lm_head(head):
    """Context in which the LM head's weight and bias are whole (a collective under ZeRO-3: every rank enters)."""
    from trl.trainer.utils import maybe_gather_lm_head_ctx

    return maybe_gather_lm_head_ctx(head.weight, head.bias)


def log_sum_sq_probs(hidden, weight, bias, targets, temperature: float, chunk_size: int):
    """log Σ_v π(v)² per row of ``hidden`` [N, H], π = softmax((hidden·weightᵀ + bias) / temperature), without
    materialising the [N, V] logits (TRL's chunked kernel; ``targets`` [N] only feed its unused log-probs)."""
    from trl.kernels import ChunkedLogProbFunction

    out = ChunkedLogProbFunction.apply(hidden, weight, bias, targets, temperature, chunk_size, None, 1.0,
                                       ("log_sum_sq_probs",))
    return out[2]
