"""The Count Sketch's estimates (fedsketch/sketch/estimates.py) against a float64 reference.

A coordinate's estimate is the median over rows of its signed buckets (Charikar, Chen and Farach-Colton,
ICALP 2002), the lower median for an even number of rows. tests/hash_reference.py reads the buckets and
signs from an independent integer implementation of the hash family; every estimate is plus or minus one
table entry, so the product must equal the reference exactly, in the table's dtype (estimate_at) or in
float32 / float64 (estimate_blocks, survivors), on the window path (CPU, chunks of at least 2048) and the
vectorized one, for 1 to 7 rows.
"""

from __future__ import annotations

import functools
import itertools

import numpy as np
import pytest
import torch

from fedsketch.sketch import estimates as E
from fedsketch.sketch.hashing import TabulationHash
from tests.hash_reference import reference

CPU, META = torch.device("cpu"), torch.device("meta")


def lower_median(values: np.ndarray) -> np.ndarray:
    return np.sort(values.astype(np.float64), axis=0)[(values.shape[0] - 1) // 2]


@pytest.mark.parametrize("n", range(1, 8))
def test_median_of_rows_is_the_lower_median_in_a_fresh_tensor(n: int) -> None:
    values = torch.randint(-4, 5, (n, 500), generator=torch.Generator().manual_seed(n)).float() / 4
    out = E.median_of_rows(values)
    assert out.dtype == torch.float32 and out.shape == (500,)
    assert np.array_equal(out.numpy(), lower_median(values.numpy()))
    out += 100.0  # the median is a new tensor, not a view of a row
    assert values.abs().max() <= 1.0
    arr = values.numpy().copy()
    out_np = E._median_np(arr)
    assert out_np.dtype == np.float32 and np.array_equal(out_np, lower_median(arr))
    out_np += 100.0
    assert np.abs(arr).max() <= 1.0


@pytest.mark.parametrize("n", range(1, 8))
@pytest.mark.parametrize("m", [1, 3, 5])
def test_the_median_is_over_rows_whatever_the_number_of_columns(n: int, m: int) -> None:
    """1, 3 or 5 coordinates (estimate of a few indices): the rows, not the columns, choose the method."""
    values = torch.randint(-4, 5, (n, m), generator=torch.Generator().manual_seed(10 * n + m)).float()
    assert np.array_equal(E.median_of_rows(values).numpy(), lower_median(values.numpy()))
    assert np.array_equal(E._median_np(values.numpy()), lower_median(values.numpy()))


@pytest.mark.parametrize("n", [600, 601])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_numpy_median_is_the_lower_median_for_hundreds_of_rows(n: int, dtype: type) -> None:
    """Shuffled 0..n-1 per column: numpy partitions this many rows without sorting them, so kth must be right."""
    values = np.random.default_rng(n).permuted(np.tile(np.arange(n, dtype=dtype)[:, None], (1, 2000)), axis=0)
    out = E._median_np(values)
    assert out.dtype == dtype and np.array_equal(out, np.full(2000, (n - 1) // 2, dtype))


@pytest.mark.parametrize("n", [3, 5])
def test_the_median_networks_are_right_on_every_ordering(n: int) -> None:
    """Every assignment of the values 0..n-1 to the n rows, ties included."""
    rows = np.array(list(itertools.product(range(n), repeat=n)), dtype=np.float64).T
    expected = lower_median(rows)
    assert np.array_equal(E._median_network(list(rows), np.minimum, np.maximum), expected)
    t = torch.from_numpy(rows)
    assert np.array_equal(E._median_network(t.unbind(0), torch.minimum, torch.maximum).numpy(), expected)


ESTIMATE_CASES = [
    (3, 4 * 2**15 + 123, 3, 140_000),  # windows, cols > 4 C
    (4, 3 * 2**15 + 5, 4, 40_000),  # windows, an even number of rows (np.partition)
    (5, 7 * 2048 + 1, 5, 2048),  # windows, the smallest window chunk
    (6, 9000, 6, 8192),
    (10, 5000, 1, 4096),
    (7, 20 * 2047 + 11, 3, 2047),  # vectorized blocks
    (8, 5000 * 8 + 7, 5, 8),  # blocks over more than one HASH_SPAN of chunks
    (9, 1000, 2, 300),  # torch.median, lower median of two
    (11, 3000, 7, 100),
    (12, 500, 1, 50),
]


@functools.cache
def case(seed: int, d: int, rows: int, cols: int) -> tuple[torch.Tensor, TabulationHash, np.ndarray]:
    """A table of distinct-looking normals, its hashes, and every coordinate's reference estimate (float64)."""
    table = torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed))
    table[:, :3] = 0.0  # zeros too
    return (
        table,
        TabulationHash.derive(seed, d, rows, cols, CPU),
        reference(seed, d, rows, cols).estimates(table.double().numpy()),
    )


DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


def in_dtype(table: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The table in ``dtype``; a float64 one gets entries float32 would round (plus k 2**-40, k in [1, 3])."""
    if dtype != torch.float64:
        return table.to(dtype)
    k = torch.randint(1, 4, table.shape, generator=torch.Generator().manual_seed(2)).double()
    return table.double() + k * 2.0**-40


@pytest.mark.parametrize("args", ESTIMATE_CASES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_estimate_blocks_cover_every_coordinate_in_order(args: tuple[int, int, int, int], dtype: torch.dtype) -> None:
    table32, hashes, _ = case(*args)
    table = in_dtype(table32, dtype)
    expected = reference(*args).estimates(table.double().numpy()) if dtype != torch.float32 else case(*args)[2]
    starts, blocks = [], []
    for start, block in E.estimate_blocks(table, hashes):
        assert block.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
        starts.append(start)
        blocks.append(block)
    assert starts[0] == 0 and all(s + b.numel() == t for s, b, t in zip(starts, blocks, starts[1:], strict=False))
    assert np.array_equal(torch.cat(blocks).double().numpy(), expected)


@pytest.mark.parametrize("args", ESTIMATE_CASES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_estimate_at_reads_the_median_in_the_tables_dtype(args: tuple[int, int, int, int], dtype: torch.dtype) -> None:
    table32, hashes, _ = case(*args)
    table = in_dtype(table32, dtype)
    d = args[1]
    indices = torch.randint(0, d, (25_000,), generator=torch.Generator().manual_seed(1))  # several pieces
    indices[:2] = torch.tensor([0, d - 1])
    out = E.estimate_at(table, hashes, indices)
    assert out.dtype == dtype and out.shape == (25_000,)
    expected = reference(*args).estimates(table.double().numpy(), indices.numpy())
    assert np.array_equal(out.double().numpy(), expected)


def test_estimates_stay_on_the_tables_device() -> None:
    hashes = TabulationHash.derive(0, 1000, 3, 100, META)
    table = torch.zeros(3, 100, device=META, dtype=torch.float16)
    out = E.estimate_at(table, hashes, torch.arange(1000, device=META))
    assert out.device == META and out.dtype == torch.float16 and out.shape == (1000,)
    blocks = list(E.estimate_blocks(table, hashes))
    assert all(b.device == META and b.dtype == torch.float32 for _, b in blocks)
    assert sum(b.numel() for _, b in blocks) == 1000


@pytest.mark.parametrize("args", ESTIMATE_CASES)
def test_survivors_are_the_estimates_strictly_above_the_bar(args: tuple[int, int, int, int]) -> None:
    table, hashes, expected = case(*args)
    bar = float(np.abs(expected[np.argsort(np.abs(expected))[len(expected) // 2]]))  # a bar some estimate equals
    found = list(E.survivors(table, hashes, [bar]))
    indices = torch.cat([i for i, _ in found])
    values = torch.cat([v for _, v in found])
    assert indices.dtype == torch.int64 and values.dtype == torch.float32
    keep = np.flatnonzero(np.abs(expected) > bar)
    assert np.array_equal(indices.numpy(), keep)
    assert np.array_equal(values.double().numpy(), expected[keep])


@pytest.mark.parametrize("args", [ESTIMATE_CASES[1], ESTIMATE_CASES[6]])
def test_survivors_read_the_bar_again_after_each_block(args: tuple[int, int, int, int]) -> None:
    table, hashes, expected = case(*args)
    bar = [0.5]
    it = E.survivors(table, hashes, bar)
    first_idx, _ = next(it)
    bar[0] = raised = float(np.quantile(np.abs(expected), 0.75))
    rest = list(it)
    indices = torch.cat([first_idx, *[i for i, _ in rest]]).numpy()
    boundary = hashes.chunk * (1 if hashes.use_windows(CPU) else hashes.block_chunks(CPU))
    coords = np.arange(len(expected))
    keep = np.flatnonzero(np.abs(expected) > np.where(coords < boundary, 0.5, raised))
    assert np.array_equal(indices, keep)
    assert int((keep < boundary).sum()) > 0 and int((keep >= boundary).sum()) > 0


def reference_threshold(expected: np.ndarray, d: int, k: int) -> float | None:
    m = min(d, 8192)
    rank = 2 * m * k // d
    if rank < 16 or rank >= m:
        return None
    sample = torch.randint(0, d, (m,), generator=torch.Generator().manual_seed(0)).numpy()
    return float(np.sort(np.abs(expected[sample]))[::-1][rank - 1])


@pytest.mark.parametrize(
    ("d", "ks"), [(16_384, [15, 16, 17, 8191, 8192]), (1000, [7, 8, 9, 499, 500]), (20_000, [19, 20, 9000])]
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_sample_threshold_is_the_ranked_magnitude_of_a_fixed_sample(d: int, ks: list[int], dtype: torch.dtype) -> None:
    args = (13, d, 3, 300)
    table32, hashes, _ = case(*args)
    table = in_dtype(table32, dtype)
    expected = reference(*args).estimates(table.double().numpy())
    for k in ks:
        got = E.sample_threshold(table, hashes, k)
        want = reference_threshold(expected, d, k)
        assert got == want, k
        assert want is None or type(got) is float
    assert E.sample_threshold(table, hashes, ks[1]) is not None  # each list reaches a value


def test_sample_threshold_of_a_float64_table_is_a_float64_entry() -> None:
    """Entries that float32 would round: the threshold is one of them, to the last bit."""
    args = (14, 16_384, 3, 300)
    table = torch.randn(3, 300, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    expected = reference(*args).estimates(table.numpy())
    hashes = TabulationHash.derive(*args, CPU)
    got = E.sample_threshold(table, hashes, 100)
    assert got is not None and got == reference_threshold(expected, 16_384, 100)
    assert got != float(np.float32(got))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_sample_threshold_of_a_cuda_table_is_the_cpu_tables() -> None:
    """The fixed sample is drawn on the CPU and moved to the table's device."""
    args = (13, 16_384, 3, 300)
    table, hashes, _ = case(*args)
    want = E.sample_threshold(table, hashes, 100)
    cuda = torch.device("cuda")
    got = E.sample_threshold(table.to(cuda), TabulationHash.derive(*args, cuda), 100)
    assert want is not None and got == want
