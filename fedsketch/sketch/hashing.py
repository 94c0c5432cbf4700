"""The Count Sketch's hash functions, and the chunked loops that add vectors into a table.

Count Sketch (Charikar, Chen and Farach-Colton, ICALP 2002), as used by
FetchSGD (Rothchild et al., ICML 2020) and Sketched-SGD (Ivkin et al., NeurIPS
2019). The family is two-level tabulation: coordinate ``i = hi * C + lo`` goes,
in row ``r``, to bucket ``(T_r(hi) + pos(lo)) mod cols`` with sign
``u_r(hi) * t(lo)``, where ``pos`` and ``t`` are a shared permutation and sign
table of one chunk (``C = min(2**15, cols)``) and ``T_r``, ``u_r`` come from
4-wise independent cubic polynomials mod ``2**31 - 1`` (Wegman and Carter
1981). Every parameter is a pure function of ``(seed, d, rows, cols)``, drawn
with SplitMix64. Why this keeps Count Sketch's guarantees, and why this shape
is fast: docs/sketch.md. Estimates read back from a table: :mod:`fedsketch.sketch.estimates`.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch
from torch.nn import functional as F

PRIME = 2**31 - 1
# CPU loops work on arrays of at most 2**15 elements, in numpy (no threads) or
# in torch ops at its parallel grain size (run on the calling thread): a torch op
# large enough to wake a second thread can cost far more than its work on a
# shared machine (measured in docs/sketch.md, "Performance").
MAX_CHUNK = SERIAL_OP = 1 << 15
GPU_BLOCK = 1 << 21  # coordinates per vectorized step on other devices
MAX_COLS = 1 << 30  # far below PRIME, so the bias of g mod cols stays below cols / p
MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
MIX1, MIX2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
WINDOW_MIN_CHUNK = 2048  # below this, per-chunk Python overhead beats the saved scatter
HASH_SPAN = 4096  # chunks whose offsets and signs are evaluated at once


def mix64(z: int) -> int:
    """SplitMix64's finalizer on a Python int (unbounded: masking is the modulus)."""
    z = ((z ^ (z >> 30)) * MIX1) & MASK64
    z = ((z ^ (z >> 27)) * MIX2) & MASK64
    return z ^ (z >> 31)


def splitmix_stream(state: int, start: int, n: int) -> np.ndarray:
    """Outputs ``start .. start + n - 1`` of SplitMix64 from ``state``.

    numpy's uint64 array arithmetic is defined modulo 2**64, which is exactly
    SplitMix64's arithmetic; nothing here can overflow in the C sense.
    """
    z = np.uint64(state) + np.uint64(GOLDEN) * np.arange(start + 1, start + n + 1, dtype=np.uint64)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(MIX1)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(MIX2)
    return z ^ (z >> np.uint64(31))


def hash_states(seed: int, d: int, rows: int, cols: int) -> list[int]:
    """SplitMix64 states mixed from all four arguments: the shared tables', then one per row."""
    z = mix64(seed ^ 0x6665647368617368)  # domain tag: the bytes of "fedshash"
    for value in (d, rows, cols):
        z = mix64(z ^ value)
    return [mix64((z + GOLDEN * r) & MASK64) for r in range(rows + 1)]


def polynomial_hash(coeffs: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``(c3 x^3 + c2 x^2 + c1 x + c0) mod p`` by Horner's rule, one polynomial per row.

    For coefficients uniform in ``[0, p)`` the values at any 4 distinct
    ``x < p`` are independent and uniform (Wegman and Carter 1981): a 4-wise
    independent family. No overflow: every factor is below ``p < 2**31``, so
    ``acc * x + c < 2**62 + 2**31 < 2**63`` fits int64 exactly.
    """
    acc = coeffs[0]
    for coeff in coeffs[1:]:
        acc = (acc * x + coeff) % PRIME
    return acc


@dataclass(frozen=True, eq=False)
class TabulationHash:
    """The hash functions of one ``(seed, d, rows, cols)``, on one device."""

    d: int
    rows: int
    cols: int
    chunk: int
    coeffs: torch.Tensor  # (8, rows, 1) int64 < PRIME: two cubic polynomials (offsets, signs)
    pos: torch.Tensor  # (C,) int64: window position of each lo
    inv: torch.Tensor  # (C,) int64: the lo at each window position
    lo_sign: torch.Tensor  # (C,) float32: t(lo)
    inv_sign: torch.Tensor  # (C,) float32: t(inv(p)), in window order

    @classmethod
    def build(cls, seed: int, d: int, rows: int, cols: int, device: torch.device) -> TabulationHash:
        """The hash functions of ``(seed, d, rows, cols)`` on ``device``, derived once per process.

        They are immutable (every sketch op only reads them), so all the
        sketches of a run share one set: a simulation's clients each build a
        sketch, and would otherwise each derive them again (docs/changelog.md).
        """
        return _build(seed, d, rows, cols, torch.device(device))

    @classmethod
    def derive(cls, seed: int, d: int, rows: int, cols: int, device: torch.device) -> TabulationHash:
        """Derive all parameters on the CPU, then move them to ``device`` (uncached: :meth:`build` caches)."""
        chunk = min(MAX_CHUNK, cols)
        n_chunks = -(-d // chunk)
        if n_chunks >= PRIME:
            raise ValueError(
                f"d={d} needs {n_chunks} chunks of {chunk} coordinates; at most {PRIME - 1} "
                "are supported (chunk indices must stay below the prime 2**31 - 1): use more cols"
            )
        shared_state, *row_states = hash_states(seed, d, rows, cols)
        shared = splitmix_stream(shared_state, 0, 2 * chunk)
        # The keys are distinct (SplitMix64 is a bijection of distinct states),
        # so the sorting permutation is unique on every platform.
        inv = np.argsort(shared[:chunk], kind="stable")
        pos = np.empty_like(inv)
        pos[inv] = np.arange(chunk)
        lo_sign = 1.0 - 2.0 * (shared[chunk:] >> np.uint64(63)).astype(np.float32)
        coeffs = [[int(v) % PRIME for v in splitmix_stream(state, 0, 8)] for state in row_states]
        coeff_t = torch.tensor(coeffs, dtype=torch.int64).T.reshape(8, rows, 1)
        tensors = (torch.from_numpy(a).to(device) for a in (pos, inv, lo_sign, lo_sign[inv]))
        return cls(d, rows, cols, chunk, coeff_t.to(device), *tensors)

    @property
    def n_chunks(self) -> int:
        return -(-self.d // self.chunk)

    def chunk_hash(self, hi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Window offsets ``T`` (int64) and chunk signs ``u`` (float32), each (rows, len(hi))."""
        offsets = polynomial_hash(self.coeffs[:4], hi) % self.cols
        odd = polynomial_hash(self.coeffs[4:], hi) % 2
        return offsets, 1.0 - 2.0 * odd.float()

    def locate(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Flat buckets into a ``rows x cols`` table, and signs, each (rows, n)."""
        hi = torch.div(indices, self.chunk, rounding_mode="floor")
        lo = indices - hi * self.chunk
        offsets, chunk_signs = self.chunk_hash(hi)
        buckets = offsets + self.pos.index_select(0, lo)
        buckets = torch.where(buckets >= self.cols, buckets - self.cols, buckets)
        rows = torch.arange(self.rows, device=indices.device)[:, None]
        return buckets + rows * self.cols, chunk_signs * self.lo_sign.index_select(0, lo)

    def use_windows(self, device: torch.device) -> bool:
        """Per-chunk window loops (CPU, large chunks) or vectorized blocks."""
        return device.type == "cpu" and self.chunk >= WINDOW_MIN_CHUNK

    def block_chunks(self, device: torch.device) -> int:
        """Chunks per vectorized step: ops of at most SERIAL_OP elements on a CPU."""
        budget = SERIAL_OP // self.rows if device.type == "cpu" else GPU_BLOCK
        return max(1, budget // self.chunk)

    def block_hash(self, h0: int, h1: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.chunk_hash(torch.arange(h0, h1, device=self.pos.device))

    def blocks(self, device: torch.device) -> Iterator[tuple[int, int, torch.Tensor, torch.Tensor]]:
        """``(h0, h1, offsets, signs)`` for consecutive blocks of chunks, for the vectorized loops."""
        step = self.block_chunks(device)
        span = max(step, HASH_SPAN // step * step)
        for s0 in range(0, self.n_chunks, span):
            s1 = min(self.n_chunks, s0 + span)
            offsets, signs = self.block_hash(s0, s1)
            for h0 in range(s0, s1, step):
                h1 = min(s1, h0 + step)
                yield h0, h1, offsets[:, h0 - s0 : h1 - s0], signs[:, h0 - s0 : h1 - s0]

    def window_buckets(self, offsets: torch.Tensor) -> torch.Tensor:
        """Flat buckets (rows, n, C) of whole chunks with the given offsets (rows, n)."""
        buckets = offsets[:, :, None] + self.pos
        buckets = torch.where(buckets >= self.cols, buckets - self.cols, buckets)
        rows = torch.arange(self.rows, device=offsets.device)[:, None, None]
        return buckets + rows * self.cols


def pieces(n: int, rows: int, device: torch.device) -> Iterator[slice]:
    """Slices of ``n`` items small enough that ``(rows, piece)`` ops run serially on a CPU."""
    step = max(1, SERIAL_OP // rows) if device.type == "cpu" else GPU_BLOCK
    return (slice(i, i + step) for i in range(0, n, step))


def chunk_of(vec: torch.Tensor, start: int, length: int) -> torch.Tensor:
    """``vec[start:start + length]``, zero-padded past the end of ``vec``."""
    piece = vec[start : start + length]
    return piece if piece.numel() == length else F.pad(piece, (0, length - piece.numel()))


def work_dtype(dtype: torch.dtype) -> torch.dtype:
    """Arithmetic precision for a table: float64 stays, anything else is done in float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def accumulate_dense(table: torch.Tensor, vec: torch.Tensor, hashes: TabulationHash) -> None:
    """``table += S(vec)`` for a validated, contiguous vector on the table's device."""
    if hashes.use_windows(vec.device):
        _accumulate_windows(table, vec, hashes)
        return
    C = hashes.chunk
    for h0, h1, offsets, chunk_signs in hashes.blocks(vec.device):
        x = chunk_of(vec, h0 * C, (h1 - h0) * C).view(1, h1 - h0, C)
        values = x * (chunk_signs[:, :, None] * hashes.lo_sign)
        flat = hashes.window_buckets(offsets).view(-1)
        table.view(-1).index_add_(0, flat, values.view(-1).to(table.dtype))


def chunk_hashes(hashes: TabulationHash) -> Iterator[tuple[int, list[int], list[float]]]:
    """Per chunk, in order: its index and, per row, its window's start and sign (hashed HASH_SPAN chunks at a time)."""
    for h0 in range(0, hashes.n_chunks, HASH_SPAN):
        h1 = min(hashes.n_chunks, h0 + HASH_SPAN)
        offsets, signs = hashes.block_hash(h0, h1)
        yield from zip(range(h0, h1), offsets.T.tolist(), signs.T.tolist(), strict=True)


def _accumulate_windows(table: torch.Tensor, vec: torch.Tensor, hashes: TabulationHash) -> None:
    """Per chunk: one gather by the shared permutation ``inv``, then one contiguous add per row.

    Written with numpy, which never hands work to other threads (measured in
    docs/sketch.md). A float16/bfloat16 table
    is accumulated in float32 and rounded once; when windows wrap often (``C``
    near ``cols``) they go into a ``rows x (cols + C)`` buffer folded at the end.
    """
    C, cols, work = hashes.chunk, hashes.cols, work_dtype(table.dtype)
    wide = 4 * C > cols
    direct = table.dtype == work and not wide
    buffer_dtype = np.float64 if work == torch.float64 else np.float32
    target = table.numpy() if direct else np.zeros((hashes.rows, cols + C if wide else cols), buffer_dtype)
    inv, inv_sign = hashes.inv.numpy(), hashes.inv_sign.numpy().astype(target.dtype)
    window = np.empty(C, target.dtype)
    for chunk, starts, signs in chunk_hashes(hashes):
        np.multiply(chunk_of(vec, chunk * C, C).to(work).numpy()[inv], inv_sign, out=window)
        for r, (start, sign) in enumerate(zip(starts, signs, strict=True)):
            add = np.add if sign > 0 else np.subtract
            m = C if wide else min(C, cols - start)
            segment = target[r, start : start + m]
            add(segment, window if m == C else window[:m], out=segment)
            if m < C:  # the window wraps around the end of the row
                segment = target[r, : C - m]
                add(segment, window[m:], out=segment)
    if not direct:
        folded = torch.from_numpy(target)
        table += folded[:, :cols]
        if wide:
            table[:, :C] += folded[:, cols:]


@functools.lru_cache(maxsize=16)
def _build(seed: int, d: int, rows: int, cols: int, device: torch.device) -> TabulationHash:
    return TabulationHash.derive(seed, d, rows, cols, device)
