"""FedAdam's server step (Reddi et al., ICLR 2021, Algorithm 2) without Flower: values, moments, message.

The last tests pin what the first ones pass through without checking (docs/mutation.md, the algorithms'
section).
"""

from __future__ import annotations

import pytest
import torch

from fedsketch.algorithms import fedadam
from fedsketch.config import RunConfig
from fedsketch.methods import ClientUpdate, Round, get_method
from fedsketch.settings.setting import ConfigError

D = 500


def test_steps_follow_algorithm_2_in_float64() -> None:
    """Five rounds against the paper's update written out in float64, moment by moment."""
    gen = torch.Generator().manual_seed(3)
    state = fedadam.init(D)
    m, v, w = torch.zeros(D, dtype=torch.float64), torch.zeros(D, dtype=torch.float64), torch.zeros(D)
    ref_w = torch.zeros(D, dtype=torch.float64)
    for lr in (0.1, 0.08, 0.06, 0.04, 0.02):
        g = torch.randn(D, generator=gen) * torch.rand(D, generator=gen)
        state, delta = fedadam.step(state, g, lr, beta1=0.9, beta2=0.99, tau=1e-3)
        w -= delta
        gd = g.double()
        m = 0.9 * m + 0.1 * gd
        v = 0.99 * v + 0.01 * gd * gd
        ref_w -= lr * m / (v.sqrt() + 1e-3)
    torch.testing.assert_close(w.double(), ref_w, rtol=1e-5, atol=1e-6)


def test_the_first_step_moves_every_coordinate_by_about_the_same_amount() -> None:
    """From zero moments, ``Delta = lr (1 - beta1) g / (sqrt(1 - beta2) |g| + tau)``: a scaled sign where |g| >> tau."""
    g = torch.tensor([5.0, -20.0, 50.0, -1e-6])
    _, delta = fedadam.step(fedadam.init(4), g, lr=1.0, beta1=0.9, beta2=0.99, tau=1e-3)
    scale = 0.1 / 0.1  # (1 - beta1) / sqrt(1 - beta2)
    torch.testing.assert_close(delta[:3], scale * torch.sign(g[:3]), rtol=2.5e-3, atol=0)
    assert abs(float(delta[3])) < 1e-3  # below tau the step shrinks with the update


def test_the_method_steps_on_the_weighted_mean_and_checks_its_settings() -> None:
    cfg = RunConfig.from_mapping({"strategy": "fedadam", "momentum": 0.5, "fedadam-beta2": 0.9, "fedadam-tau": 0.01})
    method = get_method("fedadam")
    a, b = torch.randn(D), torch.randn(D)
    updates = [ClientUpdate(0, {"update": a.numpy()}, 1, 0.0, 0), ClientUpdate(1, {"update": b.numpy()}, 3, 0.0, 0)]
    _, delta = method.server.step(
        method.server.init(cfg, D, torch.device("cpu")), Round(1, 0.2, updates, D, torch.device("cpu")), cfg
    )
    _, expected = fedadam.step(fedadam.init(D), (a + 3 * b) / 4, 0.2, beta1=0.5, beta2=0.9, tau=0.01)
    torch.testing.assert_close(delta, expected)
    with pytest.raises(ConfigError, match="fedadam-beta2"):
        RunConfig.from_mapping({"strategy": "fedadam", "fedadam-beta2": 1.5})


# where the moments live, and the message --------------------------------------------------------------------


def test_both_moments_live_on_the_device_asked_for() -> None:
    state = fedadam.init(4, "meta")
    assert state.m.device.type == state.v.device.type == "meta"
    assert state.m.shape == state.v.shape == (4,)
    cpu = fedadam.init(4)
    assert cpu.m.device.type == cpu.v.device.type == "cpu"


def test_an_update_of_the_wrong_shape_is_refused_with_both_shapes() -> None:
    with pytest.raises(ValueError, match=r"^update has shape \(5,\); expected \(4,\)$"):
        fedadam.step(fedadam.init(4), torch.zeros(5), 0.1, beta1=0.9, beta2=0.99, tau=1e-3)
