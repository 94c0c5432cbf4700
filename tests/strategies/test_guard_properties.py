"""Clipping (``clip-norm`` C), by its two properties on the server's real screening path.

An update whose norm is at most C reaches the method bit-identical; one above
C is scaled to norm exactly C (to float32 rounding), in its direction. The same
for the DP path's clip to the sensitivity, and for the factor itself
(``fedsketch.server.privacy.clip_factor``). McMahan et al., ICLR 2018 (DP-FedAvg).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedsketch.config import RunConfig
from fedsketch.methods import ClientUpdate, get_method
from fedsketch.methods.method import payload_norm
from fedsketch.server.privacy import clip_factor
from strategies import guard

D = 64
BOUND = 2.5
SEEDS = range(40)


def update_of_norm(cid: int, norm: float, rng: np.random.Generator) -> ClientUpdate:
    """A dense fedavg upload with a random direction and (to float32 rounding) the given norm."""
    v = rng.standard_normal(D)
    v = (v * (norm / np.linalg.norm(v))).astype(np.float32) if norm > 0 else np.zeros(D, np.float32)
    return ClientUpdate(cid, {"update": v}, 10, 0.0, 0)


def screened(updates: list[ClientUpdate]) -> tuple[list[ClientUpdate], guard.Screened]:
    cfg = RunConfig.from_mapping({"strategy": "fedavg", "clip-norm": BOUND})
    done = guard.screen(cfg, get_method("fedavg"), guard.noise_generator(), D, updates)
    return done.updates, done


def test_updates_inside_the_bound_are_left_bit_identical() -> None:
    rng = np.random.default_rng(0)
    norms = [0.0, 1e-6, BOUND / 2, BOUND * 0.999, *(BOUND * f for f in rng.uniform(0.01, 0.99, 30))]
    exact = np.zeros(D, np.float32)
    exact[3] = BOUND  # norm exactly the bound: not above it
    updates = [update_of_norm(i, n, rng) for i, n in enumerate(norms)] + [ClientUpdate(99, {"update": exact}, 1, 0, 0)]
    out, done = screened(updates)
    for before, after in zip(updates, out):
        got = after.payload["update"]
        assert got.dtype == np.float32 and np.array_equal(got, before.payload["update"]), before.cid
    assert done.clipped == 0


def test_updates_outside_the_bound_are_scaled_to_exactly_the_bound_in_their_direction() -> None:
    rng = np.random.default_rng(1)
    norms = [BOUND * 1.001, BOUND * 2, 1e4, *(BOUND * f for f in rng.uniform(1.01, 50.0, 30))]
    updates = [update_of_norm(i, n, rng) for i, n in enumerate(norms)]
    out, done = screened(updates)
    for before, after in zip(updates, out):
        got = after.payload["update"].astype(np.float64)
        assert after.payload["update"].dtype == np.float32
        assert np.linalg.norm(got) == pytest.approx(BOUND, rel=1e-6), before.cid
        sent = before.payload["update"].astype(np.float64)
        cosine = got @ sent / (np.linalg.norm(got) * np.linalg.norm(sent))
        assert cosine == pytest.approx(1.0, abs=1e-6)
    assert done.clipped == len(updates)


def test_a_mixed_round_clips_exactly_the_updates_above_the_bound() -> None:
    for seed in SEEDS:
        rng = np.random.default_rng(seed)
        norms = rng.uniform(0.0, 2 * BOUND, 8)
        updates = [update_of_norm(i, float(n), rng) for i, n in enumerate(norms)]
        out, done = screened(updates)
        above = [payload_norm(u) > BOUND for u in updates]
        assert done.clipped == sum(above)
        for before, after, big in zip(updates, out, above):
            if big:
                assert payload_norm(after) == pytest.approx(BOUND, rel=1e-6)
            else:
                assert np.array_equal(after.payload["update"], before.payload["update"])


def test_the_dp_sensitivity_clip_has_the_same_two_properties() -> None:
    rng = np.random.default_rng(2)
    updates = [update_of_norm(i, float(n), rng) for i, n in enumerate(rng.uniform(0.0, 2 * BOUND, 40))]
    out, clipped = guard.clip_updates(updates, BOUND, payload_norm, guard.scale_payload)
    assert clipped == sum(payload_norm(u) > BOUND for u in updates) > 0
    for before, after in zip(updates, out):
        if payload_norm(before) > BOUND:
            assert payload_norm(after) == pytest.approx(BOUND, rel=1e-6)
        else:
            assert after.payload["update"] is before.payload["update"]


def test_the_clip_factor_is_one_up_to_the_bound_and_bound_over_norm_above_it() -> None:
    gen = torch.Generator().manual_seed(3)
    for norm in torch.rand(200, generator=gen, dtype=torch.float64).tolist():
        inside, outside = norm * BOUND, BOUND + norm * 100 + 1e-9
        assert clip_factor(inside, BOUND) == 1.0
        assert clip_factor(outside, BOUND) * outside == pytest.approx(BOUND, rel=1e-15)
        assert clip_factor(outside, BOUND) < 1.0
    assert clip_factor(BOUND, BOUND) == 1.0 and clip_factor(0.0, BOUND) == 1.0
    assert math.isclose(clip_factor(4 * BOUND, BOUND), 0.25)
