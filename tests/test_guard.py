"""Clipping and client-level DP: what one client can do to the model, and what the noise is."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import ConfigRecord

from bridge.messages import model_record
from bridge.flower import task_identity
from tests.federation import TestGrid
from fedsketch.config import ConfigError, RunConfig
from fedsketch.methods import ClientUpdate
from fedsketch.methods.method import payload_norm
from fedsketch.sketch.count_sketch import CountSketch
from strategies.guard import clip_updates, noisy_mean, scale_payload
from strategies.server_app import build_strategy

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
