"""The Count Sketch of a flat vector: linear, mergeable, evaluated chunk by chunk.

Rothchild et al., "FetchSGD: Communication-Efficient Federated Learning with
Sketching", ICML 2020; Ivkin et al., "Communication-efficient Distributed SGD
with Sketching", NeurIPS 2019; the sketch itself is Charikar, Chen and
Farach-Colton's (ICALP 2002). Clients upload ``S(g)``, a ``rows x cols`` table;
because ``S`` is linear the server merges tables by adding them, keeps momentum
and error in sketch space, and recovers the heavy coordinates with
:meth:`CountSketch.topk` (FetchSGD's unsketch) or
:meth:`CountSketch.heavy_hitters` (Sketched-SGD's HEAVYMIX test).

The hash functions are a pure function of ``(seed, d, rows, cols)``
(:mod:`fedsketch.sketch.hashing`): every party derives them from the seed in the
round's config, and none travel on the wire. They are evaluated chunk by chunk,
so memory is ``O(rows * (cols + 2**15))`` whatever d is. Why the family is
sound, and measured speed: docs/sketch.md.
"""

from __future__ import annotations

import math
from typing import Self

import torch

from fedsketch.sketch.checks import DTYPES, check_indices, check_table, check_vector, sketch_shape
from fedsketch.sketch.estimates import estimate_at, estimate_blocks, median_of_rows, sample_threshold, survivors
from fedsketch.sketch.hashing import TabulationHash, accumulate_dense, pieces


class CountSketch:
    """A Count Sketch of a vector of length ``d``: ``rows`` independent hash rows of ``cols`` buckets.

    Parameters
    ----------
    d
        Length of the sketched vectors (a model's flat parameter count).
    rows, cols
        Table shape. Each row estimates a coordinate with variance at most
        ``||x||^2 / cols``; the median over rows makes failures exponentially
        rare in ``rows`` (FetchSGD uses 5 rows).
    seed
        Selects the hash functions, together with ``d, rows, cols``; every
        party that builds a sketch from the same four numbers gets the same ones.
    device, dtype
        Where the table lives, and its precision. float16/bfloat16 tables halve
        the upload at a small cost in accuracy (see the tests).
    """

    def __init__(
        self,
        d: int,
        rows: int,
        cols: int,
        seed: int = 0,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        d, rows, cols, seed = sketch_shape(d, rows, cols, seed)
        if dtype not in DTYPES:
            raise TypeError(f"dtype must be one of {DTYPES}; got {dtype}")
        table = torch.zeros(rows, cols, dtype=dtype, device=device)
        self._seed = seed
        self._hashes = TabulationHash.build(seed, d, rows, cols, table.device)
        self._table = table

    @classmethod
    def from_table(cls, table: torch.Tensor, d: int, seed: int) -> CountSketch:
        """Rebuild a sketch from a received ``rows x cols`` table (copied, on its device and dtype)."""
        check_table(table)
        sketch = cls(d, table.shape[0], table.shape[1], seed, device=table.device, dtype=table.dtype)
        sketch._table.copy_(table)
        return sketch

    # ------------------------------------------------------------ properties
    @property
    def d(self) -> int:
        """Length of the sketched vectors."""
        return self._hashes.d

    @property
    def rows(self) -> int:
        """Number of hash rows."""
        return self._hashes.rows

    @property
    def cols(self) -> int:
        """Buckets per row."""
        return self._hashes.cols

    @property
    def seed(self) -> int:
        """The hash seed."""
        return self._seed

    @property
    def table(self) -> torch.Tensor:
        """The live ``rows x cols`` table (not a copy: writing to it changes the sketch)."""
        return self._table

    @property
    def device(self) -> torch.device:
        return self._table.device

    @property
    def dtype(self) -> torch.dtype:
        return self._table.dtype

    def __repr__(self) -> str:
        return (
            f"CountSketch(d={self.d}, rows={self.rows}, cols={self.cols}, seed={self.seed}, "
            f"device={self.device}, dtype={self.dtype})"
        )

    # ------------------------------------------------------------ building
    def accumulate(self, vec: torch.Tensor) -> CountSketch:
        """Add ``S(vec)`` to the table; ``vec`` is a flat float tensor of length d. Returns self."""
        vec = check_vector("vec", vec, self.d, self.device)
        accumulate_dense(self._table, vec.contiguous(), self._hashes)
        return self

    def accumulate_sparse(self, indices: torch.Tensor, values: torch.Tensor) -> CountSketch:
        """Add the sketch of the sparse vector ``{indices: values}`` (repeats add up). Returns self.

        FetchSGD's ``subtract`` error feedback removes exactly what was applied,
        ``S_e -= S(Delta)``, with Delta the top-k update: this sketches it in
        ``O(rows * k)`` rather than a pass over d.
        """
        indices = check_indices(indices, self.d, self.device)
        values = check_vector("values", values, indices.numel(), self.device)
        for part in pieces(indices.numel(), self.rows, self.device):
            buckets, signs = self._hashes.locate(indices[part])
            self._table.view(-1).index_add_(0, buckets.view(-1), (signs * values[part]).view(-1).to(self.dtype))
        return self

    def zero_buckets(self, indices: torch.Tensor) -> CountSketch:
        """Zero, in every row, the bucket each coordinate in ``indices`` hashes to. Returns self.

        The FetchSGD reference code's error feedback (it reports that
        subtracting diverged there); it also drops the mass of every other
        coordinate sharing those buckets.
        """
        indices = check_indices(indices, self.d, self.device)
        for part in pieces(indices.numel(), self.rows, self.device):
            self._table.view(-1).index_fill_(0, self._hashes.locate(indices[part])[0].view(-1), 0.0)
        return self

    def zero(self) -> CountSketch:
        """Reset the table to zeros, keeping the hash functions. Returns self."""
        self._table.zero_()
        return self

    def copy(self) -> CountSketch:
        """An independent sketch with a copy of the table (the hash functions are shared, read-only)."""
        return self._with_table(self._table.clone())

    clone = copy

    # ------------------------------------------------------------ algebra
    def __add__(self, other: object) -> CountSketch:
        if not isinstance(other, CountSketch):
            return NotImplemented
        self._check_mergeable(other)
        return self._with_table(self._table + other._table)

    def __radd__(self, other: object) -> CountSketch:
        """Lets ``sum(sketches)`` start from 0."""
        if isinstance(other, int) and not isinstance(other, bool) and other == 0:
            return self.copy()
        return NotImplemented

    def __iadd__(self, other: object) -> Self:
        if not isinstance(other, CountSketch):
            return NotImplemented
        self._check_mergeable(other)
        self._table += other._table
        return self

    def __mul__(self, scalar: object) -> CountSketch:
        if isinstance(scalar, bool) or not isinstance(scalar, int | float):
            return NotImplemented
        if not math.isfinite(scalar):
            raise ValueError(f"cannot scale a sketch by {scalar}")
        return self._with_table(self._table * scalar)

    __rmul__ = __mul__

    # ------------------------------------------------------------ queries
    def estimate(self, indices: torch.Tensor | None = None) -> torch.Tensor:
        """Median-over-rows estimates of ``x[indices]`` (of all d coordinates if None).

        Each estimate is plus or minus one table entry, in the table's dtype.
        """
        if indices is None:
            out = torch.empty(self.d, dtype=self.dtype, device=self.device)
            for start, block in estimate_blocks(self._table, self._hashes):
                out[start : start + block.numel()] = block
            return out
        return estimate_at(self._table, self._hashes, check_indices(indices, self.d, self.device))

    def topk(self, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``k`` coordinates with the largest ``|estimate|``: FetchSGD's unsketch.

        Exact: the result equals sorting all d estimates, found in one chunked
        pass that keeps only candidates above a running k-th largest magnitude.

        Returns
        -------
        indices, values
            int64 indices and their estimates, ordered by decreasing
            ``|estimate|``, ties broken toward the smaller index.
        """
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= self.d:
            raise ValueError(f"k must be an int in 1..d={self.d}; got {k!r}")
        threshold = sample_threshold(self._table, self._hashes, k)
        idx, val, _ = _keep_largest(*self._candidates(k, threshold), k, by_index=False)
        return idx, val.to(self.dtype)

    def _candidates(self, k: int, threshold: float | None) -> tuple[torch.Tensor, torch.Tensor]:
        """At least k candidates, in index order, that include the top k.

        Whenever 4k candidates pile up, only the k largest are kept and the
        threshold rises to the k-th magnitude: a later coordinate tying it
        loses to them (a larger index), so the top k is never lost. If fewer
        than k coordinates exceed the initial threshold, the pass is redone
        without one.
        """
        bar = [-1.0 if threshold is None else threshold]  # magnitudes are >= 0: -1 lets all through
        idx_parts, val_parts, count, trimmed = [], [], 0, False
        for idx, val in survivors(self._table, self._hashes, bar):
            idx_parts.append(idx)
            val_parts.append(val)
            count += idx.numel()
            if count >= 4 * k:
                idx, val, kth = _keep_largest(torch.cat(idx_parts), torch.cat(val_parts), k)
                idx_parts, val_parts, count, trimmed, bar[0] = [idx], [val], k, True, float(kth)
        if count < k and not trimmed:
            return self._candidates(k, None)
        return torch.cat(idx_parts), torch.cat(val_parts)

    def l2_estimate(self) -> float:
        """Median over rows of each row's L2 norm: an estimate of ``||x||_2`` (AMS-style)."""
        return float(median_of_rows(torch.linalg.vector_norm(self._table.double(), dim=1)[:, None]))

    def heavy_hitters(self, fraction: float) -> tuple[torch.Tensor, torch.Tensor]:
        """Coordinates whose ``estimate**2 > fraction * l2_estimate()**2``: Sketched-SGD's HEAVYMIX test.

        Tested as ``|estimate| > sqrt(fraction) * l2_estimate()``, in float64.

        Returns
        -------
        indices, values
            Ascending int64 indices and their estimates (possibly empty).
        """
        if isinstance(fraction, bool) or not isinstance(fraction, int | float) or not 0 < fraction <= 1:
            raise ValueError(f"fraction must be a number in (0, 1]; got {fraction!r}")
        found = list(survivors(self._table, self._hashes, [math.sqrt(fraction) * self.l2_estimate()]))
        return torch.cat([i for i, _ in found]), torch.cat([v for _, v in found]).to(self.dtype)

    # ------------------------------------------------------------ private
    def _with_table(self, table: torch.Tensor) -> CountSketch:
        out = object.__new__(CountSketch)
        out._seed, out._hashes, out._table = self._seed, self._hashes, table
        return out

    def _check_mergeable(self, other: CountSketch) -> None:
        differ = [
            f"{name} ({getattr(self, name)} vs {getattr(other, name)})"
            for name in ("d", "rows", "cols", "seed", "device")
            if getattr(self, name) != getattr(other, name)
        ]
        if differ:
            raise ValueError("cannot merge sketches with different " + ", ".join(differ))


def _keep_largest(
    idx: torch.Tensor, val: torch.Tensor, k: int, by_index: bool = True
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The ``k`` candidates of largest ``|val|`` (ties: smaller index), and the k-th magnitude.

    Candidates arrive in increasing index order, so a stable descending sort
    breaks ties toward the smaller index; ``by_index`` restores that order.
    """
    magnitude = val.abs()
    order = torch.sort(magnitude, descending=True, stable=True).indices[:k]
    kth = magnitude[order[-1]]
    if by_index:
        order = order.sort().values
    return idx.index_select(0, order), val.index_select(0, order), kth
