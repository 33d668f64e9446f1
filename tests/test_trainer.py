"""stapo train: recipe validation, the TRL mapping, the exact kept-token normaliser, runs of all four methods on
bundled:tiny-qwen3 (CPU), checkpoints/final layout, and kill-and-resume equality."""

from __future__ import annotations

import json
import re
import os
import zlib
from pathlib import Path

import pytest
import torch
import yaml


from safetensors.torch import load_file

import stapo.train.trainer as T
from stapo.core.errors import UserError
from stapo.losses.aggregation import aggregation
from stapo.study.train import trl_micro_batch
from stapo.train import layout, trl_config
from stapo.study.methods import METHODS as DECLARED_METHODS
from stapo.train import rundir
from stapo import study
from stapo.losses.policy import policy_loss
from stapo.tasks.rewards import REWARDS

from helpers.shared import build_once

ROOT = Path(__file__).resolve().parents[1]
FIELDS = ("step", "loss", "reward_mean", "accuracy", "entropy_mean", "silenced_fraction", "candidate_fraction",
          "kept_fraction", "clip_fraction", "grad_norm", "response_length_mean", "lr", "step_seconds",
          "completion_tokens")


def coin_reward(prompts=None, completions=None, **kwargs):
    """Deterministic ±1 that varies across a random model's completions (so advantages are non-zero)."""
    return [1.0 if zlib.crc32(c.encode()) % 2 else -1.0 for c in completions]


@pytest.fixture(autouse=True)
def coin(monkeypatch):
    monkeypatch.setitem(REWARDS, "coin", coin_reward)


def tiny_recipe(**train) -> dict:
    """configs/tiny.yaml scaled down to seconds per step on bundled:tiny-qwen3."""
    recipe = study.load(ROOT / "configs" / "tiny.yaml")
    recipe["train"].update(
        dataset={"name": "synthetic-arith", "n": 16, "difficulty": 1, "seed": 0}, reward="coin", max_steps=2,
        save_steps=1, learning_rate=1e-3, warmup_steps=0, prompts_per_generation=2, num_generations=4,
        prompts_per_step=2, per_device_train_batch_size=4, max_completion_length=8,
    )
    recipe["train"].update(train)
    return recipe


def read_metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def weights(path: Path) -> dict[str, torch.Tensor]:
    return load_file(str(path / "model.safetensors"))


# ------------------------------------------------------------------------------------------ validation (fast)


@pytest.mark.parametrize(
    "edit, key",
    [
        (lambda r: r["methods"].update(bogus={"objective": "ppo"}), "methods.bogus"),
        (lambda r: r["methods"]["stapo"].update(tau_p=1.5), "tau_p"),
        (lambda r: r["methods"]["stapo"].update(entropy_quantile=0.0), "entropy_quantile"),
        (lambda r: r["methods"]["stapo"].update(tau=0.1), "methods.stapo"),
        (lambda r: r["train"].update(dataset={"path": "/nonexistent/train.jsonl"}), "train.dataset.path"),
        (lambda r: r["train"].update(per_device_train_batch_size=0), "train.per_device_train_batch_size"),
        (lambda r: r["train"].update(num_generations=-2), "train.num_generations"),
        (lambda r: r["train"].update(learning_rat=1e-6), "learning_rat"),
        (lambda r: r["train"].update(reward="exact"), "train.reward"),
        (lambda r: r["train"].update(prompts_per_generation=6, prompts_per_step=4), "train.prompts_per_generation"),
        (lambda r: r["train"].update(report_to="tensorbord"), "train.report_to"),
        (lambda r: r["train"].update(report_to=["none", "wandb"]), "train.report_to"),
    ],
)
def test_recipe_errors_name_the_key(edit, key):
    recipe = tiny_recipe()
    edit(recipe)
    method = "bogus" if "bogus" in recipe["methods"] else "stapo"
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        study.resolve_plan(recipe, "tiny-qwen3", method)


def test_unknown_method_and_model_keys():
    recipe = tiny_recipe()
    with pytest.raises(study.StudyError, match="methods: no 'ppo'; the study defines"):
        study.resolve_plan(recipe, "tiny-qwen3", "ppo")
    with pytest.raises(study.StudyError, match="models: no 'gpt2'; the study defines"):
        study.resolve_plan(recipe, "gpt2", "stapo")


def test_paper_recipe_maps_to_trl_batches():
    recipe = study.load(ROOT / "configs" / "paper.yaml")
    assert set(recipe) >= {"study", "models", "methods", "train", "eval", "workflow"}
    for model in recipe["models"]:
        for method in recipe["methods"]:
            study.resolve_plan(recipe, model, method)
    plan = study.resolve_plan(recipe, "qwen3-8b-base", "stapo")
    # 64 prompts x 8 rollouts per optimiser step over 8 GPUs: TRL hands each its 64 completions of the step at
    # once (token-budget micro-batches, JustRL's 32,768 tokens, packed); 4 optimiser steps per rollout batch
    assert study.accumulation(plan.settings, 8) == (1, 4)
    assert trl_micro_batch(plan.settings, 8) == 64 and trl_micro_batch(plan.settings, 64) == 8
    assert (plan.settings.micro_batch_tokens, plan.settings.padding_free, plan.settings.mini_batch) == (32768, True,
                                                                                                       "groups")
    e20 = study.resolve_plan(recipe, "qwen3-8b-base", "entropy20").settings  # the 80/20 release's own recipe
    assert (e20.prompts_per_generation, e20.num_generations, e20.prompts_per_step, e20.max_completion_length,
            e20.micro_batch_tokens) == (512, 16, 32, 20480, 22528)
    assert study.accumulation(e20, 64) == (1, 16) and trl_micro_batch(e20, 64) == 8
    assert (plan.objective.tau_p, plan.objective.entropy_quantile) == (0.002, 0.75)
    s = plan.settings
    assert (s.learning_rate, s.warmup_steps, s.weight_decay, s.max_grad_norm) == (1e-6, 10, 0.1, 1.0)
    assert (s.max_prompt_length, s.max_completion_length, s.use_vllm, s.vllm_mode) == (1024, 15360, True, "colocate")
    grpo = study.resolve_plan(recipe, "qwen3-1.7b-base", "grpo").objective
    assert (grpo.kl_beta, grpo.eps_high) == (0.04, 0.2)
    assert study.resolve_plan(recipe, "qwen3-1.7b-base", "justrl").objective.kl_beta == 0.0
    assert study.resolve_plan(recipe, "qwen3-14b-base", "stapo").settings.vllm_gpu_memory_utilization == 0.45


def test_paper_recipe_counts_rollout_steps(tmp_path):
    """The recipe's steps are verl steps (rollout batches of 256 prompts, 4 optimiser updates each)."""
    paper = study.load(ROOT / "configs" / "paper.yaml")
    paper["train"]["use_vllm"] = False  # no vLLM on this machine: the GPU engine settings are not the point here
    plan = study.resolve_plan(paper, "qwen3-8b-base", "stapo")
    assert (plan.settings.max_steps, plan.settings.save_steps, plan.settings.warmup_steps) == (3000, 20, 10)
    cfg = trl_config.grpo_config(plan, tmp_path, 8)
    assert (cfg.max_steps, cfg.save_steps, cfg.warmup_steps) == (12000, 80, 40)  # TRL: optimiser steps
    assert cfg.use_bias_correction_kl is False and cfg.loss_type == "dapo"
    grpo = trl_config.grpo_config(study.resolve_plan(paper, "qwen3-8b-base", "grpo"), tmp_path, 8)
    assert grpo.loss_type == "grpo" and grpo.beta == 0.04 and grpo.use_bias_correction_kl is False


def test_bf16_keeps_fp32_master_weights_without_deepspeed(tmp_path):
    plan = study.resolve_plan(tiny_recipe(bf16=True), "tiny-qwen3", "stapo")
    plain = trl_config.grpo_config(plan, tmp_path, 1)
    assert plain.bf16 and plain.model_init_kwargs["dtype"] == torch.float32  # autocast over fp32 parameters
    zero = trl_config.grpo_config(plan, tmp_path, 1, deepspeed=True)
    assert zero.model_init_kwargs["dtype"] == torch.bfloat16  # the ZeRO engine keeps the fp32 master copy
    fp32 = trl_config.grpo_config(study.resolve_plan(tiny_recipe(), "tiny-qwen3", "stapo"), tmp_path, 1)
    assert fp32.model_init_kwargs["dtype"] == torch.float32


@pytest.mark.parametrize("style", ["stripped", "justrl_raw"])
def test_train_prompt_reaches_the_training_set(tmp_path, monkeypatch, style):
    """train.prompt: the trainer's DAPO-Math-17k prompts keep (justrl_raw) or strip (stripped) DAPO's own wrapper
    (the hub is replaced by one record in BytedTsinghua-SIA's format)."""
    import datasets

    from stapo.tasks.problems import DAPO_PREFIX, DAPO_SUFFIX, PROMPT_SUFFIX

    record = {"prompt": [{"role": "user", "content": f"{DAPO_PREFIX}What is 2 + 3?{DAPO_SUFFIX}"}],
              "reward_model": {"ground_truth": "5"}}
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: [record])
    plan = study.resolve_plan(tiny_recipe(dataset={"name": "dapo-math-17k"}, prompt=style), "tiny-qwen3", "justrl")
    prompt = T.build_trainer(plan, tmp_path / "run").train_dataset[0]["prompt"]
    assert "What is 2 + 3?" in prompt and PROMPT_SUFFIX in prompt
    assert (DAPO_PREFIX.strip() in prompt) == (style == "justrl_raw")


def test_lr_schedule_advances_once_per_rollout_step(tmp_path):
    """verl: constant LR with 2 warm-up rollout steps, one scheduler step per rollout batch of k = 4 updates."""
    plan = study.resolve_plan(tiny_recipe(prompts_per_generation=8, prompts_per_step=2, warmup_steps=2, max_steps=4,
                                      learning_rate=1e-6), "tiny-qwen3", "justrl")
    trainer = T.build_trainer(plan, tmp_path)
    assert trainer.args.max_steps == 16
    trainer.create_optimizer_and_scheduler(num_training_steps=trainer.args.max_steps)
    lrs = []
    for _ in range(16):
        lrs.append(trainer.lr_scheduler.get_last_lr()[0])
        trainer.optimizer.step()
        trainer.lr_scheduler.step()
    # HF/verl constant_with_warmup: factor s / warmup for rollout step s < warmup, then 1
    assert lrs == pytest.approx([0.0] * 4 + [0.5e-6] * 4 + [1e-6] * 8)


def _base_like_tiny_qwen3(tmp_path) -> str:
    """bundled:tiny-qwen3 with Qwen3-Base's stopping config: EOS <|endoftext|> in tokenizer and generation config."""
    import shutil

    from stapo.models import resolve_model

    d = tmp_path / "tiny-qwen3-base"
    shutil.copytree(resolve_model("bundled:tiny-qwen3"), d)
    for name, key, value in (("tokenizer_config.json", "eos_token", "<|endoftext|>"),
                             ("generation_config.json", "eos_token_id", 151643),
                             ("config.json", "eos_token_id", 151643)):
        path = d / name
        data = json.loads(path.read_text()) if path.exists() else {}
        data[key] = value
        path.write_text(json.dumps(data))
    return str(d)


def test_rollouts_stop_at_every_end_of_turn_token(tmp_path):
    recipe = tiny_recipe()
    recipe["models"]["base-like"] = {"spec": _base_like_tiny_qwen3(tmp_path)}
    plan = study.resolve_plan(recipe, "base-like", "stapo")
    trainer = T.build_trainer(plan, tmp_path / "run")
    assert trainer.processing_class.eos_token == "<|endoftext|>"
    assert set(trainer.eos_token_ids) == {151643, 151645}  # the completion mask closes at either
    assert set(trainer.generation_config.eos_token_id) == {151643, 151645}  # HF generation stops at either
    # vLLM rollouts: SamplingParams(stop_token_ids=...) through generation_kwargs
    cfg = trl_config.grpo_config(plan, tmp_path, 1, use_vllm=True, stop_token_ids=[151643, 151645])
    assert cfg.generation_kwargs == {"stop_token_ids": [151643, 151645]}
    # TRL's completion mask from the trainer's eos ids: text after <|im_end|> never reaches the reward
    ids = torch.tensor([[10, 11, 151645, 12, 13], [10, 151643, 14, 15, 16]])
    is_eos = torch.isin(ids, torch.tensor(trainer.eos_token_ids))
    assert is_eos.int().argmax(1).tolist() == [2, 1]


# ------------------------------------------------------------------------------- gradient accumulation (exact)


def _micro_batch(prompt_len: int, lengths: list[int], advantages: list[float], seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    b, t = len(lengths), max(lengths)
    completion_mask = torch.tensor([[1] * n + [0] * (t - n) for n in lengths])
    return {
        "prompt_ids": torch.randint(100, 5000, (b, prompt_len), generator=g),
        "prompt_mask": torch.ones(b, prompt_len, dtype=torch.long),
        "completion_ids": torch.randint(100, 5000, (b, t), generator=g),
        "completion_mask": completion_mask,
        "advantages": torch.tensor(advantages),
        "num_items_in_batch": torch.tensor(999),  # deliberately not the kept count: the rescale must fix it
    }


def two_micro_batches(second: list[int] = (4, 6, 1, 5)) -> list[dict]:
    """One optimiser step in two micro-batches of 4 completions (prompt 5 tokens); ``second``: the second one's
    completion lengths."""
    return [_micro_batch(5, [6, 3, 6, 2], [1.0, -0.5, 0.8, 0.3], 0),
            _micro_batch(5, list(second), [0.6, 1.2, -1.0, 0.9], 1)]


def accumulating_trainer(tmp_path, recipe: dict, method: str):
    """The trainer of ``method`` in training mode, at TRL's point of a 2-micro-batch accumulation window."""
    plan = study.resolve_plan(recipe, "tiny-qwen3", method)
    trainer = T.build_trainer(plan, tmp_path)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 2  # set by Trainer.train()
    return plan, trainer


def _grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def trainer_gradients(trainer, batches: list[dict]) -> dict[str, torch.Tensor]:
    """The accumulated gradient of ``batches`` through the trainer's own path (``_compute_loss``, window close)."""
    trainer.model.zero_grad()
    for inputs in batches:
        trainer._compute_loss(trainer.model, inputs).backward()
    trainer._close_window(trainer.model)
    return _grads(trainer.model)


def forward(trainer, inputs: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-probs, entropies) [B, T] of a micro-batch's completions under the trainer's model (with grad)."""
    ids, mask = layout.sequence_inputs(inputs)
    logps, ent, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask,
                                                               inputs["completion_ids"].size(1), compute_entropy=True)
    return logps, ent


def reference_gradients(trainer, batches: list[dict], loss_of) -> dict[str, torch.Tensor]:
    """The gradient of Σ_j ``loss_of(j, logps_j, entropies_j, inputs_j)``: the objective alone, micro-batch by
    micro-batch, with the weights the test states."""
    trainer.model.zero_grad()
    for j, inputs in enumerate(batches):
        loss_of(j, *forward(trainer, inputs), inputs).backward()
    return _grads(trainer.model)


def assert_same_gradients(got: dict, ref: dict) -> None:
    """Equal up to fp32 summation order, parameter by parameter (a zero reference gradient is itself a failure)."""
    assert got.keys() == ref.keys()
    for name, g in got.items():
        assert ref[name].abs().max() > 0, name
        torch.testing.assert_close(g, ref[name], rtol=1e-4, atol=1e-5 * float(ref[name].abs().max()) + 1e-12,
                                   msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.parametrize("method", ["stapo", "entropy20", "justrl"])
def test_accumulated_gradient_is_the_exact_kept_token_mean(tmp_path, method):
    """Two micro-batches through the trainer == Σ_j S_j / K with K the kept tokens of both (no second pass)."""
    plan, trainer = accumulating_trainer(tmp_path, tiny_recipe(reward="dapo_strict"), method)
    batches = two_micro_batches()
    got = trainer_gradients(trainer, batches)

    def call(lp, ent, inputs, **kw):
        return policy_loss(plan.objective, logps=lp, old_logps=lp.detach(), advantages=inputs["advantages"],
                           entropies=ent, completion_mask=inputs["completion_mask"], **kw)

    with torch.no_grad():  # the reference's one global denominator: the objective's own kept tokens of both
        kept = sum(call(*forward(trainer, i), i)[1]["kept_fraction"] * float(i["completion_mask"].sum())
                   for i in batches)
    if method == "stapo":
        assert 0 < kept < 35  # something was silenced: random-init tokens all have p < τ_p
    ref = reference_gradients(trainer, batches, lambda j, lp, ent, i: call(lp, ent, i, token_normalizer=round(kept))[0])
    assert_same_gradients(got, ref)


@pytest.mark.parametrize("method, scope", [("justrl", "mini_batch"), ("entropy20", "micro_batch_local_topk"),
                                           ("stapo", "micro_batch_local_topk")])
def test_per_micro_batch_gradient_is_the_sequence_weighted_token_means(tmp_path, method, scope):
    """loss_agg_mode token-mean-per-micro-batch (verl 0.4.0): no step rescale; the accumulated gradient is
    Σ_j (4 / 8 sequences) · token-mean_j over each micro-batch's own kept tokens — micro-batches of 17 and 5
    completion tokens weigh 1/2 each, where the default's global token-mean weighs them by their kept tokens."""
    recipe = tiny_recipe(reward="dapo_strict")
    recipe["methods"][method].update(loss_agg_mode="token-mean-per-micro-batch", quantile_scope=scope)
    plan, trainer = accumulating_trainer(tmp_path, recipe, method)
    assert trainer._aggregation.name == "micro_batch_token_mean" and trainer.args.loss_type == "bnpo"
    batches = two_micro_batches(second=[1, 2, 1, 1])
    got = trainer_gradients(trainer, batches)

    def loss_of(cfg, weight, k=None):
        return lambda j, lp, ent, i: weight * policy_loss(cfg, logps=lp, old_logps=lp.detach(),
                                                          advantages=i["advantages"], entropies=ent,
                                                          completion_mask=i["completion_mask"], token_normalizer=k)[0]

    assert_same_gradients(got, reference_gradients(trainer, batches, loss_of(plan.objective, 0.5)))
    if method == "justrl":  # the default protocol's gradient on the same step differs: one denominator, 22 tokens
        glob = reference_gradients(trainer, batches, loss_of(study.get_objective("justrl"), 1.0, k=22))
        assert max(float((got[n] - glob[n]).abs().max() / glob[n].abs().max()) for n in got) > 0.05


@pytest.mark.parametrize("method", ["clip_cov", "kl_cov", "gspo", "cispo", "dr_grpo", "luspo"])
def test_related_methods_accumulate_their_own_loss(tmp_path, method):
    """The methods that own their loss go through the trainer as the mask methods do: two micro-batches give the
    gradient of their loss under its aggregation (token-mean: one denominator, the step's tokens; GSPO's
    seq-mean-token-mean, LUSPO's seq-mean-token-sum, Dr. GRPO's seq-mean-token-sum-norm: each micro-batch weighted by
    its 4 of the step's 8 sequences; Dr. GRPO's L the recipe's max_completion_length, 8, set by the plan)."""
    recipe = tiny_recipe(reward="dapo_strict")
    recipe["methods"] = {method: {"objective": method}}
    plan, trainer = accumulating_trainer(tmp_path, recipe, method)
    assert trainer.args.loss_type == plan.objective.loss_agg_mode.trl_loss_type
    assert plan.objective.loss_scale_factor == (8 if method == "dr_grpo" else None)
    batches = two_micro_batches()
    got = trainer_gradients(trainer, batches)
    tokens = sum(float(b["completion_mask"].sum()) for b in batches)
    global_mean = aggregation(plan.objective.loss_agg_mode).step_normaliser

    def loss_of(j, lp, ent, i):
        loss, _ = policy_loss(plan.objective, logps=lp, old_logps=lp.detach(), advantages=i["advantages"],
                              entropies=ent, completion_mask=i["completion_mask"],
                              token_normalizer=tokens if global_mean else None)
        return loss * (1.0 if global_mean else 0.5)

    assert_same_gradients(got, reference_gradients(trainer, batches, loss_of))


# ---------------------------------------------------------------------------------------- end-to-end (slow)


# The tiny runs the read-only tests share (one per method, built once per test run: conftest.build_once): token
# diagnostics every step and TensorBoard logging on, so one run serves the tests of each.
SHARED_RUN = dict(diagnostics_every=1, diagnostics_examples=3, report_to="tensorboard", seed=3)


@pytest.fixture(scope="session")
def tiny_run(shared_dir):
    """``tiny_run(method)`` -> (run directory, plan) of tiny_recipe(**SHARED_RUN) trained with ``method``."""

    def run(method: str):
        plan = study.resolve_plan(tiny_recipe(**SHARED_RUN), "tiny-qwen3", method)

        def build(out):
            with pytest.MonkeyPatch.context() as mp:
                mp.setitem(REWARDS, "coin", coin_reward)
                T.train(plan, out)

        return build_once(shared_dir, f"tiny-qwen3-{method}", build), plan

    return run


@pytest.mark.slow
@pytest.mark.parametrize("method", ["grpo", "entropy20", "justrl", "stapo"])
def test_each_method_trains_and_writes_outputs(tiny_run, method):
    run, plan = tiny_run(method)
    final = run / "final"
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        assert set(FIELDS) <= set(row), set(FIELDS) - set(row)
        assert all(row[k] is not None and row[k] == row[k] for k in FIELDS), row
        assert row["response_length_mean"] <= 8 and row["entropy_mean"] > 5.0  # random init: near-uniform
        assert -1.0 <= row["reward_mean"] <= 1.0 and row["accuracy"] == pytest.approx((row["reward_mean"] + 1) / 2)
        assert 0.0 <= row["silenced_fraction"] <= row["candidate_fraction"] <= 1.0
        silenced = row["silenced_fraction"] * row["completion_tokens"]  # the fraction's denominator: a count
        assert row["completion_tokens"] >= 1 and silenced == pytest.approx(round(silenced), abs=1e-6)
        assert row["lr"] == pytest.approx(1e-3) and row["grad_norm"] > 0
    if method == "stapo":
        assert any(r["silenced_fraction"] > 0 for r in rows)
        assert all(r["kept_fraction"] == pytest.approx(1 - r["silenced_fraction"]) for r in rows)
    if method == "entropy20":
        assert all(0.15 < r["kept_fraction"] < 0.35 for r in rows)
    if method in ("justrl", "grpo"):
        assert all(r["kept_fraction"] == 1.0 and r["silenced_fraction"] == 0.0 for r in rows)
    # layout: checkpoints every save_step (HF format + tokenizer, complete), final/, resolved config
    for step in (1, 2):
        ckpt = run / f"checkpoint-{step}"
        assert rundir.problems(ckpt) == [] and (ckpt / "tokenizer.json").exists() and (ckpt / "optimizer.pt").exists()
    assert (final / "config.json").exists() and (final / "tokenizer.json").exists()
    assert rundir.verify_final(run, 2)
    resolved = yaml.safe_load((run / "config.yaml").read_text())
    assert resolved["method"]["method"] == method and resolved["trl"]["gradient_accumulation_steps"] == 2
    # weights change after one step
    from stapo.models import resolve_model

    before = weights(Path(resolve_model(plan.model_spec)))
    after = weights(run / "checkpoint-1")
    changed = [n for n in before if not torch.equal(before[n], after[n])]
    assert len(changed) >= len(before) // 2, changed


RELATED = [k for k, m in DECLARED_METHODS.items() if m.family.value in ("verl", "trl")]  # every method of verl / TRL


@pytest.mark.slow
@pytest.mark.parametrize("method", RELATED)
def test_each_related_method_trains_one_step(tmp_path, coin, method):
    """The methods that own their loss train end to end (one step: cheap); their run records their parameters."""
    recipe = tiny_recipe(max_steps=1)
    recipe["methods"] = {method: {"objective": method}}
    plan = study.resolve_plan(recipe, "tiny-qwen3", method)
    T.train(plan, tmp_path)
    (row,) = read_metrics(tmp_path)
    assert all(row[k] is not None and row[k] == row[k] for k in FIELDS), row
    assert row["kept_fraction"] == 1.0 and row["grad_norm"] > 0
    resolved = yaml.safe_load((tmp_path / "config.yaml").read_text())["method"]
    assert resolved["method"] == method and resolved["loss_agg_mode"] == str(plan.objective.loss_agg_mode)
    assert set(resolved) >= set(DECLARED_METHODS[method].params)


@pytest.mark.slow
def test_every_line_records_what_the_step_cost(tmp_path, coin, monkeypatch):
    """Cost fields (stapo.train.step_cost) of a real run, 2 optimiser steps per rollout batch: the rollout's seconds on
    its first step only, the update's tokens as the micro-batches' attention masks count them, MFU from a peak."""
    from stapo.train import metrics as M, step_cost
    from stapo.models import resolve_model
    from transformers import AutoModelForCausalLM

    seen = []  # (Σ L, Σ L²) of every micro-batch the loss saw, in order
    add = M.StepAccumulator.add

    def spy(self, metrics, completion_mask, loss, attention_mask=None):
        lengths = attention_mask.sum(-1).double()
        seen.append((float(lengths.sum()), float((lengths**2).sum())))
        return add(self, metrics, completion_mask, loss, attention_mask)

    monkeypatch.setattr(M.StepAccumulator, "add", spy)
    monkeypatch.setenv("STAPO_PEAK_TFLOPS", "0.5")  # CPU has no known peak; a stated one gives an MFU
    plan = study.resolve_plan(tiny_recipe(prompts_per_generation=4), "tiny-qwen3", "stapo")
    T.train(plan, tmp_path)
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and len(seen) == 8  # 2 micro-batches per step
    model = AutoModelForCausalLM.from_pretrained(resolve_model(plan.model_spec))
    shape = step_cost.model_flop_params(model)
    tied = model.get_input_embeddings().weight is model.get_output_embeddings().weight
    assert shape["params"] == sum(p.numel() for p in model.parameters()) - (0 if tied else model.model.embed_tokens
                                                                            .weight.numel())
    for i, row in enumerate(rows):
        assert set(step_cost.COST_FIELDS) <= set(row)
        generated = i % 2 == 0  # TRL generates the rollout batch on the first of its 2 optimiser steps
        assert (row["gen_seconds"] > 0, row["forward_seconds"] > 0) == (generated, generated), row
        assert row["update_seconds"] == pytest.approx(row["step_seconds"] - row["gen_seconds"]
                                                      - row["forward_seconds"]) and row["update_seconds"] > 0
        tokens, tokens_sq = (sum(v) for v in zip(*seen[2 * i: 2 * i + 2]))
        assert row["step_tokens"] == tokens
        assert row["tokens_per_s_per_gpu"] == pytest.approx(tokens / row["step_seconds"])
        flops = 6 * shape["params"] * tokens + 12 * tokens_sq * shape["head_dim"] * shape["heads"] * shape["layers"]
        assert row["mfu"] == pytest.approx(flops / (row["update_seconds"] * 0.5e12), rel=1e-9)
        assert (row["device"], row["peak_tflops"], row["peak_memory_gib"]) == ("cpu", 0.5, None)


def test_no_mfu_without_a_known_peak(monkeypatch):
    from stapo.train import step_cost

    monkeypatch.delenv("STAPO_PEAK_TFLOPS", raising=False)
    device, peak = step_cost.device_peak()
    assert (device, peak) == ("cpu", None)
    row = step_cost.cost_fields({"gen_seconds": 1.0, "forward_seconds": 0.5, "step_tokens": 300.0,
                                 "step_flops": 1e12}, 4.0, 2, device, peak, None)
    assert row["mfu"] is None and row["update_seconds"] == 2.5 and row["tokens_per_s_per_gpu"] == 37.5
    names = {"NVIDIA H200": 989.0, "NVIDIA H20": 148.0, "NVIDIA H100 PCIe": 756.0, "NVIDIA H100 80GB HBM3": 989.0,
             "NVIDIA A100-SXM4-80GB": 312.0, "NVIDIA GeForce GTX 1080": None}
    for name, want in names.items():
        assert next((p for pat, p in step_cost.PEAK_TFLOPS if re.search(pat, name)), None) == want


@pytest.mark.slow
def test_small_lr_moves_fp32_master_weights_under_bf16(tmp_path, coin):
    """bf16 without DeepSpeed: LR 1e-6 still changes the weights (bf16 parameters would round most updates away)."""
    plan = study.resolve_plan(tiny_recipe(bf16=True, learning_rate=1e-6, max_steps=1), "tiny-qwen3", "justrl")
    T.train(plan, tmp_path)
    from stapo.models import resolve_model

    before, after = weights(Path(resolve_model(plan.model_spec))), weights(tmp_path / "final")
    assert all(t.dtype == torch.float32 for t in after.values())
    changed = [n for n in before if not torch.equal(before[n], after[n])]
    assert len(changed) >= len(before) // 2, changed
    # the same update applied to bf16 weights: most elements would not move at all
    name = max(changed, key=lambda n: before[n].numel())
    delta = after[name] - before[name]
    bf16_moved = (before[name].bfloat16() + delta.bfloat16()).ne(before[name].bfloat16()).float().mean()
    fp32_moved = delta.ne(0).float().mean()
    assert fp32_moved > 0.5 and bf16_moved < 0.1 * fp32_moved, (float(fp32_moved), float(bf16_moved))


@pytest.mark.slow
@pytest.mark.parametrize("method, ppg", [("stapo", 2), ("entropy20", 4)])
def test_thresholds_are_taken_over_the_whole_optimiser_step(tmp_path, coin, monkeypatch, method, ppg):
    """Mini-batch scope: one threshold computation per optimiser step, over all its micro-batches' completions,
    from π_old's forward — TRL's own when a rollout feeds 2 optimiser steps (ppg 4), the trainer's when 1 (ppg 2)."""
    calls = []
    real = T.step_thresholds

    def spy(cfg, **kw):
        t = real(cfg, **kw)
        calls.append((kw["completion_mask"].shape[0], t))
        return t

    monkeypatch.setattr(T, "step_thresholds", spy)
    seen = []
    real_loss = T.policy_loss
    monkeypatch.setattr(T, "policy_loss", lambda cfg, **kw: (seen.append(kw["thresholds"]), real_loss(cfg, **kw))[1])
    plan = study.resolve_plan(tiny_recipe(max_steps=1, prompts_per_generation=ppg), "tiny-qwen3", method)
    T.train(plan, tmp_path)
    k = ppg // 2
    assert [n for n, _ in calls] == [8] * k  # 2 prompts × 4 completions per step, in 2 micro-batches of 4
    assert len(seen) == 2 * k and all(t is not None for t in seen)
    assert [id(t) for t in seen] == [id(t) for _, t in calls for _ in range(2)]  # both micro-batches share it
    rows = read_metrics(tmp_path)
    assert [(r["step"], r["rollout_step"]) for r in rows] == [(i + 1, 1) for i in range(k)]


class _Kill(Exception):
    """Stands in for SIGKILL in the middle of an optimiser step."""


@pytest.mark.slow
def test_resume_after_kill_gives_identical_weights(tmp_path, coin):
    from transformers import TrainerCallback

    plan = study.resolve_plan(tiny_recipe(max_steps=3), "tiny-qwen3", "stapo")
    straight = T.train(plan, tmp_path / "straight")

    class KillAtStep2(TrainerCallback):  # dies inside step 2, after checkpoint-1 was written
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 2:
                raise _Kill()

    out = tmp_path / "killed"
    trainer = T.build_trainer(plan, out, callbacks=[T.MetricsJsonl(out / "metrics.jsonl"), T.CheckpointSentinel(),
                                                    KillAtStep2()])
    with pytest.raises(_Kill):
        trainer.train()
    del trainer
    assert [r["step"] for r in read_metrics(out)] == [1] and not (out / "final").exists()
    (out / "checkpoint-2").mkdir()  # a half-written checkpoint from the kill
    (out / "checkpoint-2" / "model.safetensors").write_bytes(b"garbage")

    resumed = T.train(plan, out)  # the same command again
    assert [r["step"] for r in read_metrics(out)] == [1, 2, 3]
    a, b = weights(straight), weights(resumed)
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
    first, again = read_metrics(tmp_path / "straight"), read_metrics(out)
    assert [r["reward_mean"] for r in first] == [r["reward_mean"] for r in again]


@pytest.mark.slow
def test_token_diagnostics_are_logged(tiny_run):
    """train.diagnostics_every=1: quadrant counts add up to the positive tokens, quantiles ordered, examples."""
    run, _ = tiny_run("stapo")
    rows = [json.loads(x) for x in (run / "diagnostics.jsonl").read_text().splitlines()]
    metrics = read_metrics(run)
    assert [r["step"] for r in rows] == [1, 2]
    for row, m in zip(rows, metrics):
        counts = [row[f"quadrant/{q}_count"] for q in ("lowp_lowh", "lowp_highh", "highp_lowh", "highp_highh")]
        assert sum(counts) > 0
        # random-init Qwen3 over 151k tokens: nearly every sampled token has p < 0.002 → mostly low-p quadrants
        assert counts[0] + counts[1] > counts[2] + counts[3]
        qs = [row[f"entropy_q{q}"] for q in (10, 25, 50, 75, 90)]
        assert qs == sorted(qs) and qs[0] <= m["entropy_mean"] <= qs[-1] + 1e-6
        norm = row["quadrant/lowp_lowh_grad_norm"]
        assert norm is None or norm > 0
    examples = [json.loads(x) for x in (run / "silenced_examples.jsonl").read_text().splitlines()]
    assert 0 < len(examples) <= 6
    for ex in examples:
        assert ex["p"] < 0.002 and ex["advantage"] > 0 and len(ex["top"]) == 5
        assert ex["top"][0]["p"] >= ex["top"][-1]["p"] and isinstance(ex["token"], str)


@pytest.mark.slow
def test_report_to_tensorboard_logs_the_step_metrics(tiny_run):
    """train.report_to reaches TRL: TensorBoard (offline) gets the loss, entropy and silenced fraction of every
    optimiser step, equal to metrics.jsonl's, under the run name <model>/<method>/seed<seed>."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run, _ = tiny_run("stapo")
    events = sorted((run / "runs").rglob("events.out.tfevents.*"))
    assert len(events) == 1, events
    acc = EventAccumulator(str(events[0].parent)).Reload()
    tags = set(acc.Tags()["scalars"])
    rows = read_metrics(run)
    # metrics.jsonl's loss is the objective's (the exact kept-token mean); TRL's own "loss" is the provisional one
    for tag, key in (("train/objective_loss", "loss"), ("train/entropy_mean", "entropy_mean"),
                     ("train/silenced_fraction", "silenced_fraction")):
        assert tag in tags, sorted(tags)
        logged = {e.step: e.value for e in acc.Scalars(tag)}
        assert sorted(logged) == [1, 2]
        for row in rows:
            assert logged[row["step"]] == pytest.approx(row[key], rel=1e-5, abs=1e-6), (tag, logged, row)
    args = json.loads(acc.Tensors("args/text_summary")[0].tensor_proto.string_val[0])
    assert args["run_name"] == "tiny-qwen3/stapo/seed3" and args["report_to"] == ["tensorboard"]


# ------------------------------------------------------------------------------ a run that cannot go on (slow)


@pytest.mark.slow
def test_non_finite_weights_stop_the_run_before_any_save(tmp_path, coin, monkeypatch):
    """A step that leaves a NaN in the weights stops the run with one line (a UserError) and saves nothing of it;
    a diverged run used to save NaN checkpoints and exit 0."""
    guard = rundir.FiniteWeights.on_step_end

    def poisoned(self, args, state, control, model=None, **kwargs):
        with torch.no_grad():
            next(model.parameters()).view(-1)[0] = float("nan")
        return guard(self, args, state, control, model=model, **kwargs)

    monkeypatch.setattr(rundir.FiniteWeights, "on_step_end", poisoned)
    plan = study.resolve_plan(tiny_recipe(), "tiny-qwen3", "justrl")
    with pytest.raises(rundir.NonFiniteTraining, match=r"^step 1: parameter .+ is no longer finite .+ no checkpoint"):
        T.train(plan, tmp_path)
    assert not list(tmp_path.glob("checkpoint-*")) and not (tmp_path / "final").exists()


@pytest.fixture
def small_disk(tmp_path):
    """A 6 MiB tmpfs (root only): room for a run's config and metrics, not for a checkpoint of tiny-qwen3."""
    import subprocess

    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(disk)],
                                           capture_output=True).returncode != 0:
        pytest.skip("needs root to mount a small tmpfs")
    yield disk
    subprocess.run(["umount", "-l", str(disk)], check=False)


@pytest.mark.slow
def test_disk_full_during_a_checkpoint_is_one_line(small_disk, coin):
    plan = study.resolve_plan(tiny_recipe(max_steps=1), "tiny-qwen3", "justrl")
    with pytest.raises(UserError, match=rf"^disk full while writing {small_disk}/run \(\d+ MiB free there\).+"
                                          r"resumes from the start"):
        T.train(plan, small_disk / "run")
