"""A second-exchange answer that is lost (Sketched-SGD's exact values, PowerSGD's Q).

PowerSGD commits a client's new error only once its answer was used
(``commit = "answer"``): a client whose answer is lost keeps exactly the state it
started the round with, as if the round had not sampled it, and the server does
not tell it that round was applied. Sketched-SGD commits on the upload: the
client's accumulated error ``v_i`` was not read, so it keeps all of it, and the
server holds no pending support for it (it zeroed the old one in phase 1 and
none of its values went into the new update). Either way no update mass is
lost (Ivkin et al., NeurIPS 2019; Vogels et al., NeurIPS 2019).
"""

from __future__ import annotations

from typing import cast

import pytest
import torch
from flwr.app import Message
from flwr.serverapp import Grid

from bridge.flower import task_identity
from clients.client_app import ContextStates
from fedsketch import wire
from fedsketch.algorithms import sketched_sgd
from fedsketch.client import state as client_state
from fedsketch.config import RunConfig
from strategies.server_app import build_strategy
from tests.federation import TestGrid
from tests.fedsketch.client.test_state_exact import TINY, _drop, _round
from tests.fedsketch.client.test_state_properties import _participations

D = 2_000


def _same(a: client_state.State, b: client_state.State) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _run(name: str, lose: bool) -> dict[str, object]:
    """A client that answered the second exchange at its first participation; at its second its answer is lost
    (``lose``) or not. What it kept and what the server told it, up to its third participation."""
    cid, rounds = _participations(RunConfig.from_mapping({**TINY, "strategy": name}), 10)
    lost, after = rounds[1], rounds[2]
    cfg = RunConfig.from_mapping({**TINY, "num-rounds": after, "eval-every": after, "strategy": name})
    grid = TestGrid(cfg.to_mapping(), num_nodes=2)
    seen: dict[str, object] = {}

    def stored() -> client_state.State:
        return next((s for ctx in grid.contexts.values() if (s := ContextStates(ctx).load(cid))), {})

    def deliver(msg: Message) -> Message:
        config = msg.content.config_records[wire.CONFIG_KEY]
        cids = [int(c) for c in config[wire.CIDS]]  # type: ignore[union-attr]
        if _round(msg) == (after, 1) and cid in cids:
            seen["told"] = int(config[wire.SETTLED][cids.index(cid)])  # type: ignore[index]
            seen["support"] = wire.request_key(cid) in msg.content.array_records
            seen["kept"] = stored()
        return msg

    def tamper(requests: list[Message], replies: list[Message]) -> list[Message]:
        rnd, phase = _round(requests[0])
        if (rnd, phase) == (lost, 1):
            seen["start"] = client_state.committed(stored())  # what the client started this round from
            seen["phase1"] = client_state.pending(stored(), lost)  # what its upload led to
        for reply in replies:
            if lose and (rnd, phase) == (lost, 2) and wire.update_key(cid) in reply.content.array_records:
                _drop(reply, cid)
                seen["dropped"] = True
        if (rnd, phase) == (after, 1):
            seen["base"] = client_state.committed(stored())  # what the client started its next round from
        return replies

    grid.tamper, grid.deliver = tamper, deliver
    strat = build_strategy(cfg, None)
    with task_identity():
        strat.start(cast(Grid, grid))
    assert seen.get("dropped", False) == lose and "base" in seen and "told" in seen
    return {**seen, "earlier": rounds[0], "lost": lost}


@pytest.mark.parametrize("lose", [True, False])
def test_powersgd_a_lost_answer_leaves_the_client_as_if_not_sampled(lose: bool) -> None:
    seen = _run("powersgd", lose)
    start, base = cast(client_state.State, seen["start"]), cast(client_state.State, seen["base"])
    assert "error" in start  # it kept an error from its earlier, applied participation
    if lose:
        assert _same(base, start) and seen["told"] == seen["earlier"]
    else:
        assert not _same(base, start) and seen["told"] == seen["lost"]


@pytest.mark.parametrize("lose", [True, False])
def test_sketched_sgd_a_lost_answer_keeps_all_it_accumulated_and_nothing_pending(lose: bool) -> None:
    seen = _run("sketched_sgd", lose)
    phase1, base = cast(client_state.State, seen["phase1"]), cast(client_state.State, seen["base"])
    assert seen["told"] == seen["lost"] and _same(base, phase1)  # the upload was applied: its state counts
    assert seen["support"] is not lose  # answered: zero at the update's support next time; lost: nothing pending


def test_sketched_sgd_lost_answers_lose_no_update_mass() -> None:
    """Applied updates plus every client's remaining error equal the sum of the updates, whoever's answers are lost.

    A client whose answer is lost keeps its whole ``v_i`` and is owed no zeroing;
    an answering client zeroes the update's support when it next takes part.
    """
    p = sketched_sgd.SketchedSGDParams(d=D, rows=5, cols=500, seed=4, k=15, candidate_factor=3, momentum=0.0)
    gen = torch.Generator().manual_seed(0)
    server = sketched_sgd.ServerState()
    states: dict[int, sketched_sgd.ClientState | None] = dict.fromkeys(range(4))
    applied, total = torch.zeros(D, dtype=torch.float64), torch.zeros(D, dtype=torch.float64)
    lost_any = 0
    for _ in range(10):
        sampled = [c for c in range(4) if torch.rand(1, generator=gen) < 0.7] or [0]
        tables = []
        for cid in sampled:
            g = torch.randn(D, generator=gen) * (torch.rand(D, generator=gen) < 0.05)
            states[cid], table = sketched_sgd.client_step(states[cid], g, p, server.pending.get(cid))
            tables.append(table)
            total += g.double()
        cands = sketched_sgd.candidates(torch.stack(tables).mean(0), p)
        answered = [c for c in sampled if torch.rand(1, generator=gen) < 0.6]
        lost_any += len(sampled) - len(answered)
        exact = torch.zeros(cands.numel())
        for cid in answered:
            exact += sketched_sgd.client_answer(cast(sketched_sgd.ClientState, states[cid]), cands)
        server, idx, vals = sketched_sgd.server_step(server, p, cands, exact, sampled, answered)
        applied[idx] += vals.double()
    remaining = torch.zeros(D, dtype=torch.float64)
    for cid, s in states.items():
        if s is not None:
            error = s.error.clone()
            if cid in server.pending:
                error[server.pending[cid]] = 0.0  # what it zeroes when it next takes part
            remaining += error.double()
    assert lost_any > 5
    torch.testing.assert_close(applied + remaining, total, rtol=0, atol=1e-4)
