"""The RDP accountant of the sampled Gaussian mechanism, against published and exact values."""

from __future__ import annotations

import math

import pytest

from fedsketch.config import RunConfig
from fedsketch.server.privacy import clip_factor, epsilon, privacy_metrics, rdp_sampled_gaussian


def test_matches_tensorflow_privacys_reference_values() -> None:
    """Values from TensorFlow Privacy's rdp_accountant_test.py (integer orders, classic conversion)."""
    assert 10 * rdp_sampled_gaussian(0.1, 2.0, 5) == pytest.approx(0.07737, abs=1e-5)
    got = [50 * rdp_sampled_gaussian(0.01, 2.5, order) for order in (5, 50, 100)]
    assert got == pytest.approx([0.00218075, 0.023846, 167.416307], abs=1e-5)
    eps, order = epsilon(0.01, 4.0, 10_000, 1e-5, orders=range(2, 33))
    assert eps == pytest.approx(1.258575, abs=1e-6)
    assert order == 20


def test_without_sampling_it_is_the_gaussian_mechanism() -> None:
    """q = 1: RDP of N(0, sigma^2) noise on a sensitivity-1 query is a / (2 sigma^2) exactly."""
    for sigma, order in ((10.0, 20), (0.7, 3), (2.0, 256)):
        assert rdp_sampled_gaussian(1.0, sigma, order) == pytest.approx(order / (2 * sigma**2), rel=1e-12)
    assert rdp_sampled_gaussian(0.0, 1.0, 8) == 0.0


@pytest.mark.parametrize(("q", "sigma", "order"), [(1e-3, 1.0, 2), (0.01, 10.0, 20), (0.1, 1.5, 8), (0.5, 3.0, 12)])
def test_equals_the_renyi_divergence_by_numerical_integration(q: float, sigma: float, order: int) -> None:
    """A_a = E_{z ~ N(0, s^2)} [((1 - q) + q exp((2z - 1) / (2 s^2)))^a], integrated in multi-precision."""
    mp = pytest.importorskip("mpmath")
    mp.mp.dps = 40

    def integrand(z: object) -> object:
        ratio = (1 - q) + q * mp.exp((2 * z - 1) / (2 * sigma**2))
        return mp.npdf(z, 0, sigma) * ratio**order

    exact = float(mp.log(mp.quad(integrand, [-mp.inf, 0, 1, mp.inf]))) / (order - 1)
    assert rdp_sampled_gaussian(q, sigma, order) == pytest.approx(exact, rel=1e-8)


def test_budget_grows_with_rounds_and_shrinks_with_noise() -> None:
    q, delta = 10 / 100, 1e-5
    by_rounds = [epsilon(q, 1.0, rounds, delta)[0] for rounds in (0, 1, 10, 100)]
    assert by_rounds[0] == 0.0 and by_rounds == sorted(by_rounds)
    by_noise = [epsilon(q, sigma, 100, delta)[0] for sigma in (0.5, 1.0, 2.0, 4.0)]
    assert by_noise == sorted(by_noise, reverse=True)
    assert math.isfinite(by_noise[0])


def test_clip_factor() -> None:
    assert clip_factor(0.0, 1.0) == 1.0
    assert clip_factor(0.5, 1.0) == 1.0
    assert clip_factor(4.0, 1.0) == 0.25


@pytest.mark.parametrize(
    ("args", "message"),
    [((1.5, 1.0, 4), "sampling rate"), ((0.1, 0.0, 4), "noise"), ((0.1, 1.0, 1), "order"), ((0.1, 1.0, 2.5), "order")],
)
def test_bad_arguments_are_refused(args: tuple[float, float, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        rdp_sampled_gaussian(*args)


@pytest.mark.parametrize(("rounds", "delta"), [(-1, 1e-5), (3, 0.0), (3, 1.0), (3, 1.5)])
def test_a_budget_needs_rounds_from_zero_and_delta_strictly_between_zero_and_one(rounds: int, delta: float) -> None:
    with pytest.raises(ValueError, match=rf"need rounds >= 0 and delta in \(0, 1\); got {rounds}, {delta}"):
        epsilon(0.1, 1.0, rounds, delta)


def test_no_round_spends_nothing_at_the_first_order_given() -> None:
    assert epsilon(0.1, 1.0, 0, 1e-5, orders=(7, 3, 5)) == (0.0, 7)


def test_a_runs_privacy_columns_are_its_budget_after_the_rounds_and_nothing_without_noise() -> None:
    assert privacy_metrics(RunConfig(), 5) == {}
    cfg = RunConfig.from_mapping(
        {"num-clients": 40, "clients-per-round": 10, "dp-noise-multiplier": 1.3, "dp-delta": 1e-4, "clip-norm": 1.0}
    )
    eps, order = epsilon(10 / 40, 1.3, 7, 1e-4)
    assert privacy_metrics(cfg, 7) == {
        "dp_epsilon": eps,
        "dp_delta": 1e-4,
        "dp_noise_multiplier": 1.3,
        "dp_sampling_rate": 0.25,
        "dp_rounds": 7,
        "dp_order": order,
    }
    assert 0 < eps < privacy_metrics(cfg, 70)["dp_epsilon"]
    little = RunConfig.from_mapping({"dp-noise-multiplier": 0.5, "clip-norm": 1.0})  # any noise counts, below 1 too
    assert privacy_metrics(little, 1)["dp_noise_multiplier"] == 0.5
