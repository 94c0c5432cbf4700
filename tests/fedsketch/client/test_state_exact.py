"""A client's state changes only by what the server applied.

For every method whose clients keep state, a client whose upload in round r1 is
rejected (corrupt values), missing from its node's reply (as after a time-out),
or sent in a round that is skipped (``min-replies``) must upload in its next
round r2 exactly what it would have, had round r1 never sampled it. The
reference run leaves the client out of round r1's request; the model the
client sees in r2 is the same in both, so any difference is its state.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message
from flwr.serverapp import Grid

from bridge.flower import task_identity
from fedsketch import wire
from fedsketch.config import RunConfig
from fedsketch.methods import METHODS
from strategies.plan import sample_clients
from strategies.server_app import build_strategy
from tests.federation import TestGrid

STATEFUL = [m.name for m in METHODS if m.client.state_vectors(RunConfig.from_mapping({"strategy": m.name}))]
TINY = {
    "num-clients": 6,
    "clients-per-round": 3,
    "model-hidden": 16,
    "k": 40,
    "sketch-rows": 3,
    "sketch-cols": 300,
    "num-rounds": 6,
    "eval-every": 6,
    "lr": 0.3,
}
Payload = dict[str, np.ndarray]


def _round(msg: Message) -> tuple[int, int]:
    config = msg.content.config_records[wire.CONFIG_KEY]
    return int(config[wire.ROUND]), int(config.get(wire.PHASE, 1))  # type: ignore[arg-type]


def _client_twice(cfg: RunConfig) -> tuple[int, int, int, int]:
    """A client sampled in round r1 and next in r2, and another client of r1: (client, r1, r2, other)."""
    rounds = {r: sample_clients(cfg.seed, r, cfg.num_clients, cfg.clients_per_round) for r in range(1, 7)}
    for r1 in range(1, 6):
        for cid in rounds[r1]:
            later = [r for r in range(r1 + 1, 7) if cid in rounds[r]]
            if later:
                return cid, r1, later[0], next(c for c in rounds[r1] if c != cid)
    raise AssertionError("no client is sampled twice")


def _without(msg: Message, cid: int) -> Message:
    """The request as if the round had not sampled ``cid``."""
    config = dict(msg.content.config_records[wire.CONFIG_KEY])
    cids = [int(c) for c in config[wire.CIDS]]  # type: ignore[union-attr]
    if cid in cids:
        at = cids.index(cid)
        config[wire.CIDS] = cids[:at] + cids[at + 1 :]
        if wire.SETTLED in config:
            settled = list(config[wire.SETTLED])  # type: ignore[arg-type]
            config[wire.SETTLED] = settled[:at] + settled[at + 1 :]
        msg.content[wire.CONFIG_KEY] = ConfigRecord(config)  # type: ignore[arg-type]
        if wire.request_key(cid) in msg.content.array_records:
            del msg.content[wire.request_key(cid)]
    return msg


def _corrupt(msg: Message, cid: int) -> None:
    """NaN in the client's first float array: the server rejects the reply."""
    record = msg.content.array_records[wire.update_key(cid)]
    name = next(n for n, arr in record.items() if arr.numpy().dtype.kind == "f")
    bad = record[name].numpy().copy()
    bad.flat[0] = np.nan
    msg.content[wire.update_key(cid)] = ArrayRecord({**dict(record.items()), name: Array(bad)})


def _drop(msg: Message, cid: int) -> None:
    for key in (wire.update_key(cid), wire.metrics_key(cid)):
        if key in msg.content:
            del msg.content[key]


FAULTS: dict[str, Callable[[Message, int], None]] = {"rejected": _corrupt, "missing": _drop, "skipped": _drop}


def _next_upload(name: str, fault: str | None, leave_out: bool) -> Payload:
    """Run the tiny job; return the client's first upload of round r2."""
    skip = {"min-replies": TINY["clients-per-round"]} if fault == "skipped" else {}
    cid, r1, r2, other = _client_twice(RunConfig.from_mapping({**TINY, **skip, "strategy": name}))
    cfg = RunConfig.from_mapping({**TINY, **skip, "strategy": name, "num-rounds": r2, "eval-every": r2})  # no later
    captured: dict[str, Payload] = {}

    def deliver(msg: Message) -> Message:
        return _without(msg, cid) if leave_out and _round(msg) == (r1, 1) else msg

    def tamper(requests: list[Message], replies: list[Message]) -> list[Message]:
        rnd, phase = _round(requests[0])
        for reply in replies:
            content = reply.content
            if (rnd, phase) == (r1, 1) and fault is not None:
                if fault == "skipped" and wire.update_key(other) in content.array_records:
                    _drop(reply, other)  # one reply short of min-replies: the round is not applied
                if not leave_out and fault != "skipped" and wire.update_key(cid) in content.array_records:
                    FAULTS[fault](reply, cid)
            if (rnd, phase) == (r2, 1) and wire.update_key(cid) in content.array_records:
                captured["up"] = {k: a.numpy() for k, a in content.array_records[wire.update_key(cid)].items()}
        return replies

    strat = build_strategy(cfg, None)
    with task_identity():
        strat.start(cast(Grid, TestGrid(cfg.to_mapping(), num_nodes=2, tamper=tamper, deliver=deliver)))
    assert "up" in captured, f"client {cid} uploaded nothing in round {r2}"
    return captured["up"]


def _same(a: Payload, b: Payload) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k], equal_nan=True) for k in a)


@pytest.mark.parametrize("fault", ["rejected", "missing", "skipped"])
@pytest.mark.parametrize("name", STATEFUL)
def test_an_upload_the_server_did_not_apply_leaves_no_trace_in_the_client(name: str, fault: str) -> None:
    assert _same(_next_upload(name, fault, leave_out=False), _next_upload(name, fault, leave_out=True))


def test_every_stateful_method_is_covered() -> None:
    assert set(STATEFUL) == {"local_topk", "random_k", "gaussiank", "signsgd", "sketched_sgd", "powersgd"}


@pytest.mark.parametrize("skipped", [False, True])
def test_the_next_request_says_whether_the_last_upload_was_applied(skipped: bool) -> None:
    """A client whose round-r1 upload was applied is told r1 in round r2 (and commits); after a skipped round, not."""
    cfg = RunConfig.from_mapping({**TINY, "strategy": "local_topk", **({"min-replies": 3} if skipped else {})})
    cid, r1, r2, other = _client_twice(cfg)
    told: list[int] = []

    def deliver(msg: Message) -> Message:
        config = msg.content.config_records[wire.CONFIG_KEY]
        cids = [int(c) for c in config[wire.CIDS]]  # type: ignore[union-attr]
        if _round(msg) == (r2, 1) and cid in cids:
            told.append(int(config[wire.SETTLED][cids.index(cid)]))  # type: ignore[index]
        return msg

    def tamper(requests: list[Message], replies: list[Message]) -> list[Message]:
        if skipped and _round(requests[0]) == (r1, 1):
            for reply in replies:
                _drop(reply, other)
        return replies

    strat = build_strategy(cfg, None)
    with task_identity():
        strat.start(cast(Grid, TestGrid(cfg.to_mapping(), num_nodes=2, tamper=tamper, deliver=deliver)))
    assert len(told) == 1 and (told[0] != r1 if skipped else told[0] == r1)
