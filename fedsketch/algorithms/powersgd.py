"""PowerSGD's rank-r compression of a model's weight matrices: the math, on flat vectors.

Vogels, Karimireddy and Jaggi, "PowerSGD: Practical Low-Rank Gradient
Compression for Distributed Optimization", NeurIPS 2019, Algorithm 1, as
PyTorch's ``powerSGD_hook`` runs it: each weight tensor of ``n`` rows is viewed
as an ``n x m`` matrix ``M`` and, where that saves enough, sent as two thin
factors; vectors (biases, norm scales) and matrices too small to gain are sent
whole. One power iteration per round, warm-started from the last round's ``Q``::

    Q_hat = orthogonalize(Q)            (last round's Q; a seeded random one the first round)
    P     = M Q_hat                     (n x r: exchange 1)
    P_hat = orthogonalize(sum_i w_i P_i)
    Q     = M^T P_hat                   (m x r: exchange 2)
    M_hat = P_hat (sum_i w_i Q_i)^T     = P_hat P_hat^T sum_i w_i M_i

:class:`Plan` says which slices of the flat parameter vector are compressed;
everything here works on flat float32 vectors so the Flower side moves plain arrays.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

MIN_COMPRESSION_RATE = 2.0  # the hook's default: compress only where it at least halves the bytes
EPSILON = 1e-8  # keeps Gram-Schmidt finite on an all-zero column (vanishing gradients)


@dataclass(frozen=True)
class Block:
    """One weight tensor as a slice of the flat vector: its matrix shape and rank, or sent whole (rank 0)."""

    start: int
    rows: int
    cols: int
    rank: int

    @property
    def size(self) -> int:
        return self.rows * self.cols


@dataclass(frozen=True)
class Plan:
    """How a model's flat parameter vector is compressed: its blocks, in parameter order."""

    blocks: tuple[Block, ...]

    @property
    def p_size(self) -> int:
        """Floats in all P factors (exchange 1)."""
        return sum(b.rows * b.rank for b in self.blocks if b.rank)

    @property
    def q_size(self) -> int:
        """Floats in all Q factors (exchange 2, and the warm start sent with the model)."""
        return sum(b.cols * b.rank for b in self.blocks if b.rank)

    @property
    def whole_size(self) -> int:
        """Floats sent uncompressed (vectors, small matrices)."""
        return sum(b.size for b in self.blocks if not b.rank)


def plan(shapes: Sequence[tuple[int, ...]], rank: int) -> Plan:
    """The blocks of a model with these parameter shapes, at rank ``rank``.

    A tensor of two or more dimensions is viewed as ``shape[0] x rest``; it is
    compressed at rank ``min(n, m, rank)`` when ``(n + m) r * 2 < n m``, as the
    hook decides; anything else is sent whole.
    """
    blocks, start = [], 0
    for shape in shapes:
        size = math.prod(shape)
        rows, cols = (shape[0], size // shape[0]) if len(shape) >= 2 else (size, 1)
        r = min(rows, cols, rank) if len(shape) >= 2 else 0
        if r and (rows + cols) * r * MIN_COMPRESSION_RATE >= rows * cols:
            r = 0
        blocks.append(Block(start, rows, cols, r))
        start += size
    return Plan(tuple(blocks))


def orthogonalize(matrix: torch.Tensor, epsilon: float = EPSILON) -> torch.Tensor:
    """Orthonormal columns by Gram-Schmidt (a new tensor): the hook's ``_orthogonalize_gram_schmidt``."""
    out = matrix.clone()
    for i in range(out.shape[1]):
        col = out[:, i : i + 1]
        col /= torch.linalg.vector_norm(col, dim=0, keepdim=True) + epsilon
        if i + 1 < out.shape[1]:
            rest = out[:, i + 1 :]
            rest -= torch.sum(col * rest, dim=0, keepdim=True) * col
    return out


def _factors(flat: torch.Tensor, p: Plan, side: str) -> list[torch.Tensor]:
    """The P (``rows x r``) or Q (``cols x r``) factors stored one after another in ``flat``."""
    out, pos = [], 0
    for b in p.blocks:
        if b.rank:
            n = b.rows if side == "p" else b.cols
            out.append(flat[pos : pos + n * b.rank].view(n, b.rank))
            pos += n * b.rank
    return out


def _matrices(vec: torch.Tensor, p: Plan) -> list[torch.Tensor]:
    return [vec[b.start : b.start + b.size].view(b.rows, b.cols) for b in p.blocks if b.rank]


def orthogonalize_all(flat: torch.Tensor, p: Plan, side: str) -> torch.Tensor:
    """Every factor in ``flat`` orthogonalized, flat again."""
    parts = [orthogonalize(f) for f in _factors(flat, p, side)]
    return torch.cat([f.reshape(-1) for f in parts]) if parts else flat.new_zeros(0)


def initial_q(p: Plan, seed: int) -> torch.Tensor:
    """The first round's Q: standard normal from a private seed (every party derives the same)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(p.q_size, generator=gen)


def whole(vec: torch.Tensor, p: Plan) -> torch.Tensor:
    """The blocks sent whole (vectors, small matrices), one after another."""
    return _cat([vec[b.start : b.start + b.size] for b in p.blocks if not b.rank], vec)


def project(target: torch.Tensor, q_hat: torch.Tensor, p: Plan) -> torch.Tensor:
    """Exchange 1 on a client: ``P = M Q_hat`` for every block."""
    return _cat([m @ q for m, q in zip(_matrices(target, p), _factors(q_hat, p, "q"))], target)


def back_project(target: torch.Tensor, p_hat: torch.Tensor, p: Plan) -> torch.Tensor:
    """Exchange 2 on a client: ``Q = M^T P_hat`` for every block."""
    return _cat([m.T @ ph for m, ph in zip(_matrices(target, p), _factors(p_hat, p, "p"))], target)


def residual(target: torch.Tensor, p_hat: torch.Tensor, q: torch.Tensor, p: Plan) -> torch.Tensor:
    """What of ``target`` its own factors do not carry: ``M - P_hat Q^T`` per block, 0 on whole blocks."""
    return target - expand(p_hat, q, whole(target, p), p, target.numel())


def expand(p_hat: torch.Tensor, q: torch.Tensor, sent_whole: torch.Tensor, p: Plan, d: int) -> torch.Tensor:
    """The flat vector the factors stand for: ``P_hat Q^T`` per block, whole blocks as sent."""
    out = torch.zeros(d, dtype=q.dtype, device=q.device)
    factors = iter(zip(_factors(p_hat, p, "p"), _factors(q, p, "q")))
    pos = 0
    for b in p.blocks:
        if b.rank:
            ph, qq = next(factors)
            out[b.start : b.start + b.size] = (ph @ qq.T).reshape(-1)
        else:
            out[b.start : b.start + b.size] = sent_whole[pos : pos + b.size]
            pos += b.size
    return out


def _cat(parts: list[torch.Tensor], like: torch.Tensor) -> torch.Tensor:
    return torch.cat([x.reshape(-1) for x in parts]) if parts else like.new_zeros(0)
