"""The Count Sketch's estimates, read from a table chunk by chunk.

Count Sketch (Charikar, Chen and Farach-Colton, ICALP 2002), as used by
FetchSGD (Rothchild et al., ICML 2020) and Sketched-SGD (Ivkin et al., NeurIPS
2019): a coordinate's estimate is the median over rows of its signed buckets.
Here are that median (min/max networks for 3 and 5 rows), the estimates of
given coordinates or of all d block by block, the coordinates whose estimate
clears a bar (the candidates of top-k and of the heavy-hitter test), and the
bar top-k starts from, over the hash functions of :mod:`fedsketch.sketch.hashing`.
Why the windows make this fast: docs/sketch.md.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch

from fedsketch.sketch.hashing import TabulationHash, chunk_hashes, pieces, work_dtype


def median_of_rows(values: torch.Tensor) -> torch.Tensor:
    """Median over dim 0; the lower median for an even count, as ``torch.median``.

    Three and five rows use min/max selection networks (5 rows: 10 operations,
    after Devillard's ``opt_med5``), several times faster than ``torch.median``
    on a CPU; they return the same value.
    """
    n = values.shape[0]
    if n in (1, 3, 5):
        return _median_network(values.unbind(0), torch.minimum, torch.maximum)
    return values.median(dim=0).values


def _median_np(values: np.ndarray) -> np.ndarray:
    """:func:`median_of_rows` for a numpy array."""
    n = values.shape[0]
    if n in (1, 3, 5):
        return _median_network(list(values), np.minimum, np.maximum)
    return np.partition(values, (n - 1) // 2, axis=0)[(n - 1) // 2]


def _median_network(p: Sequence[Any], minimum: Callable[..., Any], maximum: Callable[..., Any]) -> Any:
    """Median of 1, 3 or 5 equal-shaped arrays by min/max operations only (fresh output)."""
    if len(p) == 1:
        return maximum(p[0], p[0])
    if len(p) == 3:
        return maximum(minimum(p[0], p[1]), minimum(maximum(p[0], p[1]), p[2]))
    second_low = maximum(minimum(p[0], p[1]), minimum(p[3], p[4]))  # 2nd smallest of p0, p1, p3, p4
    second_high = minimum(maximum(p[0], p[1]), maximum(p[3], p[4]))  # 2nd largest of them
    return maximum(minimum(second_high, p[2]), minimum(maximum(second_high, p[2]), second_low))


def estimate_at(table: torch.Tensor, hashes: TabulationHash, indices: torch.Tensor) -> torch.Tensor:
    """Estimates of ``x[indices]`` (validated int64 indices on the table's device), in the table's dtype."""
    out = torch.empty(indices.numel(), dtype=table.dtype, device=table.device)
    for part in pieces(indices.numel(), hashes.rows, table.device):
        buckets, signs = hashes.locate(indices[part])
        values = table.view(-1).index_select(0, buckets.view(-1)).view(buckets.shape)
        out[part] = median_of_rows(values.to(work_dtype(table.dtype)) * signs)
    return out


def sample_threshold(table: torch.Tensor, hashes: TabulationHash, k: int) -> float | None:
    """A magnitude that about ``2k`` estimates should exceed, from a fixed sample of coordinates.

    Only a speed-up for top-k: its candidate pass starts over when fewer than k pass it.
    """
    m = min(hashes.d, 1 << 13)
    rank = 2 * m * k // hashes.d
    if rank < 16 or rank >= m:  # too few sampled points above it to trust it, or no filter
        return None
    sample = torch.randint(0, hashes.d, (m,), generator=torch.Generator().manual_seed(0), device="cpu").to(table.device)
    return float(torch.topk(estimate_at(table, hashes, sample).to(work_dtype(table.dtype)).abs(), rank).values[-1])


def estimate_blocks(table: torch.Tensor, hashes: TabulationHash) -> Iterator[tuple[int, torch.Tensor]]:
    """``(start, estimates)`` for consecutive blocks covering all d coordinates, in coordinate order.

    Estimates are float32 (float64 for a float64 table): each is plus or minus
    one table entry, so casting them back to the table's dtype is exact.
    """
    if hashes.use_windows(table.device):
        pos = hashes.pos.numpy()
        for start, medians in _window_medians(table, hashes):
            yield start, torch.from_numpy(medians[pos][: hashes.d - start])
        return
    work = table.to(work_dtype(table.dtype))
    for h0, _, offsets, chunk_signs in hashes.blocks(table.device):
        values = work.view(-1).index_select(0, hashes.window_buckets(offsets).view(-1)).view(hashes.rows, -1)
        values.mul_((chunk_signs[:, :, None] * hashes.lo_sign).view(hashes.rows, -1))
        yield h0 * hashes.chunk, median_of_rows(values)[: hashes.d - h0 * hashes.chunk]


def survivors(
    table: torch.Tensor, hashes: TabulationHash, bar: list[float]
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """``(indices, estimates)`` with ``|estimate| > bar[0]``, block by block in index order.

    The caller may raise ``bar[0]`` between blocks (the running top-k threshold).
    """
    if not hashes.use_windows(table.device):
        for start, block in estimate_blocks(table, hashes):
            keep = torch.nonzero(block.abs() > bar[0]).view(-1)
            yield keep + start, block.index_select(0, keep)
        return
    pos = hashes.pos.numpy()
    for start, medians in _window_medians(table, hashes):
        lo = np.flatnonzero((np.abs(medians) > bar[0])[pos][: hashes.d - start])
        yield torch.from_numpy(lo + start), torch.from_numpy(medians[pos[lo]])


def _window_medians(table: torch.Tensor, hashes: TabulationHash) -> Iterator[tuple[int, np.ndarray]]:
    """Per chunk: signed contiguous windows and their median, in window order (numpy, CPU).

    The permutation is shared by all rows, so window position ``p`` holds the
    same coordinate ``inv(p)`` in every row: the median is taken before
    un-permuting, and callers gather only what they need.
    """
    C, work = hashes.chunk, table.to(work_dtype(table.dtype)).numpy()
    ext = np.concatenate([work, work[:, :C]], axis=1)  # wrapped windows become plain slices
    plus = hashes.inv_sign.numpy().astype(work.dtype)
    signed, values = {1.0: plus, -1.0: -plus}, np.empty((hashes.rows, C), work.dtype)
    for chunk, starts, signs in chunk_hashes(hashes):
        for r, (start, sign) in enumerate(zip(starts, signs, strict=True)):
            np.multiply(ext[r, start : start + C], signed[sign], out=values[r])
        yield chunk * C, _median_np(values)
