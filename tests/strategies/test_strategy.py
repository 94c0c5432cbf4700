"""The baselines' Flower strategies, driven by hand (no Flower run): decode, aggregate, step."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, MetricRecord, RecordDict
from flwr.serverapp.strategy.strategy_utils import aggregate_arrayrecords

from fedsketch.config import RunConfig
from fedsketch.methods import ClientUpdate
from strategies.plan import assign_homes
from strategies.server_app import build_strategy
from strategies.strategy import FedSketchStrategy
from tests.method_helpers import encode, step

TINY = {"num-clients": 20, "clients-per-round": 4, "model-hidden": 16, "k": 30, "num-rounds": 3}
CIDS = [2, 5, 11]
EXAMPLES = [10, 30, 60]


def strategy(name: str, **settings: object) -> tuple[FedSketchStrategy, RunConfig]:
    cfg = RunConfig.from_mapping({**TINY, "strategy": name, **settings})
    return build_strategy(cfg, None), cfg


def updates(strat: FedSketchStrategy, cfg: RunConfig, vectors: list[torch.Tensor]) -> list[ClientUpdate]:
    """What the strategy would accept from three clients uploading these vectors in round 1."""
    check = strat.method.wire.layout(cfg, strat.d, 1)
    out = []
    for cid, n, vec in zip(CIDS, EXAMPLES, vectors):
        payload, _ = encode(cfg, vec, cid=cid)
        decoded = check(payload) if callable(check) else None
        out.append(ClientUpdate(cid, payload, n, 0.5, 0, 0, decoded))
    return out


def vectors(d: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(d, generator=gen) for _ in CIDS]


def test_fedavg_matches_flowers_fedavg_aggregation() -> None:
    """lr 1, no momentum, clients upload w - w_i: our update lands on Flower's weighted mean of the w_i."""
    strat, cfg = strategy("fedavg", lr=1.0, momentum=0.0, **{"client-update": "delta"})
    w = strat.weights.clone()
    deltas = vectors(strat.d)
    ours = w - step(strat, updates(strat, cfg, deltas))
    replies = [
        RecordDict(
            {"arrays": ArrayRecord({"w": Array((w - delta).numpy())}), "metrics": MetricRecord({"num-examples": n})}
        )
        for delta, n in zip(deltas, EXAMPLES)
    ]
    flower = aggregate_arrayrecords(replies, "num-examples")["w"].numpy()
    np.testing.assert_allclose(ours.numpy(), flower, rtol=1e-5, atol=1e-6)


def test_true_topk_applies_k_coordinates_of_the_weighted_mean() -> None:
    strat, cfg = strategy("true_topk", momentum=0.0, lr=1.0)
    vecs = vectors(strat.d)
    delta = step(strat, updates(strat, cfg, vecs))
    mean = sum(n / sum(EXAMPLES) * v for n, v in zip(EXAMPLES, vecs))
    support = torch.nonzero(delta).reshape(-1)
    assert support.numel() == cfg.k
    torch.testing.assert_close(delta[support], mean[support])
    assert set(support.tolist()) == set(torch.topk(mean.abs(), cfg.k).indices.tolist())


@pytest.mark.parametrize("name", ["local_topk", "random_k", "gaussiank", "qsgd", "terngrad", "signsgd"])
def test_compressed_uploads_average_what_the_clients_sent(name: str) -> None:
    strat, cfg = strategy(name, momentum=0.0, lr=0.5)
    got = updates(strat, cfg, vectors(strat.d))
    decoded = [u.decoded for u in got]
    assert all(isinstance(x, torch.Tensor) and x.shape == (strat.d,) for x in decoded)
    delta = step(strat, got)
    mean = sum(n / sum(EXAMPLES) * x for n, x in zip(EXAMPLES, decoded))  # type: ignore[misc]
    torch.testing.assert_close(delta, 0.5 * mean)
    assert (strat.method.client.state_vectors(cfg) > 0) == (name in ("local_topk", "random_k", "gaussiank", "signsgd"))


def test_signsgd_majority_applies_the_vote() -> None:
    strat, cfg = strategy("signsgd", momentum=0.0, lr=0.01, **{"signsgd-variant": "majority"})
    vecs = vectors(strat.d)
    delta = step(strat, updates(strat, cfg, vecs))
    vote = torch.sign(sum(torch.where(v < 0, -1.0, 1.0) for v in vecs))  # zeros are sent as +
    torch.testing.assert_close(delta, 0.01 * vote)
    assert not (strat.method.client.state_vectors(cfg) > 0)


def test_a_payload_of_another_layout_is_refused_by_the_decoder() -> None:
    strat, cfg = strategy("qsgd")
    check = strat.method.wire.layout(cfg, strat.d, 1)
    assert callable(check)
    with pytest.raises(ValueError, match="qsgd payload 'norm' is float32\\[1\\]"):  # sent without buckets
        check({"norm": np.ones(1, np.float32), "sign": np.zeros(1, np.uint8), "level": np.zeros(3, np.uint8)})


def test_stateful_clients_keep_their_node() -> None:
    first, homes, lost = assign_homes([1, 2, 3, 4], [10, 20], {})
    assert first == {10: [1, 3], 20: [2, 4]} and not lost
    again, homes, lost = assign_homes([3, 4, 5], [10, 20], homes)
    assert again == {10: [3, 5], 20: [4]} and not lost
    moved, homes, lost = assign_homes([2, 3], [10, 30], homes)  # node 20 left: client 2's state is gone
    assert moved == {30: [2], 10: [3]} and lost == [2] and homes[2] == 30


def test_each_screen_draws_fresh_noise_and_keeps_the_generators_state() -> None:
    """Client-level DP through the strategy: the noise generator's state lives in the server's values and moves on."""
    strat, cfg = strategy("fedavg", **{"clip-norm": 1.0, "dp-noise-multiplier": 1.0})
    ups = updates(strat, cfg, vectors(strat.d))
    before = strat.values.noise.clone()
    first = strat.screen(ups)
    after_first = strat.values.noise.clone()
    second = strat.screen(ups)
    assert not torch.equal(after_first, before) and not torch.equal(strat.values.noise, after_first)
    assert strat.values.noise.dtype == torch.uint8 and strat.values.noise.shape == before.shape
    ((a,), (b,)) = first, second  # the noised mean, one update of weight 1
    assert a.cid == b.cid == -1 and a.num_examples == b.num_examples == 1
    assert not np.array_equal(a.payload["update"], b.payload["update"])  # a fresh draw each round
    assert strat.books.dp_rounds == 2
