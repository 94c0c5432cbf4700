"""Every client reply checked before use: the exact rejection, and the exact update kept.

:mod:`strategies.replies` turns a round's reply messages into validated
updates. These tests build the replies from real Flower records and check,
for each rule, the boundary on both sides: the reason a bad client is
rejected with (and logged), the kind it is counted as, and for an accepted
client the update's arrays, dtype, example count, loss, bytes and node.
"""

from __future__ import annotations

import logging
import math
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Error, Message, Metadata, MetricRecord, RecordDict
from flwr.app.message import make_message

from bridge.flower import task_identity
from bridge.messages import add_failure, add_update, model_record, payload_to_record, records_of, wire_bytes
from fedsketch import wire
from fedsketch.config import RunConfig
from fedsketch.methods import PayloadSpec
from strategies import replies
from strategies.limits import ReplyLimits, spec_bytes
from strategies.server_app import build_strategy
from tests.federation import TestGrid

F32: np.dtype[Any] = np.dtype(np.float32)
SPEC: PayloadSpec = {"table": ((2, 3), F32), "count": ((1,), np.dtype(np.int64))}
LIMITS = ReplyLimits(max_examples=50, max_bytes=spec_bytes(list(SPEC.values())), max_arrays=2)
ECHO = {"sketch-seed": 13, "sketch-cols": 3}


def _payload(scale: float = 1.0) -> dict[str, np.ndarray]:
    return {
        "table": (np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5) * np.float32(scale),
        "count": np.array([7], dtype=np.int64),
    }


def _metrics(num: Any = 10, loss: Any = 0.25, **extra: Any) -> MetricRecord:
    values = {wire.NUM_EXAMPLES: num, wire.LOSS: loss, wire.COMPUTE_S: 0.5, **extra}
    return MetricRecord({k: v for k, v in values.items() if v is not None})


def _reply(node: int, content: RecordDict | None = None, error: str | None = None, reply_to: str = "") -> Message:
    meta = Metadata(1, "", node, 0, reply_to, "", 0.0, 60.0, "train")
    if error is not None:
        return make_message(meta, error=Error(code=0, reason=error))
    return make_message(meta, content if content is not None else RecordDict())


def _content(*cids: int, payload: dict[str, np.ndarray] | None = None, **metrics: Any) -> RecordDict:
    content = RecordDict()
    for cid in cids:
        add_update(content, cid, _payload(cid) if payload is None else payload, _metrics(**metrics))
    return content


def _copy(content: RecordDict) -> RecordDict:
    """A reply's records in a dict of their own: collecting takes each client's arrays out of the reply."""
    return RecordDict(dict(content))


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "flwr" and r.levelno == logging.WARNING]


# ------------------------------------------------------------------------------------------ RoundReplies
def test_a_failure_counts_once_in_its_kind_and_keeps_300_characters_of_its_reason() -> None:
    out = replies.RoundReplies()
    assert (out.updates, out.failures, out.upload_bytes, out.diagnostic_bytes, out.failed) == ([], {}, 0, 0, 0)
    out.fail(3, "timeouts", "t" * 299 + "xy")
    out.fail(4, "errors", "boom")
    out.fail(None, "errors", "unnamed")
    out.fail(5, "rejected", "bad")
    out.fail(6, "rejected", "worse")
    out.fail(7, "rejected", "worst")
    assert (out.timeouts, out.errors, out.rejected, out.failed) == (1, 2, 3, 6)
    assert out.failures == {3: "t" * 299 + "x", 4: "boom", 5: "bad", 6: "worse", 7: "worst"}


def test_a_reply_stands_for_the_node_its_request_went_to_else_its_source() -> None:
    requested = {"0.0": 101, "0.1": 102}
    assert replies.replying_node(_reply(1, reply_to="0.1"), requested) == 102
    assert replies.replying_node(_reply(103, reply_to="9.9"), requested) == 103
    assert replies.replying_node(_reply(104, reply_to="0.0"), {}) == 104


def test_exchange_returns_the_replies_and_each_request_s_node_by_message_id() -> None:
    settings = {"num-clients": 4, "clients-per-round": 4, "model-hidden": 8, "k": 20, "sketch-rows": 3}
    cfg = RunConfig.from_mapping({**settings, "sketch-cols": 100, "num-rounds": 1})
    grid = TestGrid(cfg.to_mapping(), num_nodes=3, late={102: 10**6})
    strat = build_strategy(cfg, None)
    with task_identity():
        requests = list(strat.configure_train(1, model_record(strat.weights.numpy()), ConfigRecord(), grid))  # type: ignore[arg-type]
        started = time.monotonic()
        got, nodes = replies.exchange(grid, requests, timeout=0.3)  # type: ignore[arg-type]
        waited = time.monotonic() - started
    assert sorted(nodes.values()) == sorted(m.metadata.dst_node_id for m in requests)
    assert nodes == {m.metadata.message_id: m.metadata.dst_node_id for m in requests}
    assert all(key for key in nodes)
    assert 102 in nodes.values() and 102 not in {replies.replying_node(r, nodes) for r in got}  # never in time
    assert {replies.replying_node(r, nodes) for r in got} == set(nodes.values()) - {102}
    assert waited >= 0.3  # it waited the whole timeout for node 102


# ------------------------------------------------------------------------------------------ check_values
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nan_or_inf_anywhere_is_refused_by_name(bad: float) -> None:
    for at in (0, 2, 4):
        arr = np.array([1.0, -2.0, 3.0, 0.5, 4.0], dtype=np.float32)
        arr[at] = bad
        with pytest.raises(ValueError, match=r"^array 'table' has NaN or Inf$"):
            replies.check_values("table", arr, 1e20)


def test_the_largest_magnitude_of_either_sign_is_bounded_inclusively() -> None:
    replies.check_values("v", np.array([-4.0, 1.0, 4.0], dtype=np.float64), 4.0)
    replies.check_values("v", np.array([-3.0, -1.0], dtype=np.float64), 3.0)
    for arr in (np.array([-4.5, 1.0, 2.0]), np.array([1.0, 4.5, -2.0]), np.array([-1.0, -4.5])):
        with pytest.raises(ValueError) as err:
            replies.check_values("w", arr.astype(np.float32), 4.0)
        assert str(err.value) == "array 'w' has a value beyond +-4"
    with pytest.raises(ValueError) as err:
        replies.check_values("w", np.array([3e20], dtype=np.float32), 1e20)
    assert str(err.value) == "array 'w' has a value beyond +-1e+20"


def test_integer_bool_and_empty_arrays_are_not_value_checked() -> None:
    replies.check_values("i", np.array([2**62, -(2**62)], dtype=np.int64), 1.0)
    replies.check_values("b", np.array([True, False]), 0.5)
    replies.check_values("u", np.array([255], dtype=np.uint8), 1.0)
    replies.check_values("e", np.zeros(0, dtype=np.float32), 1.0)
    replies.check_values("e", np.zeros((3, 0), dtype=np.float64), 1.0)


READ_ONLY = textwrap.dedent(
    """
    import sys
    import numpy as np
    import torch
    from strategies.replies import check_values
    arr = np.frombuffer(np.ones(4, np.float32).tobytes(), np.float32)  # read-only, as a reply's arrays are
    if sys.argv[1] == "replies":
        check_values("a", arr, 10.0)
    else:
        torch.from_numpy(arr)
    """
)


@pytest.mark.slow  # two fresh Pythons importing Flower and torch
def test_a_reply_s_read_only_arrays_are_checked_without_torch_s_warning_which_other_code_still_gets() -> None:
    def run(caller: str) -> subprocess.CompletedProcess[str]:  # a fresh process: torch warns once a process
        cmd = [sys.executable, "-W", "error::UserWarning", "-c", READ_ONLY, caller]
        root = Path(__file__).parents[2]
        return subprocess.run(cmd, check=False, cwd=root, capture_output=True, text=True, timeout=120)

    replies_run = run("replies")
    assert replies_run.returncode == 0, replies_run.stderr
    elsewhere = run("elsewhere")
    assert elsewhere.returncode == 1 and "NumPy array is not writable" in elsewhere.stderr


# ------------------------------------------------------------------------------------------ metrics
def _check_metrics(record: MetricRecord, max_examples: int = 50, echo: dict[str, Any] | None = None) -> Any:
    return replies._validated_metrics(record, ReplyLimits(max_examples, 10**6, 2, echo or {}))


def test_num_examples_is_an_int_from_one_to_the_limit() -> None:
    assert _check_metrics(_metrics(1)) == (1, 0.25)
    assert _check_metrics(_metrics(50)) == (50, 0.25)
    for num, shown in [(0, "0"), (51, "51"), (-3, "-3"), (3.0, "3.0"), (None, "None")]:
        with pytest.raises(ValueError) as err:
            _check_metrics(_metrics(num))
        assert str(err.value) == f"num-examples {shown} is not an int in 1..50"
    with pytest.raises(ValueError) as err:
        _check_metrics(_metrics(list(range(30))))
    assert str(err.value) == f"num-examples {str(list(range(30)))[:40]} is not an int in 1..50"


def test_the_loss_is_a_number_kept_as_a_float_and_nan_when_absent_or_infinite() -> None:
    num, loss = _check_metrics(_metrics(5, 2))
    assert (num, loss, type(loss)) == (5, 2.0, float)
    assert _check_metrics(_metrics(5, -0.5)) == (5, -0.5)
    for absent_or_infinite in (None, math.inf, -math.inf, math.nan):
        assert math.isnan(_check_metrics(_metrics(5, absent_or_infinite))[1])
    with pytest.raises(ValueError) as err:
        _check_metrics(_metrics(5, [float(i) for i in range(20)]))
    assert str(err.value) == f"loss {str([float(i) for i in range(20)])[:40]} is not a number"


def test_every_echoed_setting_must_be_the_round_s_value_and_type() -> None:
    assert _check_metrics(_metrics(4, 0.5, **ECHO), echo=ECHO) == (4, 0.5)
    cases: list[tuple[dict[str, Any], str]] = [
        ({"sketch-cols": 3}, "'sketch-seed' is None; this round's is 13"),
        ({"sketch-seed": 14, "sketch-cols": 3}, "'sketch-seed' is 14; this round's is 13"),
        ({"sketch-seed": 13.0, "sketch-cols": 3}, "'sketch-seed' is 13.0; this round's is 13"),
        ({"sketch-seed": 13, "sketch-cols": 4}, "'sketch-cols' is 4; this round's is 3"),
        ({"sketch-seed": 13}, "'sketch-cols' is None; this round's is 3"),
        ({"sketch-seed": list(range(30)), "sketch-cols": 3}, f"'sketch-seed' is {str(list(range(30)))[:40]}; "),
    ]
    for sent, message in cases:
        with pytest.raises(ValueError) as err:
            _check_metrics(_metrics(4, 0.5, **sent), echo=ECHO)
        assert str(err.value).startswith(message)
        assert str(err.value).endswith("this round's is 13" if "seed" in message else "this round's is 3")
    with pytest.raises(ValueError) as err:
        _check_metrics(_metrics(4, 0.5, lr=0.1), echo={"lr": 0.25})
    assert str(err.value) == "'lr' is 0.1; this round's is 0.25"


# ------------------------------------------------------------------------------------------ payloads
def _check_payload(record: ArrayRecord, spec: Any = SPEC, limits: ReplyLimits = LIMITS) -> Any:
    return replies._validated_payload(record, spec, limits)


def test_an_exact_layout_keeps_the_arrays_as_sent_and_decodes_nothing() -> None:
    payload, decoded = _check_payload(payload_to_record(_payload(3.0)))
    assert decoded is None and set(payload) == {"table", "count"}
    assert payload["table"].dtype == np.float32 and payload["count"].dtype == np.int64
    np.testing.assert_array_equal(payload["table"], _payload(3.0)["table"])
    np.testing.assert_array_equal(payload["count"], [7])


def test_an_exact_layout_refuses_other_names_shapes_and_dtypes_by_name() -> None:
    def refused(payload: dict[str, np.ndarray], limits: ReplyLimits = LIMITS) -> str:
        with pytest.raises(ValueError) as err:
            _check_payload(payload_to_record(payload), limits=limits)
        return str(err.value)

    good = _payload()
    assert refused({"table": good["table"]}) == "payload arrays ['table'] != expected ['count', 'table']"
    assert refused({**good, "extra": good["count"]}, ReplyLimits(50, 10**6, 16)) == (
        "payload arrays ['count', 'extra', 'table'] != expected ['count', 'table']"
    )
    many = {f"a{i}": good["count"] for i in range(10)}
    assert refused(many, ReplyLimits(50, 10**6, 16)) == (
        "payload arrays ['a0', 'a1', 'a2', 'a3', 'a4', 'a5', 'a6', 'a7'] != expected ['count', 'table']"
    )
    assert refused({**good, "table": good["table"].astype(np.float64)}, ReplyLimits(50, 10**6, 2)) == (
        "array 'table' is float64[2, 3]; expected float32[2, 3]"
    )
    assert refused({**good, "table": good["table"].reshape(3, 2)}) == (
        "array 'table' is float32[3, 2]; expected float32[2, 3]"
    )
    assert refused({**good, "count": np.array([7], dtype=np.int32)}) == ("array 'count' is int32[1]; expected int64[1]")
    deep = np.zeros((1,) * 9, dtype=np.float32)
    assert refused({**good, "table": deep}) == (
        "array 'table' is float32[1, 1, 1, 1, 1, 1, 1, 1]; expected float32[2, 3]"
    )


def test_a_payload_is_bounded_in_arrays_and_bytes_before_it_is_read() -> None:
    record = payload_to_record(_payload())
    with pytest.raises(ValueError) as err:
        _check_payload(record, limits=ReplyLimits(50, 10**6, 1))
    assert str(err.value) == "payload has 2 arrays; at most 1 allowed"
    total = sum(len(a.data) for a in record.values())
    _check_payload(record, limits=ReplyLimits(50, total, 2))
    with pytest.raises(ValueError) as err:
        _check_payload(record, limits=ReplyLimits(50, total - 1, 2))
    assert str(err.value) == f"payload is {total} bytes; at most {total - 1} allowed"


def test_every_array_is_value_checked_under_the_limit_s_bound() -> None:
    bad = _payload()
    bad["table"][1, 2] = np.nan
    with pytest.raises(ValueError) as err:
        _check_payload(payload_to_record(bad))
    assert str(err.value) == "array 'table' has NaN or Inf"
    big = _payload(100.0)  # magnitudes up to 250
    _check_payload(payload_to_record(big), limits=ReplyLimits(50, 10**6, 2, max_abs=250.0))
    with pytest.raises(ValueError) as err:
        _check_payload(payload_to_record(big), limits=ReplyLimits(50, 10**6, 2, max_abs=249.0))
    assert str(err.value) == "array 'table' has a value beyond +-249"


def test_a_decoder_s_result_is_kept_and_its_failure_named_and_cut() -> None:
    def total(payload: dict[str, np.ndarray]) -> float:
        return float(payload["table"].sum()) + float(payload["count"][0])

    payload, decoded = _check_payload(payload_to_record(_payload(2.0)), spec=total)
    assert decoded == float(_payload(2.0)["table"].sum()) + 7.0
    np.testing.assert_array_equal(payload["table"], _payload(2.0)["table"])

    def fails(payload: dict[str, np.ndarray]) -> None:
        raise KeyError("k" * 300)

    with pytest.raises(ValueError) as err:
        _check_payload(payload_to_record(_payload()), spec=fails)
    assert str(err.value) == f"payload does not decode: KeyError: {str(KeyError('k' * 300))[:200]}"

    def reads_the_table_only(payload: dict[str, np.ndarray]) -> float:
        return float(payload["table"].sum())

    with pytest.raises(ValueError) as err:
        _check_payload(payload_to_record(_payload()), spec=reads_the_table_only)
    assert str(err.value) == (
        "payload does not decode: ValueError: payload has arrays ['count'] that are not part of the method's layout"
    )
    nan = _payload()
    nan["table"][0, 0] = np.inf
    with pytest.raises(ValueError, match=r"^array 'table' has NaN or Inf$"):  # values first, then the decoder
        _check_payload(payload_to_record(nan), spec=total)


# ------------------------------------------------------------------------------------------ diagnostics
DIAG: PayloadSpec = {wire.DIAGNOSTIC_UPDATE: ((3,), F32)}


def test_diagnostic_arrays_are_none_unless_asked_and_required_when_asked() -> None:
    record = payload_to_record({wire.DIAGNOSTIC_UPDATE: np.ones(3, np.float32)})
    assert replies._validated_diagnostic(record, None, LIMITS) is None
    assert replies._validated_diagnostic(None, None, LIMITS) is None
    with pytest.raises(ValueError) as err:
        replies._validated_diagnostic(None, DIAG, LIMITS)
    assert str(err.value) == "reply has no diagnostic arrays for this client (diagnose-sketch)"
    got = replies._validated_diagnostic(record, DIAG, LIMITS)
    assert got is not None and set(got) == {wire.DIAGNOSTIC_UPDATE}
    assert got[wire.DIAGNOSTIC_UPDATE].dtype == np.float32
    np.testing.assert_array_equal(got[wire.DIAGNOSTIC_UPDATE], [1.0, 1.0, 1.0])


def test_diagnostic_arrays_are_bounded_by_their_own_layout_and_the_value_limit() -> None:
    roomy = ReplyLimits(50, 10**7, 16, max_abs=8.0)

    def refused(payload: dict[str, np.ndarray]) -> str:
        with pytest.raises(ValueError) as err:
            replies._validated_diagnostic(payload_to_record(payload), DIAG, roomy)
        return str(err.value)

    ones = np.ones(3, np.float32)
    assert (
        refused({wire.DIAGNOSTIC_UPDATE: ones, "more": ones}) == "diagnostic: payload has 2 arrays; at most 1 allowed"
    )
    big = np.zeros(2000, np.float32)
    nbytes = len(payload_to_record({"update": big})["update"].data)
    assert refused({wire.DIAGNOSTIC_UPDATE: big}) == f"diagnostic: payload is {nbytes} bytes; at most 4108 allowed"
    assert refused({"other": ones}) == "diagnostic: payload arrays ['other'] != expected ['update']"
    assert refused({wire.DIAGNOSTIC_UPDATE: np.ones(2, np.float32)}) == (
        "diagnostic: array 'update' is float32[2]; expected float32[3]"
    )
    assert (
        refused({wire.DIAGNOSTIC_UPDATE: np.array([1, 9, 1], np.float32)})
        == "diagnostic: array 'update' has a value beyond +-8"
    )
    kept = replies._validated_diagnostic(
        payload_to_record({wire.DIAGNOSTIC_UPDATE: np.array([1, -8, 1], np.float32)}), DIAG, roomy
    )
    assert kept is not None
    np.testing.assert_array_equal(kept[wire.DIAGNOSTIC_UPDATE], [1.0, -8.0, 1.0])


# ------------------------------------------------------------------------------------------ collect
def _collect(msgs: list[Message], sent: dict[int, list[int]], **kwargs: Any) -> replies.RoundReplies:
    return replies.collect(msgs, sent, kwargs.pop("spec", SPEC), kwargs.pop("limits", LIMITS), **kwargs)


def test_accepted_updates_keep_their_arrays_counts_bytes_and_node_sorted_by_client() -> None:
    first, second = _content(5, 2, num=7, loss=1.5), _content(9, num=3, loss=0.75)
    out = _collect([_reply(102, second), _reply(101, first)], {101: [5, 2], 102: [9]})
    assert [records_of(c).arrays for c in (first, second)] == [{}, {}]  # each client's arrays taken once read
    first, second = _content(5, 2, num=7, loss=1.5), _content(9, num=3, loss=0.75)  # the same replies, to compare
    assert [u.cid for u in out.updates] == [2, 5, 9]
    assert (out.failed, out.failures, out.diagnostic_bytes) == (0, {}, 0)
    expected_bytes = 0
    for update, content, node in zip(out.updates, [first, first, second], [101, 101, 102], strict=True):
        arrays, metrics = content[wire.update_key(update.cid)], content[wire.metrics_key(update.cid)]
        nbytes = wire_bytes(arrays) + wire_bytes(metrics)
        expected_bytes += nbytes
        assert (update.node, update.upload_bytes, update.decoded, update.diagnostic) == (node, nbytes, None, None)
        assert (update.num_examples, update.loss) == ((3, 0.75) if update.cid == 9 else (7, 1.5))
        np.testing.assert_array_equal(update.payload["table"], _payload(update.cid)["table"])
        assert update.payload["table"].dtype == np.float32 and update.payload["count"].dtype == np.int64
    assert out.upload_bytes == expected_bytes
    assert wire_bytes(first[wire.metrics_key(5)]) > 0 and wire_bytes(first[wire.update_key(5)]) > 0


def test_a_decoded_update_and_its_diagnostic_are_kept_and_diagnostic_bytes_counted_apart() -> None:
    content = _content(4)
    diag = payload_to_record({wire.DIAGNOSTIC_UPDATE: np.array([0.5, -1.0, 2.0], np.float32)})
    content[wire.diagnostic_key(4)] = diag
    out = _collect(
        [_reply(101, _copy(content))],
        {101: [4]},
        spec=lambda p: float(p["table"].sum() + p["count"][0]),
        diagnostic=DIAG,
    )
    (update,) = out.updates
    assert update.decoded == float(_payload(4)["table"].sum()) + 7.0
    assert update.diagnostic is not None
    np.testing.assert_array_equal(update.diagnostic[wire.DIAGNOSTIC_UPDATE], [0.5, -1.0, 2.0])
    arrays, metrics = content[wire.update_key(4)], content[wire.metrics_key(4)]
    assert update.upload_bytes == out.upload_bytes == wire_bytes(arrays) + wire_bytes(metrics)
    assert out.diagnostic_bytes == wire_bytes(diag) > 0
    plain = _collect(
        [_reply(101, _copy(content))], {101: [4]}
    )  # diagnostic arrays not asked for: neither read nor counted
    assert plain.diagnostic_bytes == 0 and plain.updates[0].diagnostic is None
    assert plain.upload_bytes == out.upload_bytes


def test_each_bad_client_is_rejected_with_its_reason_and_its_bytes_still_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    content = _content(1, 2, 3, 4)
    content[wire.metrics_key(2)] = _metrics(0)
    content[wire.update_key(3)] = payload_to_record({"table": _payload()["table"]})
    del content[wire.metrics_key(4)]
    content[wire.update_key(6)] = payload_to_record(_payload())  # an update without metrics
    add_failure(content, 7, "out of memory")
    content[wire.failure_key(8)] = ConfigRecord({"other": "x"})
    content[wire.metrics_key(9)] = _metrics()  # metrics without an update
    content[wire.diagnostic_key(1)] = payload_to_record({wire.DIAGNOSTIC_UPDATE: np.ones(3, np.float32)})
    with caplog.at_level(logging.WARNING, logger="flwr"):
        out = _collect([_reply(101, _copy(content))], {101: [1, 2, 3, 4, 5, 6, 7, 8, 9]})
    assert [u.cid for u in out.updates] == [1]
    missing = "reply has no update or metrics for this client"
    assert out.failures == {
        2: "num-examples 0 is not an int in 1..50",
        3: "payload arrays ['table'] != expected ['count', 'table']",
        4: missing,
        5: missing,
        6: missing,
        7: "out of memory",
        8: "unknown",
        9: missing,
    }
    assert (out.rejected, out.errors, out.timeouts) == (6, 2, 0)
    counted = [1, 2, 3]  # every client whose update and metrics arrived is charged, valid or not
    total = sum(wire_bytes(content[wire.update_key(c)]) + wire_bytes(content[wire.metrics_key(c)]) for c in counted)
    assert out.upload_bytes == total and out.diagnostic_bytes == 0
    words = {7: "counted as a client error", 8: "counted as a client error"}  # the kind each is counted as
    assert _warnings(caplog) == [
        f"client {cid} {words.get(cid, 'rejected')}: {reason}" for cid, reason in out.failures.items()
    ]


def test_a_missing_or_bad_diagnostic_rejects_its_client_and_is_still_counted() -> None:
    content = _content(1, 2, 3)
    good = payload_to_record({wire.DIAGNOSTIC_UPDATE: np.ones(3, np.float32)})
    bad = payload_to_record({wire.DIAGNOSTIC_UPDATE: np.ones(4, np.float32)})
    content[wire.diagnostic_key(1)], content[wire.diagnostic_key(2)] = good, bad
    out = _collect([_reply(101, content)], {101: [1, 2, 3]}, diagnostic=DIAG)
    assert [u.cid for u in out.updates] == [1]
    assert out.failures == {
        2: "diagnostic: array 'update' is float32[4]; expected float32[3]",
        3: "reply has no diagnostic arrays for this client (diagnose-sketch)",
    }
    assert out.diagnostic_bytes == wire_bytes(good) + wire_bytes(bad)
    assert out.rejected == 2 and out.failed == 2


def test_a_reply_keeps_no_array_record_once_read_not_even_of_clients_it_was_not_asked_for() -> None:
    content = _content(5, 6)  # client 6 was not asked of this node
    metrics = dict(records_of(content).metrics)
    out = _collect([_reply(101, content)], {101: [5]})
    assert [u.cid for u in out.updates] == [5]
    assert records_of(content).arrays == {} and records_of(content).metrics == metrics


def test_replies_from_nodes_not_asked_or_twice_are_ignored_and_silent_nodes_time_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    honest, other = _content(1, 2), _content(1, 2, num=9)
    msgs = [_reply(101, honest), _reply(101, other), _reply(105, _content(3)), _reply(1, _content(3), reply_to="m3")]
    with caplog.at_level(logging.WARNING, logger="flwr"):
        out = _collect(msgs, {101: [1, 2], 102: [3, 4], 103: []}, requested={"m1": 101, "m3": 102})
    assert [(u.cid, u.num_examples, u.node) for u in out.updates] == [(1, 10, 101), (2, 10, 101), (3, 10, 102)]
    assert (out.timeouts, out.errors, out.rejected) == (1, 0, 1)  # node 103 (its client not named yet) is silent
    assert out.failures == {4: "reply has no update or metrics for this client"}
    assert _warnings(caplog) == [
        "reply from node 101 ignored: a second reply",
        "reply from node 105 ignored: not asked",
        "client 4 rejected: reply has no update or metrics for this client",
    ]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="flwr"):
        late = _collect([_reply(101, _content(1, 2))], {101: [1, 2], 102: [3, 4], 103: []})
    assert (late.timeouts, late.failures) == (
        3,
        {3: "node 102 did not reply in time", 4: "node 102 did not reply in time"},
    )
    assert _warnings(caplog)[-2:] == ["client 3 timed out: node 102 did not reply in time"] + [
        "client 4 timed out: node 102 did not reply in time"
    ]


def test_a_node_error_fails_each_of_its_clients_as_an_error(caplog: pytest.LogCaptureFixture) -> None:
    long = "x" * 400
    with caplog.at_level(logging.WARNING, logger="flwr"):
        out = _collect(
            [_reply(101, error=long), _reply(102, error="gone"), _reply(103, _content(6))],
            {101: [1, 2], 102: [], 103: [6]},
        )
    reason = f"node 101 error: {long}"
    assert (out.errors, out.timeouts, out.rejected) == (3, 0, 0)
    assert out.failures == {1: reason[:300], 2: reason[:300]}
    assert [u.cid for u in out.updates] == [6]
    assert _warnings(caplog) == [
        reason[:300],
        "node 102 error: gone",
        f"client 1 counted as a client error: {reason[:300]}",
        f"client 2 counted as a client error: {reason[:300]}",
    ]


def test_a_node_that_is_one_client_names_one_new_valid_id(caplog: pytest.LogCaptureFixture) -> None:
    limits = ReplyLimits(50, LIMITS.max_bytes, 2, num_clients=10)
    failed = RecordDict()
    add_failure(failed, 4, "disk full")
    only_metrics = RecordDict({wire.metrics_key(3): _metrics()})
    msgs = [
        _reply(101, _content(9)),  # the last valid id
        _reply(102, _content(0)),  # the first
        _reply(103, _content(10)),  # one past the last
        _reply(104, _content(9)),  # taken by 101
        _reply(105, _content(1, 2, 3, 4, 5, 6)),  # several
        _reply(106, RecordDict()),  # none
        _reply(107, failed),  # its client failed: named by the failure record
        _reply(108, only_metrics),  # named by its metrics
    ]
    sent: dict[int, list[int]] = {node: [] for node in range(101, 110)}
    with caplog.at_level(logging.WARNING, logger="flwr"):
        out = _collect(msgs, sent, limits=limits)
    assert [(u.cid, u.node) for u in out.updates] == [(0, 102), (9, 101)]
    assert out.failures == {4: "disk full", 3: "reply has no update or metrics for this client"}
    assert (out.rejected, out.errors, out.timeouts) == (4 + 1, 1, 1)  # 109 never replied
    assert _warnings(caplog) == [
        "node 103 rejected: named clients [10]",
        "node 104 rejected: named clients [9]",
        "node 105 rejected: named clients [1, 2, 3, 4, 5]",
        "node 106 rejected: named clients []",
        "client 4 counted as a client error: disk full",
        "client 3 rejected: reply has no update or metrics for this client",
    ]
    free = _collect([_reply(101, _content(12345))], {101: []})  # no bound on the ids without num_clients
    assert [u.cid for u in free.updates] == [12345] and free.failed == 0
