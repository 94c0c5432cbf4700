"""An independent reference for the Count Sketch's hash family and estimates (fedsketch/sketch/hashing.py).

Written from the module's docstrings in Python integers (SplitMix64, the shared permutation and sign
table of one chunk, the per-row cubic polynomials mod ``2**31 - 1``) and in numpy int64 / float64 for
whole vectors; it shares no code with the product. Coordinate ``i = hi * C + lo`` goes, in row ``r``,
to bucket ``(T_r(hi) + pos(lo)) mod cols`` with sign ``u_r(hi) * t(lo)`` (Charikar, Chen and
Farach-Colton, ICALP 2002; Wegman and Carter 1981).
"""

from __future__ import annotations

import functools

import numpy as np

P = 2**31 - 1
M64 = 2**64 - 1
GOLDEN = 0x9E3779B97F4A7C15
TAG = int.from_bytes(b"fedshash", "big")


def mix(z: int) -> int:
    """SplitMix64's finalizer, in Python integers."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def stream(state: int, start: int, n: int) -> list[int]:
    """Outputs ``start .. start + n - 1`` of SplitMix64: output ``j`` is ``mix(state + (j + 1) * GOLDEN)``."""
    return [mix((state + GOLDEN * (j + 1)) & M64) for j in range(start, start + n)]


def states(seed: int, d: int, rows: int, cols: int) -> list[int]:
    """The shared state, then one per row."""
    z = mix(seed ^ TAG)
    z = mix(z ^ d)
    z = mix(z ^ rows)
    z = mix(z ^ cols)
    return [mix((z + GOLDEN * r) & M64) for r in range(rows + 1)]


def horner(coeffs: list[int], x: int) -> int:
    """``coeffs[0] x^3 + coeffs[1] x^2 + coeffs[2] x + coeffs[3]`` mod P (leading coefficient first)."""
    acc = 0
    for c in coeffs:
        acc = (acc * x + c) % P
    return acc


class Reference:
    """The hash functions of ``(seed, d, rows, cols)``, in Python integers and numpy int64."""

    def __init__(self, seed: int, d: int, rows: int, cols: int) -> None:
        self.seed, self.d, self.rows, self.cols = seed, d, rows, cols
        self.chunk = min(2**15, cols)
        shared_state, *row_states = states(seed, d, rows, cols)
        shared = stream(shared_state, 0, 2 * self.chunk)
        keys = shared[: self.chunk]
        self.inv = sorted(range(self.chunk), key=keys.__getitem__)
        self.pos = [0] * self.chunk
        for p, lo in enumerate(self.inv):
            self.pos[lo] = p
        self.lo_sign = [-1.0 if v >= 2**63 else 1.0 for v in shared[self.chunk :]]
        self.coeffs = [[v % P for v in stream(s, 0, 8)] for s in row_states]

    def offset(self, r: int, hi: int) -> int:
        return horner(self.coeffs[r][:4], hi) % self.cols

    def chunk_sign(self, r: int, hi: int) -> float:
        return -1.0 if horner(self.coeffs[r][4:], hi) % 2 else 1.0

    def bucket(self, r: int, i: int) -> int:
        hi, lo = divmod(i, self.chunk)
        return (self.offset(r, hi) + self.pos[lo]) % self.cols

    def sign(self, r: int, i: int) -> float:
        hi, lo = divmod(i, self.chunk)
        return self.chunk_sign(r, hi) * self.lo_sign[lo]

    # numpy, for whole vectors -------------------------------------------------

    def _poly(self, r: int, first: int, x: np.ndarray) -> np.ndarray:
        acc = np.zeros_like(x)
        for c in self.coeffs[r][first : first + 4]:
            acc = (acc * x + np.int64(c)) % np.int64(P)  # acc, x < 2**31: acc * x + c < 2**63
        return acc

    def np_hash(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Buckets (rows, n) int64 within each row, and signs (rows, n) float64."""
        hi, lo = np.divmod(indices.astype(np.int64), self.chunk)
        pos, lo_sign = np.array(self.pos, np.int64), np.array(self.lo_sign)
        buckets = np.stack([(self._poly(r, 0, hi) % self.cols + pos[lo]) % self.cols for r in range(self.rows)])
        odd = np.stack([self._poly(r, 4, hi) % 2 for r in range(self.rows)])
        return buckets, (1.0 - 2.0 * odd) * lo_sign[lo]

    @functools.cached_property
    def every_hash(self) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`np_hash` of every coordinate."""
        return self.np_hash(np.arange(self.d))

    def table(self, vec: np.ndarray) -> np.ndarray:
        """``S(vec)`` in float64."""
        buckets, signs = self.every_hash
        out = np.zeros((self.rows, self.cols))
        for r in range(self.rows):
            np.add.at(out[r], buckets[r], signs[r] * vec.astype(np.float64))
        return out

    def estimates(self, table: np.ndarray, indices: np.ndarray | None = None) -> np.ndarray:
        """The lower median over rows of the signed buckets, in float64."""
        buckets, signs = self.every_hash if indices is None else self.np_hash(indices)
        reads = np.stack([table[r].astype(np.float64)[buckets[r]] for r in range(self.rows)]) * signs
        return np.sort(reads, axis=0)[(self.rows - 1) // 2]


@functools.cache
def reference(seed: int, d: int, rows: int, cols: int) -> Reference:
    """One Reference per arguments in a test process (deriving the tables of a 2**15 chunk takes a while)."""
    return Reference(seed, d, rows, cols)
