"""The uncompressed server step (heavy-ball momentum, FetchSGD's Sec. 5 baseline) in float64, and its edges.

Each test pins a behaviour of :mod:`fedsketch.algorithms.momentum_sgd` that tests/fedsketch/algorithms/test_fetchsgd.py
passes through without checking (docs/mutation.md, the algorithms' section).
"""

from __future__ import annotations

import pytest
import torch

from fedsketch.algorithms import momentum_sgd


def test_each_step_is_heavy_ball_momentum_to_the_bit_in_float64() -> None:
    """``u = rho u + g``, ``Delta = lr u``, with the rate and momentum of each round; the input state is kept."""
    gen = torch.Generator().manual_seed(2)
    state = momentum_sgd.MomentumState(velocity=torch.zeros(5, dtype=torch.float64))
    u = torch.zeros(5, dtype=torch.float64)
    for lr, rho in ((2.0, 0.9), (0.5, 0.0), (0.1, 0.5)):
        g = torch.randn(5, dtype=torch.float64, generator=gen)
        before = state.velocity.clone()
        new, delta = momentum_sgd.step(state, g, lr, rho)
        assert torch.equal(state.velocity, before)
        u = rho * u + g
        assert torch.equal(new.velocity, u) and torch.equal(delta, lr * u)
        state = new


def test_the_velocity_lives_on_the_device_asked_for() -> None:
    state = momentum_sgd.init(4, "meta")
    assert state.velocity.device.type == "meta" and state.velocity.shape == (4,)
    assert momentum_sgd.init(4).velocity.device.type == "cpu"


def test_an_update_of_the_wrong_shape_is_refused_with_both_shapes() -> None:
    with pytest.raises(ValueError, match=r"^update has shape \(3,\); expected \(4,\)$"):
        momentum_sgd.step(momentum_sgd.init(4), torch.zeros(3), 0.1, 0.9)
