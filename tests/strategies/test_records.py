"""A round's counts for the books and its line in rounds.jsonl: every client asked counts once, by kind."""

from __future__ import annotations

import time

import pytest

from fedsketch.methods import ClientUpdate
from fedsketch.server.books import COUNTERS
from strategies import records
from strategies.replies import RoundReplies


def _update(cid: int) -> ClientUpdate:
    return ClientUpdate(cid=cid, payload={}, num_examples=1, loss=0.0, upload_bytes=10)


def _replies() -> RoundReplies:
    got = RoundReplies(
        updates=[_update(3), _update(1)],
        merged=[_update(-1)],
        members=[_update(7), _update(5)],
        upload_bytes=1234,
        diagnostic_bytes=56,
    )
    for cid, kind in [(8, "timeouts"), (9, "timeouts"), (None, "timeouts"), (11, "errors"), (12, "rejected")]:
        got.fail(cid, kind, f"{kind} of {cid}")
    got.fail(13, "bounded", "norm 9.0 beyond 3 x the median")
    return got


def test_each_client_that_did_not_contribute_counts_once_by_kind() -> None:
    got = _replies()
    counts = records.failure_counts(got)
    assert counts == {"failures": 6, "timeouts": 3, "client_errors": 1, "rejected": 1, "bounded": 1}
    assert counts["failures"] == got.failed and set(counts) <= set(COUNTERS)


def test_a_round_counts_its_bytes_and_its_contributors_with_the_dense_bytes_they_stand_for() -> None:
    got = _replies()
    assert records.reply_counts(got) == {"upload": 1234, "diagnostic": 56, **records.failure_counts(got)}
    counts = records.round_counts(got, dense_bytes=400)
    assert counts == {**records.reply_counts(got), "clients": 4, "dense": 1600}  # 2 unmerged, 2 merged members
    assert set(counts) <= set(COUNTERS)
    assert records.round_counts(RoundReplies(), 400) == {
        **records.reply_counts(RoundReplies()),
        "clients": 0,
        "dense": 0,
    }


def test_the_round_line_says_who_was_asked_answered_and_failed_and_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(time, "time", lambda: 1700000000.12345)
    line = records.round_line(4, 10, _replies(), None, 4, missing=2)
    assert line == {
        "round": 4,
        "missing_nodes": 2,
        "sampled": 10,
        "clients": 4,
        "timeouts": 3,
        "client_errors": 1,
        "rejected": 1,
        "bounded": 1,
        "applied": True,
        "reason": "",
        "unix_time": 1700000000.123,
        "first_failure": "client 8: timeouts of 8",
    }
    skipped = records.round_line(5, 3, RoundReplies(), "too few clients", 0)
    assert skipped["applied"] is False and skipped["reason"] == "too few clients"
    assert skipped["missing_nodes"] == 0 and "first_failure" not in skipped
