"""``merge-uploads``: a node's merged reply gives the server what the clients' own replies would have.

The mean of the nodes' example-weighted means is the mean of the clients' uploads (in float64 the two
agree to rounding); every client is billed the bytes of the upload record it would have sent, counted,
and judged by the server's own checks, so a bad upload inside a merged reply is still rejected.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
import torch
from flwr.app import ConfigRecord
from flwr.serverapp import Grid

from bridge.flower import task_identity
from bridge.messages import payload_bytes, payload_to_record, wire_bytes
from fedsketch.algorithms.aggregate import weighted_mean
from fedsketch.client.uploads import beyond_bound, clip_payload, merge, mergeable, set_aside
from fedsketch.config import RunConfig
from fedsketch.methods import ClientUpdate
from strategies.server_app import build_strategy
from strategies.strategy import FedSketchStrategy
from tests.federation import TestGrid
from tests.method_helpers import encode

BASE = {"num-clients": 12, "clients-per-round": 6, "model-hidden": 16, "k": 30, "num-rounds": 3, "eval-every": 1}


@pytest.mark.parametrize("strategy", ["fetchsgd", "fedavg"])
def test_the_mean_of_node_means_is_the_mean_of_the_uploads_in_float64(strategy: str) -> None:
    cfg = RunConfig.from_mapping({**BASE, "strategy": strategy, "sketch-rows": 3, "sketch-cols": 50})
    gen = torch.Generator().manual_seed(1)
    payloads = [encode(cfg, torch.randn(400, generator=gen), cid=c)[0] for c in range(7)]
    payloads = [{k: v.astype(np.float64) for k, v in p.items()} for p in payloads]
    weights = [3, 1, 4, 1, 5, 9, 2]
    spec = {k: (v.shape, v.dtype) for k, v in payloads[0].items()}
    nodes = [(0, 3), (3, 4), (4, 7)]  # three nodes' cohorts
    means = [merge(payloads[a:b], weights[a:b], spec, torch.device("cpu")) for a, b in nodes]
    totals = [sum(weights[a:b]) for a, b in nodes]
    for name in spec:
        per_client = weighted_mean([p[name] for p in payloads], weights)
        by_node = weighted_mean([m[name] for m in means], totals)
        assert per_client.dtype == by_node.dtype == torch.float64
        torch.testing.assert_close(by_node, per_client, rtol=1e-13, atol=1e-15)
        assert not torch.equal(by_node, weighted_mean([p[name] for p in payloads], [1] * 7))  # the weights count


def test_merge_uses_the_weights_and_keeps_the_layout_dtype() -> None:
    payloads = [{"t": np.full((2, 3), v, np.float32)} for v in (1.0, 4.0)]
    out = merge(payloads, [3, 1], {"t": ((2, 3), np.dtype(np.float32))}, torch.device("cpu"))
    assert out["t"].dtype == np.float32
    np.testing.assert_array_equal(out["t"], np.full((2, 3), 1.75, np.float32))


@pytest.mark.parametrize(
    "payload",
    [
        {"table": np.random.default_rng(0).standard_normal((5, 500_000)).astype(np.float32)},  # two chunks
        {"update": np.zeros(4_000_000, np.float32)},  # equal chunks, sent once
        {"a": np.ones(3, np.float32), "b": np.ones(3, np.float32)},  # equal arrays, sent once
        {"i": np.arange(5, dtype=np.int64), "m": np.array([True])},
    ],
    ids=["table", "zeros", "twins", "ints"],
)
def test_payload_bytes_is_the_serialized_record(payload: dict[str, np.ndarray]) -> None:
    assert payload_bytes(payload) == wire_bytes(payload_to_record(payload))


def test_clipping_scales_each_float_array_in_its_own_dtype_and_leaves_the_rest_as_sent() -> None:
    payload = {
        "half": np.array([2.0, -6.0], np.float16),
        "single": np.array([[1.0, 3.0]], np.float32),
        "double": np.array([0.1], np.float64),
        "idx": np.array([3, 7], np.int32),
        "mask": np.array([1, 5], np.uint8),
    }
    out = clip_payload(payload, 0.5)
    assert {k: v.dtype for k, v in out.items()} == {k: v.dtype for k, v in payload.items()}
    np.testing.assert_array_equal(out["half"], np.array([1.0, -3.0], np.float16))
    np.testing.assert_array_equal(out["single"], np.array([[0.5, 1.5]], np.float32))
    assert out["double"][0] == np.float64(0.1) * np.float32(0.5)
    assert out["idx"] is payload["idx"] and out["mask"] is payload["mask"]
    assert payload["single"][0, 1] == 3.0  # the payload given is not written to


def test_an_upload_is_beyond_the_bound_exactly_when_its_norm_exceeds_bound_times_the_median() -> None:
    rng = np.random.default_rng(5)
    for _ in range(300):
        norms = [float(x) for x in rng.choice([0.0, 1.0, 2.0, 3.0, 5.5, 7.0], size=int(rng.integers(1, 8)))]
        bound = float(rng.choice([0.5, 1.0, 1.5, 2.0, 3.0]))
        median = statistics.median(norms)
        assert beyond_bound(norms, bound) == [median > 0 and n > bound * median for n in norms], (norms, bound)


def _uploads(*norms: float) -> list[ClientUpdate]:
    return [ClientUpdate(cid, {"update": np.array([n, 0.0], np.float32)}, 1, 0.0, 0) for cid, n in enumerate(norms)]


@pytest.mark.parametrize(
    ("settings", "norms", "aside"),
    [
        ({"norm-bound": 1.5}, (1.0, 10.0), [1]),  # two uploads: median 5.5, and 10 > 8.25
        ({"norm-bound": 1.0}, (1.0, 1.0, 5.0), [2]),  # a bound of 1 is a bound: beyond the median itself
        ({"norm-bound": 0.0}, (1.0, 1.0, 500.0), []),  # off
        ({"norm-bound": 1.0, "dp-noise-multiplier": 0.5, "clip-norm": 1.0}, (1.0, 1.0, 500.0), []),  # DP clips
        ({"norm-bound": 1.0, "strategy": "sketched_sgd"}, (1.0, 1.0, 500.0), []),  # no norm the server reads
        ({"norm-bound": 1.0}, (500.0,), []),  # one upload is its own median
    ],
    ids=["two", "bound-one", "off", "dp", "no-norm", "alone"],
)
def test_set_aside_takes_out_the_uploads_beyond_the_bound_and_only_where_it_applies(
    settings: dict[str, Any], norms: tuple[float, ...], aside: list[int]
) -> None:
    cfg = RunConfig.from_mapping({"strategy": "fedavg", **settings})
    updates = _uploads(*norms)
    kept, why = set_aside(cfg, 2, updates, "the test's")
    assert sorted(why) == aside and [u.cid for u in kept] == [u.cid for u in updates if u.cid not in aside]
    for reason in why.values():
        assert reason.startswith("upload norm ") and "x the test's median" in reason


def _run(cfg: RunConfig, rounds: int) -> FedSketchStrategy:
    strat = build_strategy(cfg, None)
    grid = cast(Grid, TestGrid(cfg.to_mapping(), num_nodes=2))
    with task_identity():
        for rnd in range(1, rounds + 1):
            strat.run_round(rnd, grid, ConfigRecord())
            strat.log_row(rnd, 0.0)
    return strat


BOOKS = ("upload", "download", "clients", "dense", "failures", "rejected", "client_errors", "clipped")


@pytest.mark.parametrize(
    "settings",
    [
        {"strategy": "fetchsgd"},
        {"strategy": "fedavg"},
        {"strategy": "true_topk", "download": "sparse"},
        {"strategy": "fetchsgd", "clip-norm": 0.05},
    ],
    ids=["fetchsgd", "fedavg", "true_topk-sparse-download", "fetchsgd-clipped"],
)
def test_merged_rounds_bill_count_and_move_the_model_as_per_client_rounds(settings: dict[str, Any]) -> None:
    cfg = RunConfig.from_mapping({**BASE, **settings})
    merged_cfg = RunConfig.from_mapping({**BASE, **settings, "merge-uploads": True})
    assert mergeable(merged_cfg) and not mergeable(cfg)
    alone, merged = _run(cfg, 3), _run(merged_cfg, 3)
    for row, other in zip(alone.history, merged.history, strict=True):
        assert {k: row[k] for k in row if k.startswith(BOOKS)} == {k: other[k] for k in other if k.startswith(BOOKS)}
    assert merged.history[-1]["cum_upload_bytes"] > 0 and merged.history[-1]["clients"] == 6
    if "clip-norm" in settings:
        assert merged.history[-1]["clipped"] > 0
    torch.testing.assert_close(merged.weights, alone.weights, rtol=1e-4, atol=1e-6)


def test_a_bad_upload_inside_a_merged_reply_is_rejected_and_counted(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((48, 6)).astype(np.float32)
    y = (np.arange(48) % 3).astype(np.int64)
    x[:4] = np.float32(1e30)  # whoever holds these overflows: an upload with Inf or beyond MAX_ABS
    np.savez(tmp_path / "d.npz", x_train=x, y_train=y, x_test=x[4:12], y_test=y[4:12])
    base = {
        **BASE,
        "strategy": "fedavg",
        "dataset": "npz",
        "data-root": str(tmp_path / "d.npz"),
        "partition": "iid",
        "clients-per-round": 12,
        "local-batch-size": 4,
    }
    alone = _run(RunConfig.from_mapping(base), 1)
    merged = _run(RunConfig.from_mapping({**base, "merge-uploads": True}), 1)
    assert merged.history[0]["rejected"] == alone.history[0]["rejected"] >= 1
    assert merged.history[0]["clients"] == alone.history[0]["clients"] == 12 - alone.history[0]["rejected"]
    assert merged.history[0]["upload_bytes"] == alone.history[0]["upload_bytes"]
    assert torch.isfinite(merged.weights).all()
    torch.testing.assert_close(merged.weights, alone.weights, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize(
    "settings",
    [
        {"strategy": "local_topk"},  # clients keep state
        {"strategy": "sketched_sgd"},  # a second exchange
        {"strategy": "fetchsgd", "diagnose-sketch": True},
        {"strategy": "fedavg", "dp-noise-multiplier": 1.0, "clip-norm": 1.0},
        {"strategy": "qsgd"},  # uploads do not add up
    ],
    ids=["client-state", "second-exchange", "diagnose", "dp", "not-linear"],
)
def test_only_uploads_that_add_up_and_need_nothing_alone_are_merged(settings: dict[str, Any]) -> None:
    assert not mergeable(RunConfig.from_mapping({**BASE, **settings, "merge-uploads": True}))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_node_merges_on_the_gpu_as_on_the_cpu() -> None:
    rng = np.random.default_rng(2)
    payloads = [{"table": rng.standard_normal((5, 500_000)).astype(np.float32)} for _ in range(9)]
    spec = {"table": ((5, 500_000), np.dtype(np.float32))}
    weights = [5, 3, 5, 1, 5, 5, 2, 5, 4]
    on_gpu = merge(payloads, weights, spec, torch.device("cuda"))["table"]
    np.testing.assert_allclose(
        on_gpu, merge(payloads, weights, spec, torch.device("cpu"))["table"], rtol=1e-5, atol=1e-6
    )
