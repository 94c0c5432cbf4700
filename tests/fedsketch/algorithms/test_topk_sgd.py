"""True top-k and local top-k server steps: identity cases, conservation, bounds, messages, float32 state.

FetchSGD (Rothchild et al., ICML 2020, Sec. 6) compares with true top-k and local top-k; the second part
pins what the identity and conservation tests pass through without checking (docs/mutation.md, the
algorithms' section).
"""

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


# defaults, bounds and messages, and the float32 state kept --------------------------------------------------


D_SMALL = 6
G = torch.tensor([0.5, -4.0, 1.0, 3.0, -0.25, 2.0])


def _two_rounds(params: TopkServerParams, lr: float = 0.5) -> tuple[server.TopkServerState, torch.Tensor]:
    """Two rounds of the gradient ``G``; returns the state and the second ``Delta``."""
    state, _ = server.step(server.init(params), G, params, lr)
    return server.step(state, G, params, lr)


def _reference(k: int, rho: float, zeroing: bool, lr: float = 0.5) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The same two rounds written out: ``u = rho u + g; e += lr u; Delta = top-k(e); e, u (zeroing) = 0 there``."""
    u, e = torch.zeros(D_SMALL), torch.zeros(D_SMALL)
    for _ in range(2):
        u = rho * u + G
        e = e + lr * u
        top = torch.topk(e.abs(), k).indices
        delta = torch.zeros(D_SMALL)
        delta[top] = e[top]
        e[top] = 0.0
        if zeroing:
            u[top] = 0.0
    return u, e, delta


@pytest.mark.parametrize("kind", ["true", "local"])
def test_the_documented_defaults_are_momentum_0_9_with_zeroing(kind: str) -> None:
    params = server.true_topk(D_SMALL, 2) if kind == "true" else server.local_topk(D_SMALL, download_k=2)
    assert params.momentum == 0.9 and params.momentum_zeroing is True
    state, delta = _two_rounds(params)
    u, e, expected = _reference(2, 0.9, True)
    assert torch.equal(state.momentum, u) and torch.equal(state.error, e) and torch.equal(delta, expected)
    assert server.local_topk(D_SMALL).momentum == 0.9


@pytest.mark.parametrize("zeroing", [True, False])
@pytest.mark.parametrize("kind", ["true", "local"])
def test_the_momentum_and_zeroing_asked_for_are_used(kind: str, zeroing: bool) -> None:
    if kind == "true":
        params = server.true_topk(D_SMALL, 2, momentum=0.5, momentum_zeroing=zeroing)
    else:
        params = server.local_topk(D_SMALL, download_k=2, momentum=0.5, momentum_zeroing=zeroing)
    assert params.momentum == 0.5 and params.momentum_zeroing is zeroing
    state, delta = _two_rounds(params)
    u, e, expected = _reference(2, 0.5, zeroing)
    assert torch.equal(state.momentum, u) and torch.equal(state.error, e) and torch.equal(delta, expected)


def test_k_may_be_1_or_d_and_no_more_whoever_builds_the_parameters() -> None:
    for k in (1, D_SMALL):
        assert TopkServerParams(d=D_SMALL, k=k).k == k
        assert server.local_topk(D_SMALL, download_k=k).k == k
        assert server.true_topk(D_SMALL, k).k == k
    for k in (0, D_SMALL + 1):
        message = rf"^k must be in \[1, {D_SMALL}\]; got {k}$"
        with pytest.raises(ValueError, match=message):
            TopkServerParams(d=D_SMALL, k=k)
        with pytest.raises(ValueError, match=message):
            server.local_topk(D_SMALL, download_k=k)
        with pytest.raises(ValueError, match=message):
            server.true_topk(D_SMALL, k)


def test_a_zero_learning_rate_is_accepted_and_applies_only_what_was_accumulated() -> None:
    """lr = 0 adds nothing to the error: the round applies the top-k of what earlier rounds left."""
    params = server.true_topk(D_SMALL, 2, momentum=0.5)
    state, first = server.step(server.init(params), G, params, 1.0)  # applies -4 and 3, leaves the rest
    state, second = server.step(state, G, params, 0.0)
    assert first.tolist() == [0.0, -4.0, 0.0, 3.0, 0.0, 0.0]
    assert second.tolist() == [0.0, 0.0, 1.0, 0.0, 0.0, 2.0]
    assert state.momentum.tolist() == [0.75, -4.0, 0.0, 3.0, -0.375, 0.0]  # 0.5 u + g, zeroed at 2 and 5
    assert state.error.tolist() == [0.5, 0.0, 0.0, 0.0, -0.25, 0.0]
    with pytest.raises(ValueError, match=r"^lr must be finite and >= 0; got -1e-12$"):
        server.step(state, G, params, -1e-12)


def test_the_state_is_float32_whatever_the_default_dtype_and_the_update_dtype() -> None:
    """A float64 mean update is rounded to the state's float32 before it enters the velocity."""
    params = server.true_topk(D_SMALL, 2, momentum=0.5)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        state = server.init(params)
    finally:
        torch.set_default_dtype(previous)
    assert state.momentum.dtype == state.error.dtype == torch.float32
    g64 = G.double() * (1 + 2**-40)  # not float32 numbers
    new, delta = server.step(state, g64, params, 1.0)
    assert new.momentum.dtype == new.error.dtype == delta.dtype == torch.float32
    _, expected = server.step(state, g64.float(), params, 1.0)
    assert torch.equal(delta, expected)
    local = server.local_topk(D_SMALL, momentum=0.5)
    new, delta = server.step(server.init(local), g64, local, 1.0)
    assert new.momentum.dtype == delta.dtype == torch.float32


def test_the_state_lives_on_the_device_asked_for() -> None:
    state = server.init(server.true_topk(D_SMALL, 2), "meta")
    assert state.momentum.device.type == state.error.device.type == "meta"
    assert server.init(server.true_topk(D_SMALL, 2)).error.device.type == "cpu"
