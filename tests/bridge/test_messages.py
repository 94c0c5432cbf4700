"""The message layout: a request or reply written by one side reads back the same on the other, or is refused."""

from __future__ import annotations

import re
import zlib

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from bridge.flower import task_identity
from bridge.messages import (
    add_failure,
    add_rejection,
    add_update,
    client_metrics,
    config_bytes_per_client,
    copy_content,
    delivered,
    failure_record,
    model_crc,
    model_record,
    payload_to_record,
    query_request,
    read_request,
    record_to_payload,
    train_request,
    wire_bytes,
)
from fedsketch import wire

RNG = np.random.default_rng(3)
MODEL = RNG.standard_normal(40).astype(np.float32)
CONFIG = {wire.ROUND: 5, "lr": 0.25, "sketch-seed": 7}


def _equal(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(x.dtype == b[k].dtype and np.array_equal(x, b[k]) for k, x in a.items())


def _extras() -> dict[int, ArrayRecord]:
    return {
        3: payload_to_record({"idx": np.array([4, 9], np.int64)}),
        wire.NEW_CLIENT: payload_to_record({"q": np.ones((2, 3), np.float32)}),
    }


def test_a_training_request_reads_back_as_written() -> None:
    request = read_request(train_request(model_record(MODEL), CONFIG, [3, 8], _extras()))
    assert (request.server_round, request.cids, request.phase) == (5, [3, 8], 1)
    assert request.config == {**CONFIG, wire.CIDS: [3, 8]}
    assert request.weights is not None and request.weights.dtype == np.float32
    np.testing.assert_array_equal(request.weights, MODEL)
    assert request.extras.keys() == {3, wire.NEW_CLIENT}
    assert _equal(request.extras[3], {"idx": np.array([4, 9], np.int64)})
    assert _equal(request.extras[wire.NEW_CLIENT], {"q": np.ones((2, 3), np.float32)})
    assert (request.query, request.catch_up, request.base_round) == (None, None, 0)


@pytest.mark.parametrize("phase", [1, 3])
def test_a_catch_up_request_carries_its_payload_and_base_round_instead_of_the_model(phase: int) -> None:
    catch_up = {"idx": np.array([0, 7], np.int64), "val": np.array([1.5, -2.0], np.float32)}
    config = {**CONFIG, wire.BASE_ROUND: 3, wire.PHASE: phase}
    content = train_request(payload_to_record(catch_up), config, [], _extras(), key=wire.CATCH_UP_KEY)
    request = read_request(content)
    assert request.weights is None and request.catch_up is not None and _equal(request.catch_up, catch_up)
    assert (request.server_round, request.cids, request.phase, request.base_round) == (5, [], phase, 3)
    assert request.config == {**config, wire.CIDS: []} and request.extras.keys() == {3, wire.NEW_CLIENT}
    no_base = read_request(train_request(payload_to_record(catch_up), CONFIG, [], {}, key=wire.CATCH_UP_KEY))
    assert (no_base.base_round, no_base.phase, no_base.extras) == (0, 1, {})


def test_a_second_exchange_request_carries_the_query_and_each_clients_arrays() -> None:
    query = {"candidates": np.array([2, 11, 30], np.int64)}
    content = query_request(payload_to_record(query), {**CONFIG, wire.PHASE: 2}, [1, 6])
    content[wire.request_key(6)] = payload_to_record({"s": np.zeros(2, np.float32)})
    request = read_request(content)
    assert (request.server_round, request.cids, request.phase) == (5, [1, 6], 2)
    assert request.config[wire.PHASE] == 2 and request.config["lr"] == 0.25
    assert request.query is not None and _equal(request.query, query)
    assert request.extras.keys() == {6} and _equal(request.extras[6], {"s": np.zeros(2, np.float32)})
    assert request.weights is None and request.catch_up is None


@pytest.mark.parametrize("phase", [1, 3])
def test_only_phase_two_reads_a_query_rather_than_the_model(phase: int) -> None:
    content = train_request(model_record(MODEL), {**CONFIG, wire.PHASE: phase}, [1], {})
    content[wire.QUERY_KEY] = payload_to_record({"candidates": np.arange(3)})
    request = read_request(content)
    assert request.phase == phase and request.query is None and request.weights is not None


def _without(content: RecordDict, key: str) -> RecordDict:
    return RecordDict({k: v for k, v in content.items() if k != key})


@pytest.mark.parametrize(
    ("content", "error"),
    [
        (
            _without(train_request(model_record(MODEL), CONFIG, [1], {}), wire.CONFIG_KEY),
            "request has no 'config' record",
        ),
        (
            RecordDict({wire.MODEL_KEY: model_record(MODEL), wire.CONFIG_KEY: MetricRecord({wire.ROUND: 1})}),
            "request has no 'config' record",
        ),
        (
            _without(train_request(model_record(MODEL), CONFIG, [1], {}), wire.MODEL_KEY),
            "request has no 'model' record with array 'w'",
        ),
        (
            train_request(payload_to_record({"x": MODEL}), CONFIG, [1], {}),
            "request has no 'model' record with array 'w'",
        ),
        (
            train_request(model_record(MODEL), {**CONFIG, wire.PHASE: 2}, [1], {}),
            "second-exchange request has no 'query' record",
        ),
    ],
    ids=["no config", "config of the wrong kind", "no model", "model without w", "phase 2 without query"],
)
def test_a_malformed_request_is_refused_saying_what_is_missing(content: RecordDict, error: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(error)}$"):
        read_request(content)


def test_the_model_is_sent_as_float32_and_its_crc_is_that_of_the_float32_bytes() -> None:
    weights = RNG.standard_normal(30)  # float64
    strided = np.asfortranarray(np.stack([weights, weights]))[0]  # not C-contiguous
    record = model_record(strided)
    assert list(record) == [wire.WEIGHTS] and record[wire.WEIGHTS].dtype == "float32"
    np.testing.assert_array_equal(record_to_payload(record)[wire.WEIGHTS], weights.astype(np.float32))
    expected = zlib.crc32(weights.astype(np.float32).tobytes())
    assert model_crc(weights) == model_crc(strided) == model_crc(weights.astype(np.float32)) == expected
    nudged = weights.astype(np.float32).copy()
    nudged[29] = np.nextafter(nudged[29], np.float32(np.inf))
    assert model_crc(nudged) != expected


def test_a_reply_holds_each_clients_update_metrics_and_diagnostic_under_its_own_keys() -> None:
    content = RecordDict()
    update = {"idx": np.array([1, 5], np.int64), "val": np.array([0.5, -1.0], np.float32)}
    add_update(content, 4, update, client_metrics(32, 0.75, 0.5, {"sketch-seed": 7}), {"update": MODEL})
    add_update(content, 9, {"u": MODEL}, client_metrics(np.int64(8), np.float32(1.5), 2))
    add_failure(content, 2, "ValueError: out of memory")
    assert list(content) == [
        wire.update_key(4),
        wire.metrics_key(4),
        wire.diagnostic_key(4),
        wire.update_key(9),
        wire.metrics_key(9),
        wire.failure_key(2),
    ]
    assert _equal(record_to_payload(content[wire.update_key(4)]), update)  # type: ignore[arg-type]
    assert _equal(record_to_payload(content[wire.diagnostic_key(4)]), {"update": MODEL})  # type: ignore[arg-type]
    metrics = dict(content[wire.metrics_key(4)])
    assert metrics == {wire.NUM_EXAMPLES: 32, wire.LOSS: 0.75, wire.COMPUTE_S: 0.5, "sketch-seed": 7}
    plain = dict(content[wire.metrics_key(9)])
    assert plain == {wire.NUM_EXAMPLES: 8, wire.LOSS: 1.5, wire.COMPUTE_S: 2.0}
    assert [type(plain[k]) for k in (wire.NUM_EXAMPLES, wire.LOSS, wire.COMPUTE_S)] == [int, float, float]
    assert dict(content[wire.failure_key(2)]) == {wire.REASON: "ValueError: out of memory"}


def test_a_failure_or_rejection_keeps_its_reason_to_a_thousand_characters() -> None:
    long = "x" * 999 + "yz"
    assert dict(failure_record(long)) == {wire.REASON: long[:1000]}
    content = RecordDict()
    add_failure(content, 1, "")
    add_failure(content, 2, long)
    add_rejection(content, 3, long, 1234)
    add_rejection(content, 4, "norm 9.0 over the bound", 56, kind="bounded")
    assert dict(content[wire.failure_key(1)]) == {wire.REASON: "unknown error"}
    assert dict(content[wire.failure_key(2)]) == {wire.REASON: long[:1000]}
    assert dict(content[wire.rejected_key(3)]) == {
        wire.REASON: long[:1000],
        wire.UPLOAD_BYTES: 1234,
        wire.KIND: "rejected",
    }
    assert dict(content[wire.rejected_key(4)]) == {
        wire.REASON: "norm 9.0 over the bound",
        wire.UPLOAD_BYTES: 56,
        wire.KIND: "bounded",
    }
    assert all(isinstance(content[k], ConfigRecord) for k in content)


def test_a_clients_share_of_the_config_is_the_config_naming_one_client() -> None:
    config = {wire.ROUND: 2, "lr": 0.1}
    alone = wire_bytes(ConfigRecord({**config, wire.CIDS: [5]}))
    assert config_bytes_per_client(config) == alone
    assert config_bytes_per_client({**config, "extra": "x" * 100}) > alone


def _mixed() -> RecordDict:
    return RecordDict(
        {
            "a": payload_to_record({"x": np.arange(6, dtype=np.float32).reshape(2, 3), "i": np.arange(3)}),
            "m": MetricRecord({"loss": 0.5, "seen": [1.0, 2.0]}),
            "c": ConfigRecord({wire.CIDS: [3, 4], "why": "ok"}),
        }
    )


def test_a_copied_message_holds_the_same_records_and_shares_no_list_with_the_original() -> None:
    content = _mixed()
    copied = copy_content(content)
    assert [type(r) for r in copied.values()] == [ArrayRecord, MetricRecord, ConfigRecord]
    assert _equal(record_to_payload(copied["a"]), record_to_payload(content["a"]))  # type: ignore[arg-type]
    assert wire_bytes(copied) == wire_bytes(content)
    assert dict(copied["m"]) == dict(content["m"]) and dict(copied["c"]) == dict(content["c"])
    copied["m"]["seen"].append(3.0)  # type: ignore[union-attr]
    copied["c"][wire.CIDS].append(5)  # type: ignore[union-attr]
    copied["a"]["x"] = Array(np.zeros(1, np.float32))
    assert dict(content["m"]) == {"loss": 0.5, "seen": [1.0, 2.0]}
    assert dict(content["c"]) == {wire.CIDS: [3, 4], "why": "ok"}
    assert record_to_payload(content["a"])["x"].shape == (2, 3)  # type: ignore[arg-type]


def test_a_delivered_message_is_the_senders_with_its_own_records() -> None:
    with task_identity():
        sent = Message(_mixed(), dst_node_id=7, message_type="train")
    got = delivered(sent)
    assert vars(got.metadata) == vars(sent.metadata) and got.metadata is not sent.metadata
    assert got.content is not sent.content and wire_bytes(got.content) == wire_bytes(sent.content)
    got.content["c"][wire.CIDS].append(9)  # type: ignore[union-attr]
    assert sent.content["c"][wire.CIDS] == [3, 4]
