"""PowerSGD's math on exact float64 values: the plan, Gram-Schmidt, both exchanges and the error kept.

Vogels, Karimireddy and Jaggi, NeurIPS 2019, Algorithm 1, one power iteration:
``P = M Q_hat``, ``P_hat = orth(P)``, ``Q = M^T P_hat``, ``M_hat = P_hat Q^T``;
the client keeps ``M - M_hat``, what was not sent. Each block of a plan is
checked against a reference written here with ``torch.linalg`` in float64, on
a model whose whole tensors differ in size and whose matrices are not square,
so that a factor or a slice read from the wrong place shows.
"""

from __future__ import annotations

import math

import pytest
import torch

from fedsketch.algorithms import powersgd
from fedsketch.algorithms.powersgd import Block

# rank 2: a 3-vector, a 12 x 10 matrix (compressed), a 5-vector, a 16 x 2 x 3 x 2 conv (16 x 12, compressed),
# a 2 x 2 matrix (too small to gain: whole), a 7-vector, a 10 x 9 matrix (compressed)
SHAPES = [(3,), (12, 10), (5,), (16, 2, 3, 2), (2, 2), (7,), (10, 9)]
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
    p = powersgd.plan(SHAPES, 2)
    assert p.blocks == BLOCKS
    assert sum(b.size for b in p.blocks) == D == sum(math.prod(s) for s in SHAPES)
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
    p = powersgd.plan(SHAPES, 2)
    for side, rows in (("p", (12, 16, 10)), ("q", (10, 12, 9))):
        flat = _vector(2, sum(n * 2 for n in rows))
        out = powersgd.orthogonalize_all(flat, p, side)
        assert out.shape == flat.shape and out.dtype == torch.float64
        factors = flat.split([n * 2 for n in rows])
        want = torch.cat([_orth_reference(f.view(n, 2)).reshape(-1) for f, n in zip(factors, rows, strict=True)])
        torch.testing.assert_close(out, want, rtol=0, atol=1e-7)


def test_the_first_q_is_standard_normal_from_its_seed() -> None:
    p = powersgd.plan(SHAPES, 2)
    q = powersgd.initial_q(p, 11)
    assert torch.equal(q, torch.randn(p.q_size, generator=torch.Generator().manual_seed(11)))
    assert torch.equal(q, powersgd.initial_q(p, 11)) and not torch.equal(q, powersgd.initial_q(p, 12))


def test_one_power_iteration_against_torch_linalg_in_float64() -> None:
    """Both exchanges, the update the factors stand for, and the error kept, block by block."""
    p = powersgd.plan(SHAPES, 2)
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
    p = powersgd.plan(SHAPES, 2)
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
    p = powersgd.plan(SHAPES, 2)
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
