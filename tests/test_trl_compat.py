"""stapo.train.trl_compat: the installed TRL has every private name the trainer relies on, and the check fails loudly,
naming the TRL version and the changed name, when one goes missing, changes its parameters or is no longer called."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
import torch
import trl
import trl.kernels.chunked_logprob
from trl import GRPOTrainer

from stapo.train import trl_compat


def _raises(*names: str):
    """pytest.raises for check_trl's error: it names the TRL version and each of ``names``."""
    return pytest.raises(RuntimeError, match=rf"(?s)TRL {re.escape(trl.__version__)}: .*" + ".*".join(names))


def test_installed_trl_passes():
    trl_compat.check_trl()


def test_missing_method_is_named(monkeypatch):
    monkeypatch.delattr(GRPOTrainer, "_get_per_token_logps_and_entropies")
    with _raises("GRPOTrainer._get_per_token_logps_and_entropies is missing"):
        trl_compat.check_trl()


def test_override_falling_back_to_the_base_class_is_named(monkeypatch):
    """Without GRPOTrainer's own _prepare_inputs, transformers' (self, inputs) is found: a changed signature."""
    monkeypatch.delattr(GRPOTrainer, "_prepare_inputs")
    with _raises(r"GRPOTrainer\._prepare_inputs\('self', 'inputs'\) no longer has the parameters"):
        trl_compat.check_trl()


def test_changed_parameters_are_named(monkeypatch):
    monkeypatch.setattr(GRPOTrainer, "_compute_loss", lambda self, model, inputs, num_items_in_batch: None)
    monkeypatch.setattr(GRPOTrainer, "_get_per_token_logps_and_entropies",
                        lambda self, model, input_ids, attention_mask, batch_size=None, compute_entropy=False: None)
    with _raises("_compute_loss", "_get_per_token_logps_and_entropies"):
        trl_compat.check_trl()


def test_new_trailing_parameter_of_a_called_method_is_accepted(monkeypatch):
    real = GRPOTrainer._get_per_token_logps_and_entropies

    def extended(self, model, input_ids, attention_mask, logits_to_keep, batch_size=None, compute_entropy=False,
                 compute_aux_loss=False, something_new=None):
        logps, entropies, aux_loss = real(self, model, input_ids, attention_mask, logits_to_keep, batch_size,
                                          compute_entropy)
        return logps, entropies, aux_loss

    monkeypatch.setattr(GRPOTrainer, "_get_per_token_logps_and_entropies", extended)
    trl_compat.check_trl()


def test_override_no_longer_called_is_named(monkeypatch):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        return self._compute_grpo_loss(model, inputs)

    monkeypatch.setattr(GRPOTrainer, "compute_loss", compute_loss)
    with _raises(r"GRPOTrainer\.compute_loss no longer contains `self\._compute_loss\(model, inputs\)`"):
        trl_compat.check_trl()


def test_renamed_rollout_batch_key_is_named(monkeypatch):
    def rollout(self, inputs):
        return {"prompt_ids": 0, "prompt_mask": 0, "completion_ids": 0, "completion_mask": 0, "advantages": 0,
                "num_items": 0, "old_per_token_logps": 0, "ref_per_token_logps": 0}

    monkeypatch.setattr(GRPOTrainer, "_generate_and_score_completions", rollout)
    with _raises("_generate_and_score_completions no longer returns 'num_items_in_batch'"):
        trl_compat.check_trl()


def test_kernel_changes_are_named(monkeypatch):
    kernel = trl.kernels.ChunkedLogProbFunction

    def forward(ctx, hidden, weight, targets, temperature, chunk_size):  # bias dropped
        return None

    monkeypatch.setattr(kernel, "forward", staticmethod(forward))
    with _raises("ChunkedLogProbFunction.forward no longer has the parameters"):
        trl_compat.check_trl()


def test_kernel_output_order_change_is_named(monkeypatch):
    def forward(ctx, hidden, weight, bias, targets, temperature, chunk_size, final_logit_softcapping=None,
                logit_scale=1.0, outputs=()):
        logprobs = entropy = log_sum_sq_probs = None
        return logprobs, log_sum_sq_probs, entropy

    monkeypatch.setattr(trl.kernels.ChunkedLogProbFunction, "forward", staticmethod(forward))
    with _raises("no longer does `return logprobs, entropy, log_sum_sq_probs`"):
        trl_compat.check_trl()


def test_missing_instance_attributes_are_named():
    with _raises(r"self\._metrics", r"self\._buffered_inputs", r"self\._step", r"self\._created_lr_scheduler",
                 r"self\.eos_token_ids", r"self\.use_vllm"):
        trl_compat.check_instance(SimpleNamespace())
    attributes = dict(_metrics={"train": {}}, _buffered_inputs=None, _step=0, _created_lr_scheduler=False,
                      eos_token_ids=[1], use_vllm=True)
    trl_compat.check_instance(SimpleNamespace(**attributes))
    with _raises("_metrics has no 'train' log"):
        trl_compat.check_instance(SimpleNamespace(**{**attributes, "_metrics": {}}))
    with _raises(r"self\.generation_kwargs", r"self\.generation_config"):  # HF generation's stop tokens
        trl_compat.check_instance(SimpleNamespace(**{**attributes, "use_vllm": False}))


def test_step_micro_batches_follow_trl_buffer_indexing():
    """4 micro-batches per optimiser step, 8 buffered (2 steps per rollout): the second step starts at _step 4, 12."""
    buffered = [{"i": i} for i in range(8)]
    trainer = SimpleNamespace(current_gradient_accumulation_steps=4, args=SimpleNamespace(steps_per_generation=8),
                              _buffered_inputs=buffered, _step=0)
    for step, first in ((0, 0), (4, 4), (8, 0), (12, 4)):
        trainer._step = step
        assert [b["i"] for b in trl_compat.step_micro_batches(trainer)] == list(range(first, first + 4))
    trainer._step = 5
    assert trl_compat.step_micro_batches(trainer) is None


def test_log_sum_sq_probs_is_the_kernels_collision_output():
    g = torch.Generator().manual_seed(0)
    hidden, weight, bias = torch.randn(6, 8, generator=g), torch.randn(50, 8, generator=g), torch.randn(50, generator=g)
    targets = torch.randint(0, 50, (6,), generator=g)
    got = trl_compat.log_sum_sq_probs(hidden, weight, bias, targets, 0.7, 16)
    probs = torch.softmax((hidden @ weight.T + bias) / 0.7, -1)
    torch.testing.assert_close(got, probs.pow(2).sum(-1).log(), rtol=1e-5, atol=1e-6)
