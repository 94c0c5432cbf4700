"""Sparse download (``strategies/billing.py``): returning clients get only the changed coordinates, exactly, and
are charged for them.

The catch-up's edges (its messages, and float32 on the wire whatever the model's dtype) pin what the
end-to-end download tests pass through without checking (docs/mutation.md).
"""

from __future__ import annotations

import json
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message

from bridge.flower import task_identity
from bridge.messages import payload_to_record, wire_bytes
from clients.kept_model import apply_catch_up
from fedsketch import wire
from fedsketch.compress.sparse import decode_sparse_pairs, encode_sparse
from fedsketch.config import ConfigError, RunConfig
from fedsketch.fit import check_against_model
from fedsketch.server.books import Books
from fedsketch.server.ledger import INITIAL, DownloadLedger, forget, mark_synced, record_update
from strategies.billing import base_round, catch_up, catch_up_values
from strategies.server_app import build_strategy
from tests.federation import SMALL_SKETCH_RUN, TestGrid

SETTINGS = {**SMALL_SKETCH_RUN, "num-rounds": 8, "eval-every": 4}


def test_catch_up_brings_every_returning_client_to_the_exact_model() -> None:
    d, clients, gen = 5_000, 20, torch.Generator().manual_seed(0)
    ledger = Books.start(d, sparse_download=True).ledger
    weights = torch.randn(d, generator=gen)
    kept: dict[int, np.ndarray] = {}
    for rnd in range(1, 31):
        chosen = torch.randperm(clients, generator=gen)[:5].tolist()
        for cid in chosen:
            payload = catch_up(ledger, cid, rnd, weights)
            if payload is None:
                assert cid not in kept  # only a newcomer gets the dense model
                kept[cid] = weights.numpy().copy()
            else:
                kept[cid] = apply_catch_up(kept[cid], payload)
            np.testing.assert_array_equal(kept[cid], weights.numpy())
        ledger = mark_synced(ledger, chosen, rnd)
        support = torch.randperm(d, generator=gen)[: int(torch.randint(1, 200, (1,), generator=gen))]
        after = weights.clone()
        after[support] -= torch.randn(len(support), generator=gen)
        ledger, changed = record_update(ledger, rnd, weights, after)
        assert changed == len(support)
        weights = after


def test_a_client_is_sent_the_coordinates_changed_since_its_sync_and_no_others() -> None:
    ledger = Books.start(10, sparse_download=True).ledger
    w0 = torch.zeros(10)
    ledger = mark_synced(ledger, [7], 1)
    w1 = w0.clone()
    w1[[2, 5]] = 1.0
    ledger, _ = record_update(ledger, 1, w0, w1)
    ledger = mark_synced(ledger, [8], 2)
    w2 = w1.clone()
    w2[3] = 2.0
    ledger, _ = record_update(ledger, 2, w1, w2)
    assert catch_up(ledger, 9, 3, w2) is None
    got7, got8 = catch_up(ledger, 7, 3, w2), catch_up(ledger, 8, 3, w2)
    assert got7 is not None and got8 is not None
    idx7, val7 = decode_sparse_pairs(got7, 10)
    idx8, val8 = decode_sparse_pairs(got8, 10)
    assert idx7.tolist() == [2, 3, 5] and val7.tolist() == [1.0, 2.0, 1.0]
    assert idx8.tolist() == [3] and val8.tolist() == [2.0]


def _run(
    tmp_path: Path, mode: str, extra: dict[str, object] | None = None, name: str = ""
) -> tuple[list[dict], list[tuple[dict, np.ndarray, list[int]]]]:
    """Run FetchSGD (or ``extra``'s strategy) in process; return its metrics rows and, per round, the config, model and clients sent."""
    cfg = RunConfig.from_mapping({**SETTINGS, "download": mode, **(extra or {})})
    out = tmp_path / (name or mode)
    strat = build_strategy(cfg, out)
    sent: list[tuple[dict, np.ndarray, list[int]]] = []

    def watch(requests: list[Message], replies: list[Message]) -> list[Message]:
        conf = dict(requests[0].content.config_records[wire.CONFIG_KEY])
        model = requests[0].content.array_records[wire.MODEL_KEY][wire.WEIGHTS].numpy()
        cids = [c for m in requests for c in m.content.config_records[wire.CONFIG_KEY][wire.CIDS]]  # type: ignore[union-attr]
        sent.append((conf, model.copy(), sorted(int(c) for c in cids)))
        return replies

    with task_identity():
        strat.start(TestGrid(cfg.to_mapping(), num_nodes=2, tamper=watch))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return rows, sent


def test_sparse_download_charges_each_returning_client_its_serialized_catch_up(tmp_path: Path) -> None:
    dense_rows, _ = _run(tmp_path, "dense")
    rows, sent = _run(tmp_path, "sparse")
    # Accounting only: the model trains identically.
    assert [r["test_accuracy"] for r in rows] == [r["test_accuracy"] for r in dense_rows]
    assert [r["cum_upload_bytes"] for r in rows] == [r["cum_upload_bytes"] for r in dense_rows]
    # The charge, recomputed from the models the clients were actually sent.
    last_model: dict[int, np.ndarray] = {}
    expected, sparse_count = 0, 0
    for conf, model, cids in sent:
        config_bytes = wire_bytes(ConfigRecord({**conf, wire.CIDS: [0]}))
        dense = wire_bytes(payload_to_record({wire.WEIGHTS: model}))
        for cid in cids:
            if cid in last_model:
                idx = np.flatnonzero(last_model[cid] != model)
                cost = wire_bytes(payload_to_record(encode_sparse(idx, model[idx], model.size)))
                sparse_count += cost < dense
                expected += min(cost, dense) + config_bytes
            else:
                expected += dense + config_bytes
            last_model[cid] = model
    assert rows[-1]["cum_download_bytes"] == expected
    assert sum(r["sparse_downloads"] for r in rows) == sparse_count > 0
    assert rows[-1]["cum_download_bytes"] < dense_rows[-1]["cum_download_bytes"]


def test_sparse_download_is_refused_where_it_cannot_be_delivered() -> None:
    with pytest.raises(ConfigError, match="secure-aggregation"):
        RunConfig.from_mapping({"download": "sparse", "secure-aggregation": True})
    with pytest.raises(ConfigError, match="'download' must be one of dense, sparse"):
        RunConfig.from_mapping({"download": "delta"})


def test_download_k_sends_local_topk_clients_k_coordinates_a_round(tmp_path: Path) -> None:
    """Top-k on the download: the model changes in at most download-k coordinates a round, and costs less."""
    local = {"strategy": "local_topk", "k": 300, "lr": 0.3}
    union_rows, union_sent = _run(tmp_path, "sparse", local, name="union")
    rows, sent = _run(tmp_path, "sparse", {**local, "download-k": 30}, name="topk")
    changed = [int(np.count_nonzero(a[1] != b[1])) for a, b in pairwise(sent)]
    union_changed = [int(np.count_nonzero(a[1] != b[1])) for a, b in pairwise(union_sent)]
    assert 0 < max(changed) <= 30 < min(union_changed)  # the union of 4 clients' top-300 is far more than 30
    assert rows[-1]["cum_download_bytes"] < union_rows[-1]["cum_download_bytes"]
    assert rows[-1]["cum_upload_bytes"] == union_rows[-1]["cum_upload_bytes"]  # uploads untouched
    assert rows[-1]["test_loss"] < rows[0]["test_loss"]  # what is held back is applied later, not lost


def test_download_k_is_refused_where_it_means_nothing() -> None:
    with pytest.raises(ConfigError, match="'download-k' applies to the compressed-upload baselines.*already k-sparse"):
        RunConfig.from_mapping({"strategy": "fetchsgd", "download-k": 10})
    with pytest.raises(ConfigError, match="dense by definition"):
        RunConfig.from_mapping({"strategy": "fedavg", "download-k": 10})
    with pytest.raises(ConfigError, match="'download-k' must be >= 0"):
        RunConfig.from_mapping({"strategy": "local_topk", "download-k": -1})
    with pytest.raises(ConfigError, match=r"'download-k' \(400\) exceeds the model's 300 parameters"):
        check_against_model(RunConfig.from_mapping({"strategy": "qsgd", "download-k": 400, "k": 10}), 300)


DEVICES = {
    **SETTINGS,
    "client-assignment": "node",
    "num-clients": 4,
    "clients-per-round": 2,
    "min-nodes": 4,
    "eval-every": 1,
}


def _devices(
    download_mode: str, deliver: Any = None, from_init: bool = False
) -> tuple[Any, list[dict[str, Any]], TestGrid]:
    """Four devices, two a round (each skips rounds), one client each: the strategy, its rows and the grid.

    ``deliver(grid, message)``, if given, may change a request as its device receives it.
    """
    cfg = RunConfig.from_mapping({**DEVICES, "download": download_mode, "download-from-init": from_init})
    grid = TestGrid(cfg.to_mapping(), num_nodes=4)
    if deliver is not None:
        grid.deliver = lambda msg: deliver(grid, msg)
    strat = build_strategy(cfg, None)
    with task_identity():
        strat.start(grid)  # type: ignore[arg-type]
    return strat, strat.history, grid


def test_a_device_that_kept_its_model_is_sent_only_the_catch_up_and_trains_on_the_very_same_model() -> None:
    """Each reply echoes the CRC of the model it trained on and none is rejected: every catch-up was exact."""
    sparse, rows, _ = _devices("sparse")
    dense, dense_rows, _ = _devices("dense")
    assert torch.equal(sparse.weights, dense.weights)  # the same training, bit for bit
    assert sum(r["rejected"] + r["client_errors"] for r in rows) == 0
    assert sum(r["sparse_downloads"] for r in rows) > 0
    assert rows[-1]["cum_download_bytes"] < dense_rows[-1]["cum_download_bytes"]
    assert rows[-1]["cum_download_bytes"] == rows[-1]["cum_download_sent_bytes"]  # one client a message: billed as sent


def test_a_device_that_lost_its_model_fails_once_then_gets_the_whole_model() -> None:
    lost: list[int] = []

    def lose(grid: TestGrid, msg: Message) -> Message:
        if wire.CATCH_UP_KEY in msg.content.array_records and not lost:  # the device restarted, its state gone
            lost.append(msg.metadata.dst_node_id)
            del grid.contexts[msg.metadata.dst_node_id].state["kept-model"]
        return msg

    _, rows, _ = _devices("sparse", deliver=lose)
    assert lost and sum(r["client_errors"] for r in rows) == 1 and sum(r["rejected"] for r in rows) == 0


def test_a_device_that_trained_on_another_model_is_rejected() -> None:
    bent: list[int] = []

    def bend(grid: TestGrid, msg: Message) -> Message:
        if wire.CATCH_UP_KEY in msg.content.array_records and not bent:
            record = msg.content.array_records[wire.CATCH_UP_KEY]
            values = record["val"].numpy().copy()
            values[0] += 1.0
            msg.content[wire.CATCH_UP_KEY] = ArrayRecord({**dict(record.items()), "val": Array(values)})
            bent.append(msg.metadata.dst_node_id)
        return msg

    _, rows, _ = _devices("sparse", deliver=bend)
    assert bent and sum(r["rejected"] for r in rows) == 1 and sum(r["client_errors"] for r in rows) == 0


def test_from_init_a_new_client_is_sent_what_changed_since_round_one_and_a_failed_one_the_whole_model() -> None:
    ledger = Books.start(10, sparse_download=True).ledger
    w0 = torch.zeros(10)
    assert catch_up(ledger, 4, 1, w0) is None  # without from_init a newcomer needs the dense model
    first = catch_up(ledger, 4, 1, w0, from_init=True)
    assert first is not None and decode_sparse_pairs(first, 10)[0].tolist() == []  # round 1 sends the initial model
    w1 = w0.clone()
    w1[[1, 6]] = 3.0
    ledger, _ = record_update(ledger, 1, w0, w1)
    ledger = mark_synced(ledger, [5], 2)
    w2 = w1.clone()
    w2[8] = 4.0
    ledger, _ = record_update(ledger, 2, w1, w2)
    new = catch_up(ledger, 4, 3, w2, from_init=True)
    assert new is not None
    idx, val = decode_sparse_pairs(new, 10)
    assert idx.tolist() == [1, 6, 8] and val.tolist() == [3.0, 3.0, 4.0]
    np.testing.assert_array_equal(apply_catch_up(w0.numpy(), new), w2.numpy())
    returning = catch_up(ledger, 5, 3, w2, from_init=True)
    assert returning is not None and decode_sparse_pairs(returning, 10)[0].tolist() == [8]
    ledger = forget(ledger, [4, 5])
    assert catch_up(ledger, 4, 3, w2, from_init=True) is None  # it may hold nothing: the dense model
    assert catch_up(ledger, 5, 3, w2, from_init=True) is None
    ledger = mark_synced(ledger, [5], 3)
    assert base_round(ledger, 5, True) == 3


def test_from_init_charges_a_newcomer_its_catch_up_from_the_initial_model(tmp_path: Path) -> None:
    sparse_rows, _ = _run(tmp_path, "sparse")
    rows, sent = _run(tmp_path, "sparse", {"download-from-init": True}, name="init")
    assert [r["test_accuracy"] for r in rows] == [r["test_accuracy"] for r in sparse_rows]  # accounting only
    initial = sent[0][1]  # round 1's model is the initial one
    last_model: dict[int, np.ndarray] = {}
    expected = 0
    for conf, model, cids in sent:
        config_bytes = wire_bytes(ConfigRecord({**conf, wire.CIDS: [0]}))
        dense = wire_bytes(payload_to_record({wire.WEIGHTS: model}))
        for cid in cids:
            idx = np.flatnonzero(last_model.get(cid, initial) != model)
            cost = wire_bytes(payload_to_record(encode_sparse(idx, model[idx], model.size)))
            expected += min(cost, dense) + config_bytes
            last_model[cid] = model
    assert rows[-1]["cum_download_bytes"] == expected
    assert rows[-1]["cum_download_bytes"] < sparse_rows[-1]["cum_download_bytes"]


def test_from_init_a_new_device_rebuilds_the_initial_model_and_trains_on_the_very_same_model() -> None:
    init, rows, _ = _devices("sparse", from_init=True)
    dense, _, _ = _devices("dense")
    assert torch.equal(init.weights, dense.weights)
    assert sum(r["rejected"] + r["client_errors"] for r in rows) == 0
    assert sum(r["sparse_downloads"] for r in rows) == sum(r["clients"] for r in rows)  # every download a catch-up
    assert rows[-1]["cum_download_bytes"] == rows[-1]["cum_download_sent_bytes"]


def test_from_init_a_device_with_another_initial_model_is_rejected_once_then_gets_the_whole_model() -> None:
    bent: list[int] = []

    def bend(grid: TestGrid, msg: Message) -> Message:
        if int(msg.content.config_records[wire.CONFIG_KEY].get(wire.BASE_ROUND, 0)) == INITIAL and not bent:
            record = msg.content.array_records[wire.CATCH_UP_KEY]  # the device's build differs at one coordinate
            msg.content[wire.CATCH_UP_KEY] = ArrayRecord(
                {
                    **dict(record.items()),
                    "idx": Array(np.array([0], np.int32)),
                    "val": Array(np.array([9.0], np.float32)),
                }
            )
            bent.append(msg.metadata.dst_node_id)
        return msg

    _, rows, _ = _devices("sparse", deliver=bend, from_init=True)
    assert bent and sum(r["rejected"] for r in rows) == 1 and sum(r["client_errors"] for r in rows) == 0


def test_from_init_needs_sparse_downloads() -> None:
    with pytest.raises(ConfigError, match="'download-from-init' needs 'download' = 'sparse'"):
        RunConfig.from_mapping({"download-from-init": True})


# the catch-up's edges: its messages, float32 on the wire whatever the model's dtype --------------


def _ledger_with_two_rounds() -> tuple[DownloadLedger, torch.Tensor]:
    """d = 6; round 1 changes coordinates 1 and 4, round 2 coordinate 2; client 3 synced in round 2."""
    ledger = Books.start(6, sparse_download=True).ledger
    w0 = torch.zeros(6, dtype=torch.float64)
    w1 = w0.clone()
    w1[[1, 4]] = torch.tensor([0.1, -2.5], dtype=torch.float64)
    ledger, _ = record_update(ledger, 1, w0, w1)
    w2 = w1.clone()
    w2[2] = 1.0 / 3.0
    ledger, _ = record_update(ledger, 2, w1, w2)
    ledger = mark_synced(ledger, [3], 2)
    return ledger, w2


def test_a_client_that_holds_no_model_has_no_catch_up_values_and_the_error_names_it() -> None:
    ledger, weights = _ledger_with_two_rounds()
    with pytest.raises(ValueError, match=r"^client 9 holds no model: it is sent the dense one$"):
        catch_up_values(ledger, 9, weights, False)
    ledger = forget(ledger, [3])
    with pytest.raises(ValueError, match=r"^client 3 holds no model: it is sent the dense one$"):
        catch_up_values(ledger, 3, weights, True)
    with pytest.raises(ValueError, match=r"^client None holds no model: it is sent the dense one$"):
        catch_up_values(ledger, None, weights, False)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16], ids=str)
def test_catch_up_values_are_float32_whatever_the_models_dtype(dtype: torch.dtype) -> None:
    ledger, w2 = _ledger_with_two_rounds()
    weights = w2.to(dtype)
    want = weights.to(torch.float32)
    got = catch_up_values(ledger, 3, weights, False)  # synced in round 2: coordinate 2
    assert got.dtype == np.float32 and got.tolist() == [want[2].item()]
    from_init = catch_up_values(ledger, 7, weights, True)  # never synced, holds round 1's model
    assert from_init.dtype == np.float32 and from_init.tolist() == want[[1, 2, 4]].tolist()


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16], ids=str)
def test_catch_up_sends_float32_values_whatever_the_models_dtype(dtype: torch.dtype) -> None:
    ledger, w2 = _ledger_with_two_rounds()
    weights = w2.to(dtype)
    payload = catch_up(ledger, 7, 3, weights, from_init=True)
    assert payload is not None
    idx, val = decode_sparse_pairs(payload, 6)
    assert idx.tolist() == [1, 2, 4] and val.dtype == torch.float32
    assert val.tolist() == weights.to(torch.float32)[[1, 2, 4]].tolist()
    assert np.array_equal(catch_up_values(ledger, 7, weights, True), val.numpy())
