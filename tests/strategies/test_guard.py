"""Clipping and client-level DP: what one client can do to the model, what the noise is, and its exact values.

The noisy mean is ``(sum of clipped payloads + N(0, (sigma C s)^2)) / m``,
summed in float64, with the noise drawn from the generator the server keeps;
re-drawing the noise from a copy of that generator gives the same values to
the bit. FetchSGD clips a table to ``C`` by its norm estimate, and, with DP,
to Frobenius norm ``C sqrt(rows)`` (McMahan et al., ICLR 2018; Rothchild et
al., ICML 2020).
"""

from __future__ import annotations

import dataclasses
import json
import math
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import ConfigRecord

from bridge.flower import task_identity
from bridge.messages import model_record
from fedsketch.config import ConfigError, RunConfig
from fedsketch.methods import ClientUpdate, get_method
from fedsketch.methods.method import payload_norm
from fedsketch.sketch.count_sketch import CountSketch
from strategies import guard
from strategies.guard import clip_updates, noisy_mean, scale_payload
from strategies.server_app import build_strategy
from tests.federation import TestGrid

TINY = {"num-clients": 20, "clients-per-round": 6, "model-hidden": 16, "k": 30, "sketch-rows": 3, "sketch-cols": 400}


def one_round(settings: dict[str, object], boost: float = 1.0) -> tuple[torch.Tensor, object]:
    """Weights change and strategy after one round in which client replies are scaled by ``boost``."""
    cfg = RunConfig.from_mapping({**TINY, **settings})
    strat = build_strategy(cfg, None)
    grid = TestGrid(cfg.to_mapping())
    w0 = strat.weights.clone()
    with task_identity():
        replies = grid.send_and_receive(strat.configure_train(1, model_record(w0.numpy()), ConfigRecord(), grid))
        if boost != 1.0:
            for msg in replies:
                for record in msg.content.array_records.values():
                    for key in list(record):
                        record[key] = type(record[key])(record[key].numpy() * np.float32(boost))
        strat.aggregate_train(1, replies)
    return strat.weights - w0, strat


def test_fedavg_clipping_bounds_the_update_whatever_the_clients_send() -> None:
    """lr 1, no momentum: the update is a mean of clipped vectors, so its norm is at most clip-norm."""
    settings = {"strategy": "fedavg", "lr": 1.0, "momentum": 0.0, "clip-norm": 0.05}
    for boost in (1.0, 1e6):
        delta, strat = one_round(settings, boost)
        assert float(delta.norm()) <= 0.05 * (1 + 1e-5)
    assert strat.books.totals["clipped"] == 6
    unclipped, _ = one_round({**settings, "clip-norm": 0.0}, 1e6)
    assert float(unclipped.norm()) > 1e3


def test_fetchsgd_clips_on_the_sketchs_norm_estimate() -> None:
    cfg = RunConfig.from_mapping({**TINY, "clip-norm": 1.0})
    strat = build_strategy(cfg, None)
    norm = strat.method.privacy.norm
    assert norm is not None

    def norm_of(u: ClientUpdate) -> float:
        return norm(u, cfg, strat.d)

    gen = torch.Generator().manual_seed(0)
    updates = []
    for cid, scale in enumerate((0.1, 10.0, 1e5)):
        sketch = CountSketch(strat.d, cfg.sketch_rows, cfg.sketch_cols, seed=cfg.seed)
        sketch.accumulate(scale * torch.randn(strat.d, generator=gen) / math.sqrt(strat.d))
        updates.append(ClientUpdate(cid, {"table": sketch.table.numpy()}, 10, 0.0, 0))
    out, clipped = clip_updates(updates, 1.0, norm_of, scale_payload)
    assert clipped == 2
    norms = [norm_of(u) for u in out]
    assert norms[0] == pytest.approx(norm_of(updates[0]))  # below the bound: untouched
    assert norms[1:] == pytest.approx([1.0, 1.0], rel=1e-5)
    # the estimate is the sketched vector's norm, about: 0.1 and 10 here
    assert [norm_of(u) for u in updates[:2]] == pytest.approx([0.1, 10.0], rel=0.3)


def test_noisy_mean_clips_to_the_sensitivity_and_adds_noise_of_the_right_size() -> None:
    gen = np.random.default_rng(0)
    updates = [
        ClientUpdate(c, {"table": gen.standard_normal((50, 400)).astype(np.float32)}, 10, 0.0, 0) for c in range(4)
    ]
    bound, sigma, expected = 2.0, 0.5, 10
    clipped, _ = clip_updates(updates, bound, payload_norm, scale_payload)
    plain = sum(u.payload["table"].astype(np.float64) for u in clipped)
    noisy = noisy_mean(updates, bound, sigma, expected, torch.Generator().manual_seed(1))
    assert all(payload_norm(u) == pytest.approx(bound, rel=1e-5) for u in clipped)
    noise = noisy.payload["table"].astype(np.float64) * expected - plain
    assert noise.std() == pytest.approx(sigma * bound, rel=0.02)  # 20,000 draws
    assert abs(noise.mean()) < 0.05 * sigma * bound
    assert noisy.num_examples == 1


def test_dp_fetchsgd_reports_its_budget_every_row(tmp_path: Path) -> None:
    cfg = RunConfig.from_mapping(
        {**TINY, "num-rounds": 3, "eval-every": 1, "clip-norm": 1.0, "dp-noise-multiplier": 1.1, "dp-delta": 1e-5}
    )
    strat = build_strategy(cfg, tmp_path)
    with task_identity():
        strat.start(TestGrid(cfg.to_mapping()))
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    eps = [row["dp_epsilon"] for row in rows]
    assert [row["dp_rounds"] for row in rows] == [1, 2, 3]
    assert 0 < eps[0] < eps[1] < eps[2] < math.inf
    assert rows[0]["dp_sampling_rate"] == pytest.approx(6 / 20) and rows[0]["dp_noise_multiplier"] == 1.1


def test_dp_noise_does_not_come_from_the_run_seed() -> None:
    settings = {"clip-norm": 1.0, "dp-noise-multiplier": 1.0}
    first, _ = one_round(settings)
    second, _ = one_round(settings)
    assert not torch.equal(first, second)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"dp-noise-multiplier": 1.0}, "needs 'clip-norm' > 0"),
        ({"strategy": "qsgd", "dp-noise-multiplier": 1.0, "clip-norm": 1.0}, "add up linearly"),
        ({"strategy": "sketched_sgd", "clip-norm": 1.0}, "not available for sketched_sgd"),
        ({"clip-norm": -1.0}, "'clip-norm' must be >= 0"),
        ({"dp-delta": 0.0}, r"'dp-delta' must be in \(0, 1\)"),
    ],
)
def test_settings_that_cannot_work_are_refused(settings: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        RunConfig.from_mapping(settings)


def test_scaling_a_payload_keeps_its_dtypes() -> None:
    u = ClientUpdate(
        0, {"val": np.ones(4, np.float32), "idx": np.arange(4, dtype=np.int32)}, 1, 0.0, 0, decoded=torch.ones(4)
    )
    out = scale_payload(u, 0.5)
    assert out.payload["val"].dtype == np.float32 and np.all(out.payload["val"] == 0.5)
    assert np.array_equal(out.payload["idx"], u.payload["idx"])
    assert torch.equal(out.decoded, torch.full((4,), 0.5))  # type: ignore[arg-type]
    assert dataclasses.replace(u) == u


# clipping and the noisy mean by exact values the clipping tests leave open ----------------------------------


SKETCH = {"sketch-rows": 4, "sketch-cols": 50}


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def reference_mean(payloads: list[np.ndarray], std: float, expected: int, seed: int) -> np.ndarray:
    """The noisy mean of payloads already inside the bound, in float64, with the noise of generator ``seed``."""
    total = np.sum([p.astype(np.float64) for p in payloads], axis=0)
    noise = torch.normal(0.0, std, size=payloads[0].shape, generator=seeded(seed), dtype=torch.float64).numpy()
    return (total + noise) / expected


def test_the_noisy_mean_is_the_float64_sum_plus_the_generators_noise_over_the_expected_count() -> None:
    # 2**24 + 1 - 2**24 is 1 in float64 and 0 in float32: the sum must be float64
    payloads = [np.array([2.0**24, 3.0, 0.0]), np.array([1.0, -1.0, 0.5]), np.array([-(2.0**24), 0.25, 0.0])]
    updates = [ClientUpdate(c, {"v": p}, 10, float(c), 100 + c) for c, p in enumerate(payloads)]
    bound, sigma, expected = 2.0**25, 1e-6, 7
    noisy = guard.noisy_mean(updates, bound, sigma, expected, seeded(11))
    want = reference_mean(payloads, sigma * bound, expected, 11)
    assert noisy.payload["v"].dtype == np.float64
    assert np.array_equal(noisy.payload["v"], want)
    assert noisy.num_examples == 1 and noisy.cid < 0  # one update of weight 1, from no client
    assert noisy.loss == 1.0 and noisy.upload_bytes == 303


def test_the_noisy_mean_keeps_each_arrays_dtype_and_works_for_a_single_update() -> None:
    table = np.arange(12, dtype=np.float32).reshape(3, 4) / 10
    update = ClientUpdate(3, {"table": table, "extra": np.ones(2, np.float32)}, 5, float("nan"), 40)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "mean of empty slice" when every loss is NaN
        noisy = guard.noisy_mean([update], 100.0, 0.01, 4, seeded(2))
    assert noisy.payload["table"].dtype == np.float32 and noisy.payload["extra"].dtype == np.float32
    gen = seeded(2)
    for name in ("table", "extra"):
        arr = update.payload[name]
        noise = torch.normal(0.0, 1.0, size=arr.shape, generator=gen, dtype=torch.float64).numpy()
        assert np.array_equal(noisy.payload[name], ((arr.astype(np.float64) + noise) / 4).astype(np.float32))
    assert math.isnan(noisy.loss) and noisy.upload_bytes == 40


def test_the_noisy_mean_clips_each_payload_to_the_bound_before_summing() -> None:
    big, small = np.array([30.0, 40.0]), np.array([0.3, 0.4])  # norms 50 and 0.5
    updates = [ClientUpdate(0, {"v": big}, 1, 2.0, 1), ClientUpdate(1, {"v": small}, 1, float("nan"), 1)]
    noisy = guard.noisy_mean(updates, 5.0, 0.001, 2, seeded(4))
    clipped = (big * np.float32(0.1)).astype(np.float64)  # scaled by bound / norm, the factor in float32
    assert np.array_equal(noisy.payload["v"], reference_mean([clipped, small], 0.005, 2, 4))
    assert noisy.loss == 2.0  # the NaN loss is left out of the mean


def screened(
    cfg: RunConfig, updates: list[ClientUpdate], d: int, seed: int = 0
) -> tuple[list[ClientUpdate], guard.Screened]:
    done = guard.screen(cfg, get_method(cfg.strategy), seeded(seed), d, updates)
    return done.updates, done


def test_dp_screening_is_the_noisy_mean_at_clip_norm_times_the_sensitivity() -> None:
    cfg = RunConfig.from_mapping(
        {"strategy": "fetchsgd", **SKETCH, "clip-norm": 2.0, "dp-noise-multiplier": 0.5, "clients-per-round": 4}
    )
    bound = 4.0  # C sqrt(rows) = 2 * 2
    inside, on_bound = np.zeros((4, 50), np.float32), np.zeros((4, 50), np.float32)
    inside[0, 0], on_bound[1, 2] = 3.0, 4.0  # Frobenius norms 3 and exactly 4: neither is clipped
    huge = np.full((4, 50), 10.0, np.float32)
    updates = [ClientUpdate(c, {"table": t}, 10, 0.0, 0) for c, t in enumerate((inside, on_bound, huge))]
    out, done = screened(cfg, updates, 200, seed=9)
    assert len(out) == 1 and done.noised and done.clipped == 1
    want = guard.noisy_mean(updates, bound, 0.5, 4, seeded(9))
    assert np.array_equal(out[0].payload["table"], want.payload["table"])
    assert not np.array_equal(want.payload["table"], guard.noisy_mean(updates, 2.0, 0.5, 4, seeded(9)).payload["table"])


def test_dp_below_one_still_adds_noise() -> None:
    cfg = RunConfig.from_mapping({"strategy": "fedavg", "clip-norm": 1.0, "dp-noise-multiplier": 0.5})
    updates = [ClientUpdate(0, {"update": np.zeros(1000, np.float32)}, 1, 0.0, 0)]
    out, done = screened(cfg, updates, 1000, seed=1)
    noise = out[0].payload["update"].astype(np.float64) * cfg.clients_per_round
    assert done.noised and noise.std() == pytest.approx(0.5, rel=0.1)


def test_clip_norm_zero_leaves_every_update_and_a_bound_below_one_still_clips() -> None:
    updates = [ClientUpdate(c, {"update": np.array([3.0, 4.0], np.float32) * c}, 1, 0.0, 0) for c in (1, 2)]
    off, done = screened(RunConfig.from_mapping({"strategy": "fedavg", "clip-norm": 0.0}), updates, 2)
    assert all(a is b for a, b in zip(off, updates)) and done.clipped == 0
    half, done = screened(RunConfig.from_mapping({"strategy": "fedavg", "clip-norm": 0.5}), updates, 2)
    assert [payload_norm(u) for u in half] == pytest.approx([0.5, 0.5], rel=1e-6) and done.clipped == 2


def test_fetchsgd_clipping_scales_a_table_to_the_bound_of_its_own_norm_estimate() -> None:
    cfg = RunConfig.from_mapping({"strategy": "fetchsgd", **SKETCH, "clip-norm": 1.0})
    d, gen = 500, seeded(0)
    updates = []
    for cid, scale in enumerate((0.2, 30.0)):
        sketch = CountSketch(d, 4, 50, seed=cfg.seed)
        sketch.accumulate(scale * torch.randn(d, generator=gen) / math.sqrt(d))
        updates.append(ClientUpdate(cid, {"table": sketch.table.numpy()}, 10, 0.0, 0))
    out, done = screened(cfg, updates, d)

    def estimate(u: ClientUpdate) -> float:
        return CountSketch.from_table(torch.from_numpy(u.payload["table"]), d, cfg.seed).l2_estimate()

    assert done.clipped == 1
    assert out[0] is updates[0] and estimate(updates[0]) < 1.0
    assert estimate(out[1]) == pytest.approx(1.0, rel=1e-6)
    # not the table's Frobenius norm: the median row has norm 1, one more row at least 1
    assert payload_norm(out[1]) > 1.4


def test_scaling_scales_the_decoded_vector_and_the_diagnostic_arrays_with_the_payload() -> None:
    diagnostic = {"dense": np.array([2.0, -4.0], np.float32), "idx": np.array([1, 3], np.int64)}
    u = ClientUpdate(
        0,
        {"val": np.array([1.0, 3.0], np.float32)},
        1,
        0.0,
        0,
        decoded=torch.tensor([1.0, 3.0], dtype=torch.float64),
        diagnostic=diagnostic,
    )
    out = guard.scale_payload(u, 0.25)
    assert out.diagnostic is not None
    assert np.array_equal(out.diagnostic["dense"], np.array([0.5, -1.0], np.float32))
    assert out.diagnostic["dense"].dtype == np.float32 and out.diagnostic["idx"] is diagnostic["idx"]
    assert torch.equal(out.decoded, torch.tensor([0.25, 0.75], dtype=torch.float64))  # type: ignore[arg-type]
    assert np.array_equal(out.payload["val"], np.array([0.25, 0.75], np.float32))
    plain = guard.scale_payload(dataclasses.replace(u, decoded=None, diagnostic=None), 0.5)
    assert plain.decoded is None and plain.diagnostic is None


@dataclasses.dataclass(frozen=True)
class Held:
    momentum: torch.Tensor
    error: object


def test_all_finite_looks_into_tensors_dataclasses_and_mappings() -> None:
    nan = torch.tensor([1.0, float("nan")])
    inf = torch.tensor([float("inf")], dtype=torch.float64)
    ok = torch.ones(2)
    assert guard.all_finite(None) and guard.all_finite(ok) and guard.all_finite(torch.arange(3))
    assert guard.all_finite(torch.tensor([True, False])) and guard.all_finite(3.0)
    assert not guard.all_finite(nan) and not guard.all_finite(inf)
    assert guard.all_finite(Held(ok, {"a": ok, "b": torch.arange(2)}))
    assert not guard.all_finite(Held(ok, {"a": ok, "b": nan}))
    assert not guard.all_finite(Held(inf, None))
    assert guard.all_finite({"x": ok, "y": None}) and not guard.all_finite({"x": ok, "y": inf})
    assert guard.all_finite(Held)  # a class is not a value


def test_the_noise_generator_is_seeded_afresh_every_time() -> None:
    seeds = {guard.noise_generator().initial_seed() for _ in range(20)}
    assert len(seeds) == 20 and all(0 <= s < 2**64 for s in seeds)
