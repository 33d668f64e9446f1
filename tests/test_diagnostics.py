"""The paper's gradient-norm theory checked against autograd, and the per-quadrant statistics."""

import json
import math

import pytest
import torch

from helpers.tokenstats import token_stats
from stapo.train.diagnostics import (
    QUADRANTS,
    entropy_quantiles,
    grad_norm_sq,
    gradient_norm_bounds,
    quadrant_stats,
    silenced_examples,
)
from stapo.losses.masks import silence_mask


def _autograd_norm_sq(logits, labels, old_logps, adv, eps_low=0.2, eps_high=0.28):
    """‖∂J/∂logits‖² per token by autograd, J = min(ρÂ, clip(ρ)Â) summed over independent tokens."""
    a = logits.clone().requires_grad_(True)
    logp = torch.log_softmax(a, -1).gather(-1, labels[:, None]).squeeze(-1)
    ratio = torch.exp(logp - old_logps)
    j = torch.minimum(ratio * adv, ratio.clamp(1 - eps_low, 1 + eps_high) * adv)
    j.sum().backward()  # tokens are independent rows, so each row of the gradient is that token's own
    return (a.grad**2).sum(-1), ratio.detach()


@pytest.mark.parametrize("vocab", [7, 1000])
def test_closed_form_equals_autograd(vocab):
    g = torch.Generator().manual_seed(vocab)
    n = 64
    logits = torch.randn(n, vocab, generator=g, dtype=torch.float64) * 3
    labels = torch.randint(0, vocab, (n,), generator=g)
    logp_now = torch.log_softmax(logits, -1).gather(-1, labels[:, None]).squeeze(-1)
    # old log-probs spread the ratio over [0.5, 1.6]: clipped and unclipped tokens, both advantage signs
    old = logp_now - torch.empty(n, dtype=torch.float64).uniform_(math.log(0.5), math.log(1.6), generator=g)
    adv = torch.where(torch.arange(n) % 2 == 0, 1.3, -0.7).double()
    expected, ratio = _autograd_norm_sq(logits, labels, old, adv)
    stats = token_stats(logits, labels)
    # one "sequence" per token, so the per-sequence advantage is the token's own
    ours = grad_norm_sq(logps=stats.logps[:, None], collision=stats.collision[:, None], ratio=ratio[:, None],
                        advantages=adv, eps_low=0.2, eps_high=0.28).squeeze(-1)
    clipped = ((ratio > 1.28) & (adv > 0)) | ((ratio < 0.8) & (adv < 0))
    assert clipped.any() and (~clipped).any()
    assert torch.all(expected[clipped] == 0) and torch.all(ours[clipped] == 0)
    torch.testing.assert_close(ours.double(), expected, rtol=1e-5, atol=1e-9)


@pytest.mark.parametrize("vocab", [2, 10, 1000, 151936])
def test_paper_bounds_hold(vocab):
    g = torch.Generator().manual_seed(vocab)
    n = 8 if vocab > 10000 else 256
    # from nearly uniform to nearly one-hot
    scales = torch.logspace(-2, 1.5, n).unsqueeze(-1)
    logits = torch.randn(n, vocab, generator=g) * scales
    labels = torch.randint(0, vocab, (n,), generator=g)
    s = token_stats(logits.double(), labels)
    exact = 1 - 2 * s.logps.exp() + s.collision
    lower, upper = gradient_norm_bounds(logps=s.logps, entropies=s.entropies, vocab_size=vocab)
    assert torch.all(lower.double() <= exact + 1e-6), (lower - exact).max()
    assert torch.all(exact <= upper.double() + 1e-6), (exact - upper).max()


def test_bounds_tight_at_uniform():
    v = 50
    s = token_stats(torch.zeros(1, v, dtype=torch.float64), torch.tensor([0]))
    exact = 1 - 2 / v + 1 / v
    lower, upper = gradient_norm_bounds(logps=s.logps, entropies=s.entropies, vocab_size=v)
    assert lower.item() == pytest.approx(exact, rel=1e-5) and upper.item() == pytest.approx(exact, rel=1e-5)


def _batch():
    # one positive response (rare tokens with varied entropy + common tokens), one negative response
    logps = torch.tensor([[-8.0, -8.0, -8.0, -8.0, -0.1, -0.1], [-8.0, -0.1, -0.1, -0.1, -0.1, -0.1]])
    ent = torch.tensor([[0.1, 0.2, 0.3, 0.4, 0.05, 2.0], [0.1] * 6])
    coll = torch.tensor([[0.9, 0.8, 0.7, 0.6, 0.9, 0.1], [0.5] * 6])
    return dict(logps=logps, entropies=ent, collision=coll, ratio=torch.ones(2, 6),
                advantages=torch.tensor([1.0, -1.0]), completion_mask=torch.ones(2, 6, dtype=torch.int))


def test_quadrants_hand_computed():
    x = _batch()
    out = quadrant_stats(**x, tau_p=0.002, q=0.75, eps_low=0.2, eps_high=0.28)
    # candidates: the 4 rare tokens of response 0, H .1-.4 → τ_h = quantile(.75) = 0.325
    assert out["quadrant/tau_h"] == pytest.approx(0.325)
    assert out["quadrant/lowp_lowh_count"] == 3 and out["quadrant/lowp_highh_count"] == 1
    assert out["quadrant/highp_lowh_count"] == 1 and out["quadrant/highp_highh_count"] == 1
    p = math.exp(-8.0)
    expected = sum(math.sqrt(1 - 2 * p + c) for c in (0.9, 0.8, 0.7)) / 3
    assert out["quadrant/lowp_lowh_grad_norm"] == pytest.approx(expected, rel=1e-6)
    # the low-p low-H quadrant is exactly what S2T silences
    sil = silence_mask(logps=x["logps"], entropies=x["entropies"], advantages=x["advantages"],
                       completion_mask=x["completion_mask"], tau_p=0.002, q=0.75)
    assert sil.sum().item() == out["quadrant/lowp_lowh_count"]


def test_quadrant_low_p_low_h_has_largest_norm_on_real_distributions():
    # A consequence of the theory: for peaked distributions whose sampled token is rare, ‖∇‖ is largest.
    torch.manual_seed(0)
    v = 500
    logits = torch.randn(400, v) * torch.linspace(0.5, 8, 400).unsqueeze(-1)
    probs = torch.softmax(logits, -1)
    labels = torch.where(torch.rand(400) < 0.5, probs.argmin(-1), probs.argmax(-1))
    s = token_stats(logits, labels)
    out = quadrant_stats(logps=s.logps[None], entropies=s.entropies[None], collision=s.collision[None],
                         ratio=torch.ones(1, 400), advantages=torch.tensor([1.0]),
                         completion_mask=torch.ones(1, 400, dtype=torch.int), tau_p=0.002, q=0.75,
                         eps_low=0.2, eps_high=0.28)
    assert out["quadrant/lowp_lowh_count"] > 0
    norms = {k: out[f"quadrant/{k}_grad_norm"] for k in ("lowp_lowh", "lowp_highh", "highp_lowh")}
    assert norms["lowp_lowh"] == max(norms.values())


def test_entropy_quantiles():
    h = torch.arange(11, dtype=torch.float32).view(1, 11)  # 0..10
    mask = torch.ones(1, 11, dtype=torch.int)
    mask[0, -1] = 0  # 0..9 remain
    out = entropy_quantiles(h, mask)
    assert out == {"entropy_q10": pytest.approx(0.9), "entropy_q25": pytest.approx(2.25),
                   "entropy_q50": pytest.approx(4.5), "entropy_q75": pytest.approx(6.75),
                   "entropy_q90": pytest.approx(8.1)}


class _Tok:
    def decode(self, ids):
        return "".join(f"<{i}>" for i in ids)


def test_silenced_examples_records():
    sil = torch.zeros(2, 5, dtype=torch.bool)
    sil[0, 3] = sil[1, 1] = True
    ids = torch.arange(10).view(2, 5)
    top_ids = torch.arange(5).expand(2, 5, 5)
    top_lp = torch.log(torch.tensor([0.5, 0.2, 0.1, 0.05, 0.01])).expand(2, 5, 5)
    rows = silenced_examples(silenced=sil, completion_ids=ids, logps=torch.full((2, 5), math.log(0.001)),
                             entropies=torch.full((2, 5), 0.2), advantages=torch.tensor([1.0, 0.5]),
                             top_ids=top_ids, top_logps=top_lp, tokenizer=_Tok(), k=1, context=2)
    assert len(rows) == 1
    r = rows[0]
    assert r["token"] == "<3>" and r["context"] == "<1><2>" and r["p"] == pytest.approx(0.001)
    assert r["advantage"] == 1.0 and r["top"][0] == {"token": "<0>", "p": pytest.approx(0.5)}


def test_recorder_matches_full_logits_and_writes_only_on_the_writer(tmp_path):
    """TokenDiagnostics.observe (hidden states from a hook, Σπ² by TRL's kernel for the population only, top-5 from
    the same hidden states) == the statistics computed from the model's full logits."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from stapo.train.diagnostics import TokenDiagnostics
    from stapo.study import ObjectiveConfig

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    model = Qwen3ForCausalLM(cfg).eval()
    b, p_len, t_len, temp = 4, 5, 7, 0.7
    ids = torch.randint(0, 300, (b, p_len + t_len))
    inputs = {"prompt_ids": ids[:, :p_len], "completion_ids": ids[:, p_len:],
              "advantages": torch.tensor([1.0, -1, 0.5, 2]), "completion_mask": torch.ones(b, t_len, dtype=torch.long)}
    inputs["completion_mask"][2, -2:] = 0
    objective = ObjectiveConfig(method="stapo", tau_p=0.01, entropy_quantile=0.5)
    out = {}
    for writer in (True, False):
        diag = TokenDiagnostics(tmp_path / str(writer), every=1, objective=objective, tokenizer=_Tok(),
                                temperature=temp, k=3, writer=writer)
        diag.attach(model)
        diag.begin_step(1)
        with torch.no_grad():
            logits = model(input_ids=ids).logits[:, p_len - 1 : -1].float() / temp
        flat = token_stats(logits.reshape(-1, 300), inputs["completion_ids"].reshape(-1))
        logps, ent, coll = (x.view(b, t_len) for x in (flat.logps, flat.entropies, flat.collision))
        old = logps - 0.05  # ratios ≠ 1
        diag.observe(model=model, inputs=inputs, logps=logps, old_logps=old, entropies=ent)
        out[writer] = diag.end_step(1)
    assert out[False] is None and not (tmp_path / "False").exists()
    expected = quadrant_stats(logps=logps, entropies=ent, collision=coll, ratio=torch.exp(logps - old),
                              advantages=inputs["advantages"], completion_mask=inputs["completion_mask"],
                              tau_p=0.01, q=0.5, eps_low=0.2, eps_high=0.28)
    row = out[True]
    for q in QUADRANTS:
        assert row[f"quadrant/{q}_count"] == expected[f"quadrant/{q}_count"]
        if expected[f"quadrant/{q}_count"]:
            assert row[f"quadrant/{q}_grad_norm"] == pytest.approx(expected[f"quadrant/{q}_grad_norm"], rel=1e-4)
    assert sum(row[f"quadrant/{q}_count"] for q in QUADRANTS) == 3 * 7 - 2  # rows with Â > 0, minus 2 padding

    examples = [json.loads(x) for x in (tmp_path / "True" / "silenced_examples.jsonl").read_text().splitlines()]
    assert examples, "expected silenced tokens with tau_p = 0.01 on a random 300-token model"
    probs = torch.softmax(logits, -1)
    for ex in examples:
        assert ex["p"] < 0.01 and ex["advantage"] > 0 and len(ex["top"]) == 5
        tops = [a["p"] for a in ex["top"]]
        # the record's alternatives are the true top-5 of some position whose sampled token it names
        matches = [(bb, tt) for bb in range(b) for tt in range(t_len)
                   if _Tok().decode([int(inputs["completion_ids"][bb, tt])]) == ex["token"]
                   and torch.allclose(probs[bb, tt].topk(5).values, torch.tensor(tops), rtol=1e-4)]
        assert matches


def test_recorder_refuses_models_that_rescale_logits(tmp_path):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from stapo.train.diagnostics import TokenDiagnostics
    from stapo.study import ObjectiveConfig

    cfg = Qwen3Config(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=8)
    cfg.final_logit_softcapping = 30.0
    diag = TokenDiagnostics(tmp_path, every=1, objective=ObjectiveConfig(method="stapo"), tokenizer=_Tok(),
                            temperature=1.0)
    with pytest.raises(ValueError, match="final_logit_softcapping=30.0"):
        diag.attach(Qwen3ForCausalLM(cfg))
