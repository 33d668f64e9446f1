"""Chunked token statistics (tests/helpers/tokenstats.py) equal the naive full-vocabulary computation, forward and
backward."""

import math

import pytest
import torch

from helpers.tokenstats import naive_token_stats, token_stats


def _logits(n, v, seed=0, scale=3.0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, v, generator=g) * scale).to(dtype), torch.randint(0, v, (n,), generator=g)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("chunk", [1, 8, 64, 1000])
def test_forward_equals_naive(temperature, chunk):
    logits, labels = _logits(37, 1000)
    a = token_stats(logits, labels, temperature=temperature, chunk_size=chunk)
    b = naive_token_stats(logits, labels, temperature=temperature)
    for name in ("logps", "entropies", "collision"):
        torch.testing.assert_close(getattr(a, name), getattr(b, name), atol=1e-5, rtol=1e-5)


def test_known_values():
    # uniform over V: logp = −ln V, H = ln V, C = 1/V; a one-hot-ish row: H ≈ 0, C ≈ 1
    v = 50
    logits = torch.stack([torch.zeros(v), torch.cat([torch.tensor([60.0]), torch.zeros(v - 1)])])
    s = token_stats(logits, torch.tensor([3, 0]), chunk_size=1)
    assert s.logps[0].item() == pytest.approx(-math.log(v), rel=1e-6)
    assert s.entropies[0].item() == pytest.approx(math.log(v), rel=1e-6)
    assert s.collision[0].item() == pytest.approx(1 / v, rel=1e-6)
    assert s.entropies[1].item() == pytest.approx(0.0, abs=1e-20) and s.collision[1].item() == pytest.approx(1.0)
    assert s.logps[1].item() == pytest.approx(0.0, abs=1e-6)


def test_temperature_divides_logits():
    logits, labels = _logits(5, 30)
    a = token_stats(logits, labels, temperature=0.5)
    b = token_stats(logits * 2.0, labels, temperature=1.0)
    torch.testing.assert_close(a.entropies, b.entropies)


def test_backward_equals_naive_autograd():
    logits, labels = _logits(23, 400, seed=1)
    g = torch.Generator().manual_seed(2)
    w = torch.randn(3, 23, generator=g)
    grads = []
    for fn, kw in ((token_stats, {"chunk_size": 5}), (naive_token_stats, {})):
        x = logits.clone().requires_grad_(True)
        s = fn(x, labels, temperature=0.8, **kw)
        (w[0] * s.logps + w[1] * s.entropies + w[2] * s.collision).sum().backward()
        grads.append(x.grad)
    torch.testing.assert_close(grads[0], grads[1], atol=1e-5, rtol=1e-4)


def test_gradcheck_fp64():
    logits, labels = _logits(6, 9, seed=3, scale=1.0, dtype=torch.float64)
    logits.requires_grad_(True)
    assert torch.autograd.gradcheck(
        lambda x: tuple(vars(token_stats(x, labels, temperature=0.9, chunk_size=4)).values()), (logits,)
    )


def test_partial_outputs_backward():
    # only entropy used: the unused outputs' None gradients are handled
    logits, labels = _logits(4, 20)
    x = logits.clone().requires_grad_(True)
    token_stats(x, labels, chunk_size=3).entropies.sum().backward()
    y = logits.clone().requires_grad_(True)
    naive_token_stats(y, labels).entropies.sum().backward()
    torch.testing.assert_close(x.grad, y.grad, atol=1e-6, rtol=1e-5)


def test_bf16_logits_computed_in_fp32():
    logits, labels = _logits(8, 64, dtype=torch.bfloat16)
    s = token_stats(logits, labels)
    assert s.logps.dtype == torch.float32
    torch.testing.assert_close(s.entropies, naive_token_stats(logits.float(), labels).entropies)


def test_bad_shapes_and_temperature():
    logits, labels = _logits(4, 10)
    with pytest.raises(ValueError, match="logits"):
        token_stats(logits, labels[:3])
    with pytest.raises(ValueError, match="temperature"):
        token_stats(logits, labels, temperature=0.0)
