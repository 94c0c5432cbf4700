"""A device that keeps its model between rounds trains on the very model the server holds, or fails saying why.

The server's side is the real one (:mod:`strategies.billing`): its ledger of changed coordinates
(:mod:`fedsketch.server.ledger`) builds the catch-up, and the device's reply echoes the CRC-32 of the model
it trained on.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, Context, Message, RecordDict

from bridge import messages
from bridge.flower import task_identity
from clients.client_app import train
from clients.kept_model import KEPT, apply_catch_up, initial_weights, keep, weights_for
from fedsketch import wire
from fedsketch.compress.sparse import encode_sparse
from fedsketch.config import RunConfig
from fedsketch.server.books import Books
from fedsketch.server.ledger import record_update
from strategies.billing import catch_up

TINY = {"num-clients": 6, "clients-per-round": 2, "model-hidden": 8, "k": 10, "strategy": "fedavg"}
SPARSE = {**TINY, "download": "sparse", "client-assignment": "node"}


def _context(cfg: RunConfig, partition: int = 2) -> Context:
    return Context(
        run_id=1, node_id=5, node_config={"partition-id": partition}, state=RecordDict(), run_config=cfg.to_mapping()
    )


def _send(context: Context, content: RecordDict) -> RecordDict:
    with task_identity():
        msg = Message(content, dst_node_id=context.node_id, message_type="train")
    return train(msg, context).content


def _full(weights: np.ndarray, server_round: int) -> RecordDict:
    return messages.train_request(messages.model_record(weights), {wire.ROUND: server_round}, [], {})


def _moved(weights: np.ndarray, coords: list[int]) -> np.ndarray:
    out = weights.copy()
    out[coords] += 0.5
    return out


def _catch_up(before: np.ndarray, after: np.ndarray, synced: dict[int, int], server_round: int, **kw: Any) -> Any:
    """The server's catch-up for client 2 to ``after`` (changed in round ``server_round - 1``)."""
    ledger, _ = record_update(
        Books.start(before.size, sparse_download=True).ledger,
        server_round - 1,
        torch.from_numpy(before),
        torch.from_numpy(after),
    )
    return catch_up(replace(ledger, synced=synced), 2, server_round, torch.from_numpy(after), **kw)


def _catch_up_request(payload: Any, server_round: int, base_round: int) -> RecordDict:
    config = {wire.ROUND: server_round, wire.BASE_ROUND: base_round}
    record = messages.payload_to_record(payload)
    return messages.train_request(record, config, [], {}, key=wire.CATCH_UP_KEY)


def _crc(content: RecordDict) -> int | None:
    value = dict(content[wire.metrics_key(2)]).get(wire.MODEL_CRC)
    return None if value is None else int(value)


def _failure(content: RecordDict) -> str:
    return str(content[wire.failure_key(2)][wire.REASON])  # type: ignore[index]


def test_a_device_caught_up_from_its_kept_model_echoes_the_crc_of_the_servers_model() -> None:
    cfg = RunConfig.from_mapping(SPARSE)
    context, w1 = _context(cfg), initial_weights(cfg)
    assert _crc(_send(context, _full(w1, 1))) == messages.model_crc(w1)
    w3 = _moved(w1, [3, 17, 40])
    payload = _catch_up(w1, w3, {2: 1}, 3)
    assert _crc(_send(context, _catch_up_request(payload, 3, 1))) == messages.model_crc(w3)
    kept = context.state[KEPT]
    assert isinstance(kept, ArrayRecord) and int(kept["round"].numpy()[0]) == 3
    np.testing.assert_array_equal(kept["w"].numpy(), w3)
    w4 = _moved(w3, [0])
    again = _send(context, _catch_up_request(_catch_up(w3, w4, {2: 3}, 4), 4, 3))  # its base is the kept round
    assert _crc(again) == messages.model_crc(w4)


def test_a_device_whose_kept_model_is_older_than_the_catch_ups_base_fails_saying_both_rounds() -> None:
    cfg = RunConfig.from_mapping(SPARSE)
    context, w1 = _context(cfg), initial_weights(cfg)
    _send(context, _full(w1, 2))
    stale = _send(context, _catch_up_request(_catch_up(w1, _moved(w1, [1]), {2: 3}, 4), 4, 3))
    assert list(stale) == [wire.failure_key(2)]
    assert _failure(stale) == "the kept model is from round 2; the catch-up starts at round 3"
    lost = _send(_context(cfg), _catch_up_request(_catch_up(w1, _moved(w1, [1]), {2: 1}, 2), 2, 1))
    assert _failure(lost) == "no kept model to catch up from (the device lost its state); the whole model comes next"


@pytest.mark.parametrize("settings", [{"download": "sparse"}, {"client-assignment": "node"}])
def test_only_a_device_with_sparse_downloads_keeps_its_model_and_echoes_a_crc(settings: dict[str, str]) -> None:
    cfg = RunConfig.from_mapping({**TINY, **settings})
    context = _context(cfg)
    reply = _send(context, _full(initial_weights(cfg), 1))
    assert _crc(reply) is None and KEPT not in context.state


def test_with_download_from_init_a_newcomer_catches_up_from_the_rebuilt_initial_model() -> None:
    cfg = RunConfig.from_mapping({**SPARSE, "download-from-init": True})
    w0 = initial_weights(cfg)
    w2 = _moved(w0, [5, 6])
    payload = _catch_up(w0, w2, {}, 2, from_init=True)
    assert _crc(_send(_context(cfg), _catch_up_request(payload, 2, 1))) == messages.model_crc(w2)
    holding = _context(cfg)
    keep(holding, np.zeros_like(w0), 1)  # a kept model is never the initial one
    assert _crc(_send(holding, _catch_up_request(payload, 2, 1))) == messages.model_crc(w2)
    off = RunConfig.from_mapping(SPARSE)
    assert _failure(_send(_context(off), _catch_up_request(payload, 2, 1))).startswith("no kept model")


def _request(**parts: Any) -> messages.Request:
    return messages.Request(server_round=4, cids=[], config={}, **parts)


def test_weights_for_a_request_with_the_model_are_the_model() -> None:
    weights = np.arange(5, dtype=np.float32)
    assert weights_for(_request(weights=weights), _context(RunConfig.from_mapping(TINY))) is weights


def test_a_request_with_neither_model_nor_catch_up_is_refused() -> None:
    with pytest.raises(ValueError, match=f"^{re.escape('request carries neither the model nor a catch-up')}$"):
        weights_for(_request(), _context(RunConfig.from_mapping(TINY)))


def test_a_kept_model_is_float32_and_tagged_with_its_round() -> None:
    context = _context(RunConfig.from_mapping(TINY))
    keep(context, np.arange(4, dtype=np.float64)[::-1], 6)
    kept = context.state[KEPT]
    assert isinstance(kept, ArrayRecord) and list(kept) == ["w", "round"]
    assert kept["w"].dtype == "float32" and kept["round"].dtype == "int64"
    np.testing.assert_array_equal(kept["w"].numpy(), [3.0, 2.0, 1.0, 0.0])
    np.testing.assert_array_equal(kept["round"].numpy(), [6])


def test_apply_catch_up_returns_a_new_float32_model_from_a_float64_one() -> None:
    payload = encode_sparse(np.array([2, 4]), np.array([1.0 / 3.0, -2.5], dtype=np.float32), 6)
    kept = np.array([0.0, 0.1, 0.0, 7.0, 9.0, 1e-40], dtype=np.float64)  # a float64 copy of the model
    out = apply_catch_up(kept, payload)
    assert out.dtype == np.float32 and out is not kept
    want = np.array([0.0, 0.1, 1.0 / 3.0, 7.0, -2.5, 1e-40], dtype=np.float32)
    np.testing.assert_array_equal(out, want)
    assert kept[2] == 0.0 and kept[4] == 9.0  # the kept model is not written to
