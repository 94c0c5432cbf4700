"""True top-k and local top-k server steps: identity cases and conservation."""

from __future__ import annotations

import pytest
import torch

from fedsketch.algorithms import topk_sgd as server
from fedsketch.algorithms.topk_sgd import TopkServerParams

D = 200


def grads(rounds: int, seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(D, generator=gen) for _ in range(rounds)]


def test_true_topk_with_k_d_and_no_momentum_is_plain_sgd() -> None:
    params = server.true_topk(D, D, momentum=0.0)
    state = server.init(params)
    for g in grads(5):
        state, delta = server.step(state, g, params, lr=0.3)
        torch.testing.assert_close(delta, 0.3 * g, rtol=0, atol=0)
        assert torch.count_nonzero(state.error) == 0


@pytest.mark.parametrize("zeroing", [True, False])
def test_true_topk_conserves_mass(zeroing: bool) -> None:
    """sum of applied Deltas + remaining error == sum of lr * u (u before zeroing).

    That identity holds whichever coordinates are applied, so each Delta is
    also checked to be the error's k largest magnitudes, at their values.
    """
    params = server.true_topk(D, 7, momentum=0.9, momentum_zeroing=zeroing)
    state = server.init(params)
    applied = torch.zeros(D, dtype=torch.float64)
    accumulated = torch.zeros(D, dtype=torch.float64)
    for r, g in enumerate(grads(30)):
        lr = 0.1 / (1 + r)
        velocity = params.momentum * state.momentum + g
        error = state.error + lr * velocity
        top = torch.sort(torch.topk(error.abs(), 7).indices).values
        state, delta = server.step(state, g, params, lr=lr)
        assert torch.equal(torch.nonzero(delta).view(-1), top)
        assert torch.equal(delta[top], error[top])
        applied += delta.double()
        accumulated += lr * velocity.double()
    torch.testing.assert_close(applied + state.error.double(), accumulated, rtol=0, atol=1e-5)


def test_momentum_zeroing_clears_momentum_at_the_support() -> None:
    g = grads(1)[0]
    for zeroing in (True, False):
        params = server.true_topk(D, 5, momentum=0.5, momentum_zeroing=zeroing)
        state, delta = server.step(server.init(params), g, params, lr=1.0)
        support = torch.nonzero(delta).reshape(-1)
        assert support.numel() == 5
        expected = torch.zeros(5) if zeroing else g[support]
        torch.testing.assert_close(state.momentum[support], expected)
        assert torch.count_nonzero(state.error[support]) == 0


def test_local_topk_without_download_k_is_momentum_sgd() -> None:
    params = server.local_topk(D, momentum=0.9)
    state = server.init(params)
    velocity = torch.zeros(D)
    for g in grads(4):
        velocity = 0.9 * velocity + g
        state, delta = server.step(state, g, params, lr=0.05)
        torch.testing.assert_close(delta, 0.05 * velocity)
    assert torch.count_nonzero(state.error) == 0


def test_local_topk_download_k_sparsifies_the_update() -> None:
    params = server.local_topk(D, download_k=3, momentum=0.0)
    _, delta = server.step(server.init(params), grads(1)[0], params, lr=1.0)
    assert torch.count_nonzero(delta) == 3


def test_rejects_bad_parameters_and_inputs() -> None:
    with pytest.raises(ValueError, match=r"k must be in \[1, 200\]"):
        server.true_topk(D, D + 1)
    with pytest.raises(ValueError, match=r"momentum must be in \[0, 1\)"):
        TopkServerParams(d=D, k=5, momentum=1.0)
    params = server.true_topk(D, 5)
    state = server.init(params)
    with pytest.raises(ValueError, match=r"expected \(200,\)"):
        server.step(state, torch.zeros(D + 1), params, lr=0.1)
    with pytest.raises(ValueError, match="lr must be finite and >= 0"):
        server.step(state, torch.zeros(D), params, lr=float("nan"))
