"""Count Sketch code paths that small, lossless examples never reach.

FetchSGD (Rothchild et al., ICML 2020) and Sketched-SGD (Ivkin et al.,
NeurIPS 2019) rely on three things checked here on purpose-built inputs:
the CPU's direct window path (``cols > 4 * 2**15``: windows added straight into
the table, wrapping at its end) agrees with the per-coordinate path; the rows'
sign hashes are independent (the median's error bound needs independent rows);
and ``topk``'s running threshold never drops a coordinate that belongs to the
top k, whichever block it arrives in.
"""

from __future__ import annotations

import pytest
import torch

from fedsketch import CountSketch

CHUNK = 2**15  # coordinates per chunk when cols >= 2**15 (see fedsketch/sketch/hashing.py)


def test_the_direct_window_path_agrees_with_the_per_coordinate_path() -> None:
    """cols = 140,000 > 4 * 2**15, ten chunks and a partial one: some windows wrap around the row's end."""
    d, rows, cols = 10 * CHUNK + 123, 3, 140_000
    gen = torch.Generator().manual_seed(0)
    values = torch.randint(-1000, 1000, (d,), generator=gen).float()  # integers: sums exact in any order
    dense = CountSketch(d, rows, cols, seed=1).accumulate(values)
    sparse = CountSketch(d, rows, cols, seed=1).accumulate_sparse(torch.arange(d), values)
    assert torch.equal(dense.table, sparse.table)
    wrapped = 0
    probe = CountSketch(d, rows, cols, seed=1)
    for start in range(0, d, CHUNK):
        chunk = torch.arange(start, min(d, start + CHUNK))
        table = probe.zero().accumulate_sparse(chunk, torch.ones(chunk.numel())).table
        wrapped += int(((table[:, 0] != 0) & (table[:, -1] != 0)).sum())
    assert wrapped >= 2  # the case the direct path must get right is really exercised


def test_rows_draw_independent_signs() -> None:
    """Per row, a coordinate's sign; over 500 chunks, any two rows agree about half the time."""
    d, rows, cols, n = 64 * 500, 5, 64, 500  # chunk = cols = 64: one probe per chunk
    sketch = CountSketch(d, rows, cols, seed=3)
    signs = torch.empty(rows, n)
    for j in range(n):
        sketch.zero().accumulate_sparse(torch.tensor([64 * j + j % 64]), torch.ones(1))
        signs[:, j] = sketch.table.sum(dim=1)  # one +-1 entry per row
    assert torch.all(signs.abs() == 1)
    correlation = signs @ signs.T / n
    off_diagonal = correlation[~torch.eye(rows, dtype=torch.bool)]
    assert off_diagonal.abs().max() < 0.2  # independent rows: sd 1 / sqrt(500) = 0.045


@pytest.mark.parametrize(
    ("cols", "d", "k"),
    [(300, 1_000 * 300, 200), (2_048, 100 * 2_048, 50)],  # vectorized blocks of 109 chunks; one window per chunk
)
def test_topk_keeps_heavy_coordinates_that_arrive_after_the_threshold_rose(cols: int, d: int, k: int) -> None:
    """One row: every |estimate| is 1 except one bucket's coordinates, 1.005, one in each chunk.

    k is small enough that no sampled threshold is used, so the first block's
    candidates are cut to the k largest and the threshold rises to 1.0; the
    k heavy coordinates are spread over many later blocks and must all pass it.
    """
    table = torch.ones(1, cols)
    table[0, cols // 3] = 1.005
    sketch = CountSketch.from_table(table, d, seed=2)
    estimates = sketch.estimate()
    order = torch.sort(estimates.abs(), descending=True, stable=True).indices[:k]
    assert torch.all(estimates[order].abs() == torch.tensor(1.005)) and int(order.max()) > 10 * cols
    indices, values = sketch.topk(k)
    assert torch.equal(indices, order) and torch.equal(values, estimates[order])
