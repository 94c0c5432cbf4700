"""PowerSGD: one step of the compressor against a direct computation, and its error feedback.

The reference is PyTorch's ``powerSGD_hook`` (Vogels et al., NeurIPS 2019): its
Gram-Schmidt, its choice of which tensors to compress, and the algebra of one
power iteration, computed directly in float64 on a small model's gradient.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch
from flwr.app import Message
from method_helpers import encode
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as hook
from torch.nn import functional as F

from bridge.flower import task_identity
from tests.federation import TestGrid
from fedsketch import wire
from fedsketch.algorithms import powersgd
from fedsketch.config import RunConfig
from fedsketch.methods import ClientUpdate, Round, get_method
from fedsketch.methods.powersgd import plan
from fedsketch.model.flat import get_flat, get_flat_grad
from fedsketch.model.models import build_model
from strategies.server_app import build_strategy

SHAPES = [(64, 20), (64,), (10, 64), (10,), (3, 3), (8, 4, 3, 3)]


def test_gram_schmidt_is_the_hooks() -> None:
    m = torch.randn(50, 3, generator=torch.Generator().manual_seed(0))
    theirs = m.clone().unsqueeze(0)
    hook._orthogonalize_gram_schmidt(theirs, epsilon=powersgd.EPSILON)
    torch.testing.assert_close(powersgd.orthogonalize(m), theirs[0])
    ours = powersgd.orthogonalize(m)
    torch.testing.assert_close(ours.T @ ours, torch.eye(3), atol=1e-5, rtol=0)


@pytest.mark.parametrize("rank", [1, 2, 4])
def test_which_tensors_are_compressed_is_the_hooks_choice(rank: int) -> None:
    p = powersgd.plan(SHAPES, rank)
    for shape, block in zip(SHAPES, p.blocks, strict=True):
        if len(shape) < 2:
            assert block.rank == 0  # vectors are sent whole, as the hook sends them
            continue
        n, m = shape[0], math.prod(shape[1:])
        r = min(n, m, rank)
        compress, _, _ = hook._should_compress(n, m, r, powersgd.MIN_COMPRESSION_RATE)
        assert (block.rank == r) if compress else (block.rank == 0)
    assert sum(b.size for b in p.blocks) == sum(math.prod(s) for s in SHAPES)


def test_one_step_of_the_compressor_matches_a_direct_float64_computation() -> None:
    """A small model's gradient: P = M Q_hat, P_hat = orth(P), Q = M^T P_hat, M_hat = P_hat Q^T, per matrix."""
    model = build_model("mlp", (20,), 5, seed=0, hidden=32)
    x, y = torch.randn(16, 20, generator=torch.Generator().manual_seed(1)), torch.arange(16) % 5
    F.cross_entropy(model(x), y).backward()
    g, shapes = get_flat_grad(model), [tuple(p.shape) for p in model.parameters()]
    p = powersgd.plan(shapes, 2)
    q_hat = powersgd.orthogonalize_all(powersgd.initial_q(p, 3), p, "q")
    p_hat = powersgd.orthogonalize_all(powersgd.project(g, q_hat, p), p, "p")
    ours = powersgd.expand(p_hat, powersgd.back_project(g, p_hat, p), powersgd.whole(g, p), p, g.numel())
    direct, qs, start = torch.zeros(g.numel(), dtype=torch.float64), q_hat.double(), 0
    for shape, block in zip(shapes, p.blocks, strict=True):
        piece = g[block.start : block.start + block.size].double()
        if not block.rank:
            direct[block.start : block.start + block.size] = piece
            continue
        mat = piece.view(block.rows, block.cols)
        q = qs[start : start + block.cols * block.rank].view(block.cols, block.rank)
        start += block.cols * block.rank
        ph = (mat @ q).unsqueeze(0)
        hook._orthogonalize_gram_schmidt(ph, epsilon=powersgd.EPSILON)
        direct[block.start : block.start + block.size] = (ph[0] @ (mat.T @ ph[0]).T).reshape(-1)
    assert any(b.rank for b in p.blocks) and any(not b.rank for b in p.blocks)
    torch.testing.assert_close(ours.double(), direct, rtol=1e-5, atol=1e-6)


def _cfg(**settings: object) -> RunConfig:
    base = {"strategy": "powersgd", "num-clients": 10, "clients-per-round": 3, "model-hidden": 16, "momentum": 0.0}
    return RunConfig.from_mapping({**base, **settings})


def test_one_client_round_applies_its_rank_r_update_and_keeps_what_was_not_sent() -> None:
    cfg = _cfg(lr=1.0)
    method, p = get_method("powersgd"), plan(cfg)
    d = sum(b.size for b in p.blocks)
    state = method.server.init(cfg, d, torch.device("cpu"))
    request = method.server.requests(state, [4], cfg, d)[4]
    g = torch.randn(d, generator=torch.Generator().manual_seed(5))
    payload, kept = encode(cfg, g, cid=4, request=request)
    assert set(payload) == {"p", "whole"} and payload["p"].size == p.p_size and payload["whole"].size == p.whole_size
    first = Round(1, 1.0, [ClientUpdate(4, payload, 8, 0.0, 0)], d, g.device)
    assert method.server.ask is not None
    query = method.server.ask(state, first, cfg)  # the server's half, without a round loop
    assert query.cids == (4,) and query.layout == {"q": ((p.q_size,), np.dtype(np.float32))}
    out, after = method.client.answer(kept, query.payload, cfg)  # type: ignore[misc]  # the client's half
    answered = replace(first, query=query, answers=(ClientUpdate(4, out, 8, 0.0, 0),))
    state, delta = method.server.step(state, answered, cfg)
    error = after["error"]
    torch.testing.assert_close(delta + error, g, rtol=0, atol=1e-5)  # what was sent + what is kept = the update
    assert float(error.norm()) > 0.01 * float(g.norm())  # rank 2 does not carry everything
    assert torch.equal(state.q, torch.from_numpy(out["q"]))  # next round's warm start: this round's mean Q


def test_error_feedback_conserves_mass_over_rounds() -> None:
    """Sent (P_hat Q^T and the whole tensors) plus the error kept equals the sum of the updates."""
    cfg = _cfg()
    method, p = get_method("powersgd"), plan(cfg)
    d = sum(b.size for b in p.blocks)
    state, kept = method.server.init(cfg, d, torch.device("cpu")), {}
    sent, total = torch.zeros(d, dtype=torch.float64), torch.zeros(d, dtype=torch.float64)
    for rnd in range(1, 6):
        g = torch.randn(d, generator=torch.Generator().manual_seed(rnd))
        payload, kept = encode(
            cfg, g, cid=0, server_round=rnd, state=kept, request=method.server.requests(state, [0], cfg, d)[0]
        )
        p_hat = powersgd.orthogonalize_all(torch.from_numpy(payload["p"]), p, "p")
        out, kept = method.client.answer(kept, {"p": p_hat.numpy()}, cfg)  # type: ignore[misc]
        sent += powersgd.expand(p_hat, torch.from_numpy(out["q"]), torch.from_numpy(payload["whole"]), p, d).double()
        total += g.double()
        state = type(state)(state.velocity, torch.from_numpy(out["q"]))
    torch.testing.assert_close(sent + kept["error"].double(), total, rtol=0, atol=1e-4)


def test_a_client_without_exchange_one_state_cannot_answer() -> None:
    with pytest.raises(ValueError, match="no PowerSGD exchange-1 state"):
        get_method("powersgd").client.answer({}, {"p": torch.zeros(1).numpy()}, _cfg())  # type: ignore[misc]


def test_the_model_update_is_rank_r_per_matrix() -> None:
    cfg = _cfg(**{"powersgd-rank": 1})
    model = build_model("mlp", (60,), 10, seed=0, hidden=16)
    p = powersgd.plan([tuple(q.shape) for q in model.parameters()], 1)
    w = get_flat(model)
    q_hat = powersgd.orthogonalize_all(powersgd.initial_q(p, 0), p, "q")
    g = torch.randn(w.numel())
    p_hat = powersgd.orthogonalize_all(powersgd.project(g, q_hat, p), p, "p")
    update = powersgd.expand(p_hat, powersgd.back_project(g, p_hat, p), powersgd.whole(g, p), p, g.numel())
    for block in p.blocks:
        if block.rank:
            mat = update[block.start : block.start + block.size].view(block.rows, block.cols)
            assert int(torch.linalg.matrix_rank(mat)) == 1
    assert cfg.to_mapping()["powersgd-rank"] == 1


def test_a_node_the_server_has_not_heard_from_gets_the_current_warm_start() -> None:
    """One client per node: a node names its client only in its reply, so its first request carries the
    warm start under ``request.new``. Round 1 samples clients 1-3, round 2 clients 0, 1 and 3: client 0's
    node is new in round 2 and must get round 2's warm start, the one the known nodes get by name."""
    cfg = _cfg(**{"client-assignment": "node", "num-clients": 4, "min-nodes": 4, "num-rounds": 2, "eval-every": 1})
    sent: list[Message] = []

    def watch(requests: list[Message], replies: list[Message]) -> list[Message]:
        sent.extend(m for m in requests if wire.MODEL_KEY in m.content.array_records)  # first exchanges only
        return replies

    strat = build_strategy(cfg, None)
    with task_identity():
        strat.start(TestGrid(cfg.to_mapping(), num_nodes=4, tamper=watch))  # type: ignore[arg-type]
    keys, qs = [], []
    for msg in sent:
        (key,) = [k for k in msg.content.array_records if wire.request_cid(k) is not None]
        keys.append((int(msg.content.config_records[wire.CONFIG_KEY][wire.ROUND]), key))  # type: ignore[arg-type]
        qs.append(msg.content.array_records[key]["q"].numpy())
    new = wire.request_key(wire.NEW_CLIENT)
    assert keys == [(1, new)] * 3 + [(2, new), (2, wire.request_key(1)), (2, wire.request_key(3))]
    assert all(np.array_equal(q, qs[0]) for q in qs[:3]) and all(np.array_equal(q, qs[3]) for q in qs[3:])
    assert not np.array_equal(qs[0], qs[3])  # round 1's mean Q became round 2's warm start
    assert [r["clients"] for r in strat.history] == [3, 3] and strat.books.totals["client_errors"] == 0
