"""PowerSGD: one step against a direct computation, its error feedback, its math on exact float64 values.

The reference is PyTorch's ``powerSGD_hook`` (Vogels et al., NeurIPS 2019): its
Gram-Schmidt, its choice of which tensors to compress, and the algebra of one
power iteration, computed directly in float64 on a small model's gradient.

Then Vogels, Karimireddy and Jaggi, NeurIPS 2019, Algorithm 1, one power iteration:
``P = M Q_hat``, ``P_hat = orth(P)``, ``Q = M^T P_hat``, ``M_hat = P_hat Q^T``;
the client keeps ``M - M_hat``, what was not sent. Each block of a plan is
checked against a reference written here with ``torch.linalg`` in float64, on
a model whose whole tensors differ in size and whose matrices are not square,
so that a factor or a slice read from the wrong place shows.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch
from flwr.app import Message
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as hook
from torch.nn import functional as F

from bridge.flower import task_identity
from fedsketch import wire
from fedsketch.algorithms import powersgd
from fedsketch.algorithms.powersgd import Block
from fedsketch.config import RunConfig
from fedsketch.methods import ClientUpdate, Round, get_method
from fedsketch.methods.powersgd import plan
from fedsketch.model.flat import get_flat, get_flat_grad
from fedsketch.model.models import build_model
from strategies.server_app import build_strategy
from tests.federation import TestGrid
from tests.method_helpers import encode

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


# exact float64 values: the plan, Gram-Schmidt, both exchanges and the error kept ----------------------------


# rank 2: a 3-vector, a 12 x 10 matrix (compressed), a 5-vector, a 16 x 2 x 3 x 2 conv (16 x 12, compressed),
# a 2 x 2 matrix (too small to gain: whole), a 7-vector, a 10 x 9 matrix (compressed)
SHAPES_SMALL = [(3,), (12, 10), (5,), (16, 2, 3, 2), (2, 2), (7,), (10, 9)]
BLOCKS = (
    Block(0, 3, 1, 0),
    Block(3, 12, 10, 2),
    Block(123, 5, 1, 0),
    Block(128, 16, 12, 2),
    Block(320, 2, 2, 0),
    Block(324, 7, 1, 0),
    Block(331, 10, 9, 2),
)
D = 421


def _vector(seed: int, n: int = D) -> torch.Tensor:
    return torch.randn(n, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


def _orth_reference(m: torch.Tensor) -> torch.Tensor:
    """Orthonormal columns spanning the leading columns of ``m`` in order: QR with R's diagonal made positive."""
    q, r = torch.linalg.qr(m)
    return q * torch.sign(torch.diagonal(r))


def test_the_plan_places_every_tensor_and_compresses_where_the_hook_would() -> None:
    p = powersgd.plan(SHAPES_SMALL, 2)
    assert p.blocks == BLOCKS
    assert sum(b.size for b in p.blocks) == D == sum(math.prod(s) for s in SHAPES_SMALL)
    assert (p.p_size, p.q_size, p.whole_size) == ((12 + 16 + 10) * 2, (10 + 12 + 9) * 2, 3 + 5 + 4 + 7)


def test_a_scalar_parameter_is_one_float_sent_whole() -> None:
    """A 0-d parameter (a learned temperature, say) has no first dimension to make rows of."""
    assert powersgd.plan([(), (12, 10)], 2).blocks == (Block(0, 1, 1, 0), Block(1, 12, 10, 2))


@pytest.mark.parametrize(("shape", "rank", "kept"), [((8, 8), 2, 0), ((9, 8), 2, 2), ((8, 8), 1, 1), ((2, 3), 5, 0)])
def test_a_matrix_is_compressed_only_where_the_factors_take_under_half_its_floats(
    shape: tuple[int, int], rank: int, kept: int
) -> None:
    """8 x 8 at rank 2: the factors take (8 + 8) 2 = 32 floats, exactly half of 64, so it is sent whole."""
    (block,) = powersgd.plan([shape], rank).blocks
    assert block == Block(0, shape[0], shape[1], kept)


def test_gram_schmidt_divides_by_the_norm_plus_epsilon() -> None:
    """One column of norm 5: divided by 5 + 1e-8, to the bit (float64 tells 5 + 1e-8 from 5 - 1e-8)."""
    out = powersgd.orthogonalize(torch.tensor([[3.0], [4.0]], dtype=torch.float64))
    assert torch.equal(out, torch.tensor([[3.0 / (5 + 1e-8)], [4.0 / (5 + 1e-8)]], dtype=torch.float64))
    assert powersgd.EPSILON == 1e-8


def test_gram_schmidt_is_qr_and_leaves_its_input_alone() -> None:
    """Five columns in float64, no epsilon: every column orthonormal, spanning the same leading columns as QR's."""
    m = _vector(1, 40).view(8, 5)
    before = m.clone()
    ours = powersgd.orthogonalize(m, epsilon=0.0)
    torch.testing.assert_close(ours, _orth_reference(m), rtol=0, atol=1e-12)
    torch.testing.assert_close(ours.T @ ours, torch.eye(5, dtype=torch.float64), rtol=0, atol=1e-12)
    assert torch.equal(m, before)
    with_eps = powersgd.orthogonalize(m)  # the default epsilon moves each column by about 1e-8 of its norm
    torch.testing.assert_close(with_eps, ours, rtol=0, atol=1e-7)


def test_a_zero_column_stays_zero_and_the_others_are_still_orthonormal() -> None:
    """Vanishing gradients: 0 / (0 + epsilon) is 0, not NaN, and projecting onto a zero column removes nothing."""
    m = torch.tensor([[0.0, 1.0, 1.0], [0.0, 2.0, 0.0], [0.0, 2.0, 3.0]], dtype=torch.float64)
    out = powersgd.orthogonalize(m)
    assert torch.equal(out[:, 0], torch.zeros(3, dtype=torch.float64))
    torch.testing.assert_close(out[:, 1:], _orth_reference(m[:, 1:]), rtol=0, atol=1e-7)


def test_orthogonalize_all_treats_each_factor_on_its_own() -> None:
    p = powersgd.plan(SHAPES_SMALL, 2)
    for side, rows in (("p", (12, 16, 10)), ("q", (10, 12, 9))):
        flat = _vector(2, sum(n * 2 for n in rows))
        out = powersgd.orthogonalize_all(flat, p, side)
        assert out.shape == flat.shape and out.dtype == torch.float64
        factors = flat.split([n * 2 for n in rows])
        want = torch.cat([_orth_reference(f.view(n, 2)).reshape(-1) for f, n in zip(factors, rows, strict=True)])
        torch.testing.assert_close(out, want, rtol=0, atol=1e-7)


def test_the_first_q_is_standard_normal_from_its_seed() -> None:
    p = powersgd.plan(SHAPES_SMALL, 2)
    q = powersgd.initial_q(p, 11)
    assert torch.equal(q, torch.randn(p.q_size, generator=torch.Generator().manual_seed(11)))
    assert torch.equal(q, powersgd.initial_q(p, 11)) and not torch.equal(q, powersgd.initial_q(p, 12))


def test_one_power_iteration_against_torch_linalg_in_float64() -> None:
    """Both exchanges, the update the factors stand for, and the error kept, block by block."""
    p = powersgd.plan(SHAPES_SMALL, 2)
    m = _vector(3)
    q_hat = powersgd.orthogonalize_all(powersgd.initial_q(p, 4).double(), p, "q")
    p_flat = powersgd.project(m, q_hat, p)
    p_hat = powersgd.orthogonalize_all(p_flat, p, "p")
    q = powersgd.back_project(m, p_hat, p)
    sent_whole = powersgd.whole(m, p)
    m_hat = powersgd.expand(p_hat, q, sent_whole, p, D)
    error = powersgd.residual(m, p_hat, q, p)
    assert p_flat.shape == (p.p_size,) and q.shape == (p.q_size,) and sent_whole.shape == (p.whole_size,)
    assert m_hat.dtype == error.dtype == torch.float64
    want_p, want_q, want_whole, want_m_hat = [], [], [], torch.zeros(D, dtype=torch.float64)
    pos = 0
    for b in p.blocks:
        piece = m[b.start : b.start + b.size]
        if not b.rank:
            want_whole.append(piece)
            want_m_hat[b.start : b.start + b.size] = piece
            continue
        mat = piece.view(b.rows, b.cols)
        qh = _orth_reference(q_hat[pos : pos + b.cols * b.rank].view(b.cols, b.rank))
        pos += b.cols * b.rank
        pp = mat @ qh
        ph = _orth_reference(pp)
        qq = mat.T @ ph
        want_p.append(pp.reshape(-1))
        want_q.append(qq.reshape(-1))
        low_rank = ph @ ph.T @ mat  # the projection of M onto P_hat's columns: rank r
        assert int(torch.linalg.matrix_rank(low_rank)) == b.rank
        want_m_hat[b.start : b.start + b.size] = low_rank.reshape(-1)
    torch.testing.assert_close(p_flat, torch.cat(want_p), rtol=0, atol=1e-6)
    torch.testing.assert_close(q, torch.cat(want_q), rtol=0, atol=1e-6)
    assert torch.equal(sent_whole, torch.cat(want_whole))
    torch.testing.assert_close(m_hat, want_m_hat, rtol=0, atol=1e-6)
    assert torch.equal(error, m - m_hat)  # error feedback: exactly what was not sent
    for b in p.blocks:
        part = error[b.start : b.start + b.size]
        assert (float(part.abs().max()) > 0.1) if b.rank else torch.equal(part, torch.zeros(b.size).double())


def test_the_exchanges_read_the_factors_of_their_own_side() -> None:
    """Factors as 1, 2, 3, ... in order: P = M Q and Q = M^T P with the exact products, no orthogonalization."""
    p = powersgd.plan(SHAPES_SMALL, 2)
    m = torch.arange(1.0, D + 1, dtype=torch.float64)
    q_flat = torch.arange(1.0, p.q_size + 1, dtype=torch.float64)
    p_flat = torch.arange(1.0, p.p_size + 1, dtype=torch.float64)
    mats = [m[b.start : b.start + b.size].view(b.rows, b.cols) for b in p.blocks if b.rank]
    qs = [f.view(-1, 2) for f in q_flat.split([20, 24, 18])]
    ps = [f.view(-1, 2) for f in p_flat.split([24, 32, 20])]
    assert torch.equal(powersgd.project(m, q_flat, p), torch.cat([(a @ q).reshape(-1) for a, q in zip(mats, qs)]))
    back = torch.cat([(a.T @ ph).reshape(-1) for a, ph in zip(mats, ps)])
    assert torch.equal(powersgd.back_project(m, p_flat, p), back)
    expanded = powersgd.expand(p_flat, q_flat, powersgd.whole(m, p), p, D)
    for b, ph, qq in zip([b for b in p.blocks if b.rank], ps, qs):
        assert torch.equal(expanded[b.start : b.start + b.size], (ph @ qq.T).reshape(-1))


def test_the_update_is_built_on_the_factors_device() -> None:
    """On the meta device (shapes only, no memory): a CUDA run's update stays on the GPU the same way."""
    p = powersgd.plan(SHAPES_SMALL, 2)
    meta = torch.device("meta")
    p_hat, q, sent = (torch.zeros(n, device=meta) for n in (p.p_size, p.q_size, p.whole_size))
    out = powersgd.expand(p_hat, q, sent, p, D)
    assert out.device == meta and out.shape == (D,)


def test_a_model_of_vectors_only_has_no_factors_and_one_of_matrices_only_nothing_whole() -> None:
    vectors = powersgd.plan([(4,), (6,)], 2)
    v = _vector(5, 10)
    assert vectors.q_size == vectors.p_size == 0
    for empty in (
        powersgd.project(v, v.new_zeros(0), vectors),
        powersgd.back_project(v, v.new_zeros(0), vectors),
        powersgd.orthogonalize_all(v.new_zeros(0), vectors, "q"),
    ):
        assert empty.shape == (0,) and empty.dtype == torch.float64
    assert torch.equal(powersgd.whole(v, vectors), v)
    assert torch.equal(powersgd.expand(v.new_zeros(0), v.new_zeros(0), v, vectors, 10), v)
    assert torch.equal(powersgd.residual(v, v.new_zeros(0), v.new_zeros(0), vectors), torch.zeros(10).double())
    matrices = powersgd.plan([(12, 10)], 2)
    w = _vector(6, 120)
    got = powersgd.whole(w, matrices)
    assert got.shape == (0,) and got.dtype == torch.float64
