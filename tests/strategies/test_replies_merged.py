"""A node's merged reply (``merge-uploads``) is read as its clients' own replies would have been.

Each asked client is billed the bytes of the upload record it would have sent plus its metrics record's,
judged by its own metrics, and counted once by kind; the merged mean is accepted only with the method's
layout and exactly the accepted clients' examples, else every member is rejected. The replies are built
by the node's own code (:func:`clients.merged.merged_reply`) or laid out as it lays them out.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from flwr.app import ConfigRecord, Message, Metadata, MetricRecord, RecordDict
from flwr.app.message import make_message

from bridge.messages import add_failure, add_rejection, add_update, client_metrics, payload_to_record, wire_bytes
from clients.merged import merged_reply
from fedsketch import wire
from fedsketch.client.cohort import ClientOutcome
from fedsketch.config import RunConfig
from fedsketch.methods import ClientUpdate, PayloadSpec
from strategies import replies
from strategies.limits import ReplyLimits, spec_bytes

D = 4
F32 = np.dtype(np.float32)
SPEC: PayloadSpec = {"update": ((D,), F32)}
MAX = spec_bytes(list(SPEC.values()))
LIMITS = ReplyLimits(max_examples=50, max_bytes=MAX, max_arrays=1, merged=True)
UNMERGED = ReplyLimits(max_examples=50, max_bytes=MAX, max_arrays=1)
NODE = 101


def _reply(content: RecordDict, node: int = NODE) -> Message:
    return make_message(Metadata(1, "", node, 0, "", "", 0.0, 60.0, "train"), content)


def _values(num: Any = 4, loss: Any = 0.5, **extra: Any) -> dict[str, Any]:
    values = {wire.NUM_EXAMPLES: num, wire.LOSS: loss, wire.COMPUTE_S: 0.25, **extra}
    return {k: v for k, v in values.items() if v is not None}


def _client(content: RecordDict, cid: int, billed: Any = 300, **metrics: Any) -> int:
    """A client the node accepted, as the node writes it; what the server should bill it."""
    content[wire.metrics_key(cid)] = MetricRecord({**_values(**metrics), wire.UPLOAD_BYTES: billed})
    return billed + wire_bytes(MetricRecord(_values(**metrics))) if isinstance(billed, int) else 0


def _mean(content: RecordDict, num: Any, clipped: int | None = 0, update: np.ndarray | None = None) -> None:
    content[wire.MERGED_KEY] = payload_to_record({"update": np.full(D, 0.5, F32) if update is None else update})
    totals = {wire.NUM_EXAMPLES: num, **({} if clipped is None else {wire.CLIPPED: clipped})}
    content[wire.MERGED_METRICS] = MetricRecord(totals)


def _collect(
    content: RecordDict, asked: list[int], limits: ReplyLimits = LIMITS, spec: Any = SPEC
) -> replies.RoundReplies:
    return replies.collect([_reply(content)], {NODE: asked}, spec, limits)


def _row(u: ClientUpdate) -> tuple[int, int, float | None, int, int]:
    """An update's figures, its loss ``None`` where NaN (so that rows compare)."""
    return (u.cid, u.num_examples, None if math.isnan(u.loss) else u.loss, u.upload_bytes, u.node)


def _members(out: replies.RoundReplies) -> list[tuple[int, int, float | None, int, int]]:
    assert all(m.payload == {} and m.decoded is None and m.diagnostic is None for m in out.members)
    return [_row(m) for m in out.members]


# ------------------------------------------------------------------------------------------ the node's own reply
def _outcomes() -> list[ClientOutcome]:
    good = [
        ClientOutcome(3, {"update": np.array([1, -2, 3, 0], F32)}, 5, 1.0, 0.5),
        ClientOutcome(1, {"update": np.array([2, 2, -1, 1], F32)}, 3, float("nan"), 0.5),
        ClientOutcome(4, {"update": np.array([0, 1, 1, -2], F32)}, 2, 2.5, 0.5),
    ]
    bad = [
        ClientOutcome(7, None, error="out of memory"),
        ClientOutcome(9, {"update": np.ones(D + 1, F32)}, 6, 0.5, 0.5),  # not the layout
        ClientOutcome(8, {"update": np.full(D, 300.0, F32)}, 4, 0.5, 0.5),  # far beyond the others' norms
    ]
    return good + bad


def test_a_node_s_merged_reply_bills_and_counts_each_client_as_its_own_reply_would() -> None:
    cfg = RunConfig.from_mapping({"strategy": "fedavg", "merge-uploads": True, "norm-bound": 3.0})
    merged, alone = RecordDict(), RecordDict()
    merged_reply(cfg, merged, _outcomes(), {}, D, 1)
    for o in _outcomes():
        if o.payload is None:
            add_failure(alone, o.cid, o.error or "")
        else:
            add_update(alone, o.cid, o.payload, client_metrics(o.num_examples, o.loss, o.compute_s))
    asked = [o.cid for o in _outcomes()]
    out, own = _collect(merged, asked), _collect(alone, asked, UNMERGED)
    assert out.upload_bytes == own.upload_bytes > 0  # the same bytes, the refused ones included
    assert [m.cid for m in out.members] == [3, 1, 4] and out.updates == []
    assert sorted(_members(out)) == [_row(u) for u in own.updates if u.cid != 8]  # 8: set aside below
    assert [u.cid for u in out.contributors()] == [1, 3, 4]
    assert out.failures[7] == own.failures[7] == "out of memory"
    assert out.failures[9] == own.failures[9] == "array 'update' is float32[5]; expected float32[4]"
    assert out.failures[8].startswith("upload norm 600 is beyond norm-bound 3 x its cohort's median")
    assert (out.errors, out.rejected, out.bounded, out.timeouts) == (1, 1, 1, 0)
    (mean,) = out.merged
    assert (mean.cid, mean.num_examples, mean.loss, mean.upload_bytes, mean.node) == (3, 10, 1.75, 0, NODE)
    want = sum(o.num_examples * o.payload["update"] for o in _outcomes()[:3] if o.payload is not None) / 10
    np.testing.assert_allclose(mean.payload["update"], want, rtol=1e-6)
    assert out.clipped == 0 and wire.MERGED_KEY not in merged


def test_a_node_that_refused_every_upload_bills_and_rejects_them_as_their_own_replies_would() -> None:
    cfg = RunConfig.from_mapping({"strategy": "fedavg", "merge-uploads": True})
    outcomes = [
        ClientOutcome(1, {"update": np.ones(D + 1, F32)}, 6, 0.5, 0.5),
        ClientOutcome(2, {"update": np.array([np.nan, 0, 0, 0], F32)}, 6, 0.5, 0.5),
        ClientOutcome(5, None, error="killed"),
    ]
    merged, alone = RecordDict(), RecordDict()
    merged_reply(cfg, merged, outcomes, {}, D, 1)
    assert wire.MERGED_METRICS not in merged and wire.MERGED_KEY not in merged  # no mean: nothing accepted
    for o in outcomes:
        if o.payload is None:
            add_failure(alone, o.cid, o.error or "")
        else:
            add_update(alone, o.cid, o.payload, client_metrics(o.num_examples, o.loss, o.compute_s))
    out, own = _collect(merged, [1, 2, 5]), _collect(alone, [1, 2, 5], UNMERGED)
    assert out.failures == own.failures and out.kinds == own.kinds and len(out.failures) == 3
    assert out.upload_bytes == own.upload_bytes > 0 and (out.rejected, out.errors) == (2, 1)


def test_the_uploads_a_node_clipped_are_counted() -> None:
    cfg = RunConfig.from_mapping({"strategy": "fedavg", "merge-uploads": True, "clip-norm": 2.0})
    content = RecordDict()
    merged_reply(cfg, content, _outcomes()[:3], {}, D, 1)  # norms 3.7, 3.6 and 2.4
    out = _collect(content, [3, 1, 4])
    assert out.clipped == 3 and [m.cid for m in out.members] == [3, 1, 4]


# ------------------------------------------------------------------------------------------ billing
def test_each_member_is_billed_its_upload_and_metrics_and_the_mean_nothing() -> None:
    content = RecordDict()
    bills = [_client(content, 5, 1, num=2, loss=0.5), _client(content, 2, 2 * MAX, num=3, loss=1.5)]
    bills.append(_client(content, 6, 777, num=4, loss=None, **{"sketch-seed": 9}))
    _mean(content, 9)
    out = _collect(content, [5, 2, 6])
    assert _members(out) == [(5, 2, 0.5, bills[0], NODE), (2, 3, 1.5, bills[1], NODE), (6, 4, None, bills[2], NODE)]
    assert out.upload_bytes == sum(bills) and bills[1] == 2 * MAX + wire_bytes(MetricRecord(_values(3, 1.5)))
    assert (out.failed, out.failures) == (0, {})


@pytest.mark.parametrize(
    "billed",
    [2 * MAX + 1, 0, -3, 12.5, [7] * 30, None],
    ids=["over-twice-max-bytes", "zero", "negative", "float", "list", "missing"],
)
def test_an_upload_bytes_that_is_no_size_rejects_only_its_client_unbilled(billed: Any) -> None:
    content = RecordDict()
    good = _client(content, 1, num=3)
    content[wire.metrics_key(2)] = MetricRecord(
        {**_values(), **({} if billed is None else {wire.UPLOAD_BYTES: billed})}
    )
    _client(content, 3, num=5)
    _mean(content, 8)
    out = _collect(content, [1, 2, 3])
    assert out.failures == {2: f"upload-bytes {str(billed)[:40]} is not a size it can be"}
    assert (out.rejected, out.failed) == (1, 1)
    assert [m.cid for m in out.members] == [1, 3] and out.merged[0].num_examples == 8
    assert out.upload_bytes == 2 * good


@pytest.mark.parametrize(
    ("metrics", "reason"),
    [
        ({"num": 0}, "num-examples 0 is not an int in 1..50"),
        ({"num": 51}, "num-examples 51 is not an int in 1..50"),
        ({"num": 2.0}, "num-examples 2.0 is not an int in 1..50"),
        ({"num": None}, "num-examples None is not an int in 1..50"),
        ({"sketch-seed": 8}, "'sketch-seed' is 8; this round's is 9"),
    ],
    ids=["zero", "over-max-examples", "float", "missing", "echo"],
)
def test_bad_metrics_reject_only_their_client_which_is_still_billed(metrics: dict[str, Any], reason: str) -> None:
    limits = ReplyLimits(50, MAX, 1, {"sketch-seed": 9}, merged=True)
    content = RecordDict()
    bills = [_client(content, 4, 1000, **{"sketch-seed": 9, **metrics}), _client(content, 6, **{"sketch-seed": 9})]
    _mean(content, 4)
    out = _collect(content, [4, 6], limits)
    assert out.failures == {4: reason} and out.kinds == {4: "rejected"} and out.rejected == 1
    assert [m.cid for m in out.members] == [6] and out.merged[0].cid == 6
    assert out.upload_bytes == 1000 + wire_bytes(MetricRecord(_values(**{"sketch-seed": 9, **metrics}))) + bills[1]


# ------------------------------------------------------------------------------------------ clients not merged
@pytest.mark.parametrize(
    ("kind", "counted"),
    [("bounded", "bounded"), ("rejected", "rejected"), (None, "rejected"), ("other", "rejected")],
)
def test_a_refused_client_counts_by_its_kind_and_is_billed_what_it_sent(kind: str | None, counted: str) -> None:
    content = RecordDict()
    add_rejection(content, 2, "array 'update' has NaN or Inf", 4 * MAX, kind or "rejected")
    if kind is None:  # a record that does not say
        del content[wire.rejected_key(2)][wire.KIND]
    good = _client(content, 5)
    _mean(content, 4)
    out = _collect(content, [2, 5])
    assert out.failures == {2: "array 'update' has NaN or Inf"} and out.kinds == {2: counted}
    assert (out.bounded, out.rejected, out.failed) == (int(counted == "bounded"), int(counted == "rejected"), 1)
    assert out.upload_bytes == 4 * MAX + good and [m.cid for m in out.members] == [5]


@pytest.mark.parametrize("billed", [4 * MAX + 1, 0, True, 1.5, "lots", None], ids=str)
def test_a_refused_client_with_no_believable_size_is_billed_nothing(billed: Any) -> None:
    content = RecordDict()
    record: dict[str, Any] = {wire.KIND: "rejected", **({} if billed is None else {wire.UPLOAD_BYTES: billed})}
    content[wire.rejected_key(3)] = ConfigRecord(record)  # and no reason
    content[wire.rejected_key(4)] = ConfigRecord({wire.REASON: "bad", wire.UPLOAD_BYTES: 1, wire.KIND: "bounded"})
    out = _collect(content, [3, 4])
    assert out.failures == {3: "unknown", 4: "bad"} and out.upload_bytes == 1
    assert (out.rejected, out.bounded, out.merged, out.members) == (1, 1, [], [])


def test_failed_and_silent_clients_are_errors_and_rejections_and_the_rest_still_merge() -> None:
    content = RecordDict()
    add_failure(content, 8, "CUDA out of memory")
    content[wire.failure_key(2)] = ConfigRecord({"other": "x"})
    add_rejection(content, 2, "not this one", 50)  # a failure is read first
    bills = [_client(content, 6, num=3), _client(content, 1, num=2)]
    _mean(content, 5, clipped=None)
    out = _collect(content, [8, 2, 9, 6, 1])
    assert out.failures == {8: "CUDA out of memory", 2: "unknown", 9: "reply has no metrics for this client"}
    assert out.kinds == {8: "errors", 2: "errors", 9: "rejected"}
    assert (out.errors, out.rejected, out.bounded, out.upload_bytes) == (2, 1, 0, sum(bills))
    assert [m.cid for m in out.members] == [6, 1] and out.clipped == 0
    assert [(u.cid, u.num_examples) for u in out.merged] == [(6, 5)]


def test_a_run_without_merged_replies_refuses_every_client_of_one_unbilled() -> None:
    content = RecordDict()
    _client(content, 1)
    add_rejection(content, 2, "array 'update' has NaN or Inf", 100, "bounded")
    add_failure(content, 3, "boom")
    _mean(content, 4, clipped=1)
    out = _collect(content, [1, 2, 4, 3], UNMERGED)
    refused = "merged reply refused"
    assert out.failures == {1: refused, 2: refused, 4: refused, 3: "boom"}
    assert (out.rejected, out.bounded, out.errors, out.upload_bytes, out.clipped) == (3, 0, 1, 0, 0)
    assert (out.merged, out.members, out.updates) == ([], [], [])
    assert wire.MERGED_KEY not in content


# ------------------------------------------------------------------------------------------ the merged mean
CLIPPED: dict[str, Any] = {
    "clipped-list": [1] * 30,
    "clipped-nan": math.nan,
    "clipped-float": 1.0,
    "clipped-negative": -1,
    "clipped-over-members": 3,
}


def _bad_mean(content: RecordDict, case: str) -> None:
    if case == "no-arrays":
        _mean(content, 7)
        del content[wire.MERGED_KEY]
    elif case == "no-totals":
        _mean(content, 7)
        del content[wire.MERGED_METRICS]
    elif case in ("one-more", "one-less"):
        _mean(content, 8 if case == "one-more" else 6, clipped=2)
    elif case == "list":
        _mean(content, [7] * 30, clipped=2)
    elif case == "shape":
        _mean(content, 7, clipped=2, update=np.zeros(D + 1, F32))
    elif case in CLIPPED:
        _mean(content, 7, clipped=CLIPPED[case])
    elif case == "nan":
        _mean(content, 7, clipped=2, update=np.array([0, np.nan, 0, 0], F32))
    else:
        _mean(content, 7, clipped=2)


@pytest.mark.parametrize(
    ("case", "why"),
    [
        ("no-arrays", "no merged arrays and totals of a fixed layout"),
        ("no-totals", "no merged arrays and totals of a fixed layout"),
        ("decoder", "no merged arrays and totals of a fixed layout"),
        ("one-more", "num-examples 8 != the accepted clients' 7"),
        ("one-less", "num-examples 6 != the accepted clients' 7"),
        ("list", f"num-examples {str([7] * 30)[:40]} != the accepted clients' 7"),
        ("shape", "array 'update' is float32[5]; expected float32[4]"),
        ("nan", "array 'update' has NaN or Inf"),
        *[(case, f"clipped {str(value)[:40]} is not a count of its 2 uploads") for case, value in CLIPPED.items()],
    ],
)
def test_a_bad_merged_mean_rejects_every_member_still_billed(case: str, why: str) -> None:
    content = RecordDict()
    bills = [_client(content, 3, num=4), _client(content, 1, num=3)]
    add_failure(content, 5, "boom")
    _bad_mean(content, case)
    spec = (lambda p: p) if case == "decoder" else SPEC
    out = _collect(content, [3, 5, 1], spec=spec)
    assert out.failures == {3: f"merged upload: {why}", 5: "boom", 1: f"merged upload: {why}"}
    assert (out.rejected, out.errors, out.upload_bytes) == (2, 1, sum(bills))
    assert (out.merged, out.members, out.clipped) == ([], [], 0)
    assert wire.MERGED_KEY not in content


def test_a_reply_with_no_accepted_member_merges_nothing_whatever_its_mean() -> None:
    content = RecordDict()
    content[wire.metrics_key(1)] = MetricRecord(_values(num=0))  # no upload-bytes either
    add_rejection(content, 2, "bad", 10)
    _mean(content, 0, clipped=3)
    out = _collect(content, [1, 2])
    assert (out.merged, out.members, out.clipped, out.upload_bytes) == ([], [], 0, 10)
    assert set(out.failures) == {1, 2} and wire.MERGED_KEY not in content


@pytest.mark.parametrize(
    ("losses", "mean"),
    [([1.0, None, 3.0], 2.0), ([0.5], 0.5), ([None, None], math.nan), ([4.0, math.inf, 1.0], 2.5)],
    ids=["one-missing", "one", "none-finite", "one-infinite"],
)
def test_the_merged_loss_is_the_mean_of_the_members_finite_losses(losses: list[float | None], mean: float) -> None:
    content = RecordDict()
    for cid, loss in enumerate(losses):
        _client(content, 10 + cid, num=2, loss=loss)
    _mean(content, 2 * len(losses))
    (merged,) = _collect(content, [10 + c for c in range(len(losses))]).merged
    assert merged.loss == mean or (math.isnan(mean) and math.isnan(merged.loss))


def test_several_nodes_merged_replies_add_their_members_and_clipped_counts() -> None:
    first, second, third = RecordDict(), RecordDict(), RecordDict()
    for content, cids, clipped in [(first, [7, 3], 1), (second, [2, 9, 4], 3), (third, [5], None)]:
        for cid in cids:
            _client(content, cid, num=cid)
        _mean(content, sum(cids), clipped, update=np.full(D, float(cids[0]), F32))
    sent = {101: [7, 3], 102: [2, 9, 4], 103: [5]}
    out = replies.collect([_reply(second, 102), _reply(first, 101), _reply(third, 103)], sent, SPEC, LIMITS)
    assert [(u.cid, u.num_examples, u.node, u.upload_bytes) for u in out.merged] == [
        (2, 15, 102, 0),
        (5, 5, 103, 0),
        (7, 10, 101, 0),
    ]
    assert [float(u.payload["update"][0]) for u in out.merged] == [2.0, 5.0, 7.0]
    assert [m.cid for m in out.members] == [2, 9, 4, 7, 3, 5] and out.clipped == 4
    assert [u.cid for u in out.contributors()] == [2, 3, 4, 5, 7, 9]


@pytest.mark.parametrize("present", [wire.MERGED_KEY, wire.MERGED_METRICS])
def test_either_half_of_a_merged_mean_makes_the_reply_a_merged_one(present: str) -> None:
    content = RecordDict()
    _client(content, 1, num=3)
    _mean(content, 3)
    del content[wire.MERGED_METRICS if present == wire.MERGED_KEY else wire.MERGED_KEY]
    out = _collect(content, [1])
    assert out.failures == {1: "merged upload: no merged arrays and totals of a fixed layout"}
    assert out.updates == [] and out.upload_bytes == 300 + wire_bytes(MetricRecord(_values(num=3)))
