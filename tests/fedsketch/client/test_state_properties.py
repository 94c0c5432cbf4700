"""A client's pending state is committed only when the server applied the upload that led to it.

:func:`fedsketch.client.state.settle` over many random participation
histories, and the real round (strategy and ClientApp in one process) on a
client's second and third participation: an upload the server did not apply
leaves the client's next upload exactly as if that round had never sampled it,
whatever the client kept from the rounds before.
"""

from __future__ import annotations

from typing import cast

import numpy as np
import pytest
import torch
from flwr.app import Message
from flwr.serverapp import Grid

from bridge.flower import task_identity
from fedsketch import wire
from fedsketch.client import state as client_state
from fedsketch.config import RunConfig
from strategies.plan import sample_clients
from strategies.server_app import build_strategy
from tests.federation import TestGrid
from tests.fedsketch.client.test_state_exact import TINY, Payload, _drop, _round, _same, _without


def test_settle_commits_exactly_the_last_applied_upload_over_random_histories() -> None:
    rng = np.random.default_rng(0)
    for _ in range(300):
        stored: client_state.State = {}
        applied: int | None = None  # what the server knows: the last round it applied this client's upload
        expected: client_state.State = {}  # the state of that upload
        for rnd in range(1, int(rng.integers(2, 15))):
            if rng.random() < 0.5:
                continue  # not sampled
            base = client_state.settle(stored, applied)
            assert base.keys() == expected.keys() and all(torch.equal(base[k], expected[k]) for k in base), rnd
            new = {"error": torch.full((3,), float(rnd)), "momentum": torch.full((2,), -float(rnd))}
            stored = client_state.with_pending(base, new, rnd)
            if rng.random() < 0.5:  # the server applied it
                applied, expected = rnd, new


def _participations(cfg: RunConfig, rounds: int) -> tuple[int, list[int]]:
    """A client sampled at least four times, and the rounds it is sampled in."""
    seen: dict[int, list[int]] = {}
    for r in range(1, rounds + 1):
        for cid in sample_clients(cfg.seed, r, cfg.num_clients, cfg.clients_per_round):
            seen.setdefault(cid, []).append(r)
    cid = next(c for c in sorted(seen) if len(seen[c]) >= 4)
    return cid, seen[cid]


def _upload_after(name: str, nth: int, leave_out: bool) -> Payload:
    """The client's upload at its participation ``nth + 1``, its reply at participation ``nth`` dropped (or the
    client left out of that round); every earlier participation applied."""
    cid, rounds = _participations(RunConfig.from_mapping({**TINY, "strategy": name}), 10)
    faulty, after = rounds[nth - 1], rounds[nth]
    cfg = RunConfig.from_mapping({**TINY, "num-rounds": after, "eval-every": after, "strategy": name})
    captured: dict[str, Payload] = {}

    def deliver(msg: Message) -> Message:
        return _without(msg, cid) if leave_out and _round(msg)[0] == faulty else msg

    def tamper(requests: list[Message], replies: list[Message]) -> list[Message]:
        rnd, phase = _round(requests[0])
        for reply in replies:
            if wire.update_key(cid) not in reply.content.array_records:
                continue
            if (rnd, phase) == (faulty, 1):
                _drop(reply, cid)
            if (rnd, phase) == (after, 1):
                captured["up"] = {k: a.numpy() for k, a in reply.content.array_records[wire.update_key(cid)].items()}
        return replies

    strat = build_strategy(cfg, None)
    with task_identity():
        strat.start(cast(Grid, TestGrid(cfg.to_mapping(), num_nodes=2, tamper=tamper, deliver=deliver)))
    assert "up" in captured and strat.books.applied.get(cid) != faulty
    return captured["up"]


@pytest.mark.parametrize("nth", [2, 3])
@pytest.mark.parametrize("name", ["local_topk", "powersgd"])
def test_an_unapplied_upload_on_a_later_participation_leaves_no_trace(name: str, nth: int) -> None:
    assert _same(_upload_after(name, nth, leave_out=False), _upload_after(name, nth, leave_out=True))
