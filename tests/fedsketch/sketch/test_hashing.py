"""The Count Sketch's hash family (fedsketch/sketch/hashing.py) against an independent reference.

tests/hash_reference.py recomputes every parameter from the docstrings in Python integers: SplitMix64
states from ``(seed, d, rows, cols)``, the shared permutation and sign table of one chunk, the 4-wise
independent cubic polynomials mod ``2**31 - 1`` (Wegman and Carter 1981) that give each row's window
offset and chunk sign. Here the product's tables, buckets, signs and accumulated sketches must equal it
exactly, over many indices, the largest indices a ``d`` may have, edge seeds and every accumulate path
(vectorized blocks, direct windows, wide windows, float16/bfloat16/float64 tables).
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from fedsketch.sketch import hashing as H
from tests.hash_reference import Reference, mix, reference, states, stream

CPU, META = torch.device("cpu"), torch.device("meta")
SEEDS = [0, 1, 12345, 2**63 - 1, 2**63, 2**64 - 1]


@pytest.mark.parametrize("z", [0, 1, 2**31 - 1, 2**63, 2**64 - 1, 0x0123456789ABCDEF])
def test_mix64_is_splitmix64s_finalizer(z: int) -> None:
    assert H.mix64(z) == mix(z)


@pytest.mark.parametrize(("state", "start", "n"), [(0, 0, 5), (2**64 - 1, 3, 4), (0xDEADBEEF, 1000, 3)])
def test_splitmix_stream_gives_the_outputs_from_start(state: int, start: int, n: int) -> None:
    out = H.splitmix_stream(state, start, n)
    assert out.dtype == np.uint64 and out.shape == (n,)
    assert [int(v) for v in out] == stream(state, start, n)


@pytest.mark.parametrize("seed", SEEDS)
def test_hash_states_mix_every_argument(seed: int) -> None:
    assert H.hash_states(seed, 1000, 5, 300) == states(seed, 1000, 5, 300)
    assert len(H.hash_states(seed, 7, 3, 2)) == 4
    base = H.hash_states(seed, 1000, 5, 300)[:5]  # each argument changes every state
    for other in ([seed ^ 1, 1000, 5, 300], [seed, 1001, 5, 300], [seed, 1000, 4, 300], [seed, 1000, 5, 301]):
        assert not set(H.hash_states(*other)[:4]) & set(base)


def test_polynomial_hash_is_horner_mod_p_without_overflow() -> None:
    coeffs = torch.tensor([[[H.PRIME - 1]], [[H.PRIME - 2]], [[12345]], [[H.PRIME - 3]]], dtype=torch.int64)
    xs = [0, 1, 2, 65537, H.PRIME - 2, H.PRIME - 1]
    out = H.polynomial_hash(coeffs, torch.tensor(xs))
    assert out.dtype == torch.int64 and out.shape == (1, len(xs))
    c = [H.PRIME - 1, H.PRIME - 2, 12345, H.PRIME - 3]
    assert out[0].tolist() == [(c[0] * x**3 + c[1] * x**2 + c[2] * x + c[3]) % H.PRIME for x in xs]


@pytest.mark.parametrize(
    ("seed", "d", "rows", "cols"),
    [(0, 1000, 5, 300), (2**64 - 1, 70_000, 3, 40_000), (7, 5, 1, 1), (2**63, 100, 2, 2)],
)
def test_derived_tables_equal_the_reference(seed: int, d: int, rows: int, cols: int) -> None:
    ref = reference(seed, d, rows, cols)
    h = H.TabulationHash.derive(seed, d, rows, cols, CPU)
    assert (h.d, h.rows, h.cols, h.chunk, h.n_chunks) == (d, rows, cols, ref.chunk, -(-d // ref.chunk))
    assert h.pos.dtype == h.inv.dtype == h.coeffs.dtype == torch.int64
    assert h.lo_sign.dtype == h.inv_sign.dtype == torch.float32
    assert h.pos.tolist() == ref.pos and h.inv.tolist() == ref.inv
    assert h.lo_sign.tolist() == ref.lo_sign
    assert h.inv_sign.tolist() == [ref.lo_sign[lo] for lo in ref.inv]
    assert h.coeffs.shape == (8, rows, 1)
    assert h.coeffs[:, :, 0].T.tolist() == ref.coeffs


def test_derive_moves_every_table_to_the_device_asked_for() -> None:
    h = H.TabulationHash.derive(3, 500, 4, 64, META)
    for t in (h.coeffs, h.pos, h.inv, h.lo_sign, h.inv_sign):
        assert t.device == META
    assert H.TabulationHash.build(3, 500, 4, 64, META).pos.device == META


def test_build_derives_once_per_arguments_and_device() -> None:
    a = H.TabulationHash.build(11, 900, 3, 100, CPU)
    assert H.TabulationHash.build(11, 900, 3, 100, torch.device("cpu")) is a
    assert H.TabulationHash.build(12, 900, 3, 100, CPU) is not a
    assert H.TabulationHash.build(11, 900, 3, 100, META) is not a


def test_chunk_indices_must_stay_below_the_prime() -> None:
    cols = 64
    ok = H.TabulationHash.derive(0, (H.PRIME - 1) * cols, 2, cols, CPU)
    assert ok.n_chunks == H.PRIME - 1
    d = (H.PRIME - 1) * cols + 1
    message = (
        f"d={d} needs {H.PRIME} chunks of 64 coordinates; at most {H.PRIME - 1} are supported "
        "(chunk indices must stay below the prime 2**31 - 1): use more cols"
    )
    with pytest.raises(ValueError) as err:
        H.TabulationHash.derive(0, d, 2, cols, CPU)
    assert str(err.value) == message


def check_locate(ref: Reference, indices: list[int]) -> None:
    h = H.TabulationHash.derive(ref.seed, ref.d, ref.rows, ref.cols, CPU)
    buckets, signs = h.locate(torch.tensor(indices, dtype=torch.int64))
    assert buckets.dtype == torch.int64 and signs.dtype == torch.float32
    assert buckets.shape == signs.shape == (ref.rows, len(indices))
    for r in range(ref.rows):
        assert buckets[r].tolist() == [r * ref.cols + ref.bucket(r, i) for i in indices]
        assert signs[r].tolist() == [ref.sign(r, i) for i in indices]


@pytest.mark.parametrize("seed", SEEDS)
def test_locate_matches_the_reference_up_to_the_largest_index(seed: int) -> None:
    """d at the limit: chunk indices up to 2**31 - 2, where an unreduced polynomial would overflow int64."""
    cols = 64
    d = (H.PRIME - 1) * cols
    gen = np.random.default_rng(seed % 1000)
    indices = [0, 1, 63, 64, d - 1, d - 64, d - 65, *map(int, gen.integers(0, d, 60))]
    check_locate(reference(seed, d, 3, cols), indices)


@pytest.mark.parametrize(("d", "rows", "cols"), [(100_000, 5, 40_000), (3000, 4, 7), (50, 1, 50)])
def test_locate_matches_the_reference_on_every_index(d: int, rows: int, cols: int) -> None:
    ref = reference(2, d, rows, cols)
    h = H.TabulationHash.derive(2, d, rows, cols, CPU)
    buckets, signs = h.locate(torch.arange(d))
    rb, rs = ref.np_hash(np.arange(d))
    assert np.array_equal(buckets.numpy(), rb + np.arange(rows)[:, None] * cols)
    assert np.array_equal(signs.numpy(), rs)
    sample = [0, d - 1, *range(0, d, max(1, d // 40))]
    check_locate(ref, sample)  # the numpy reference agrees with the integer one


def test_chunk_hash_and_chunk_hashes_give_each_chunks_offsets_and_signs() -> None:
    d, rows, cols = 8 * 5000 + 7, 3, 8  # 5001 chunks: more than one HASH_SPAN
    ref = reference(4, d, rows, cols)
    h = H.TabulationHash.derive(4, d, rows, cols, CPU)
    offsets, signs = h.chunk_hash(torch.tensor([0, 1, 4096, 5000]))
    assert offsets.dtype == torch.int64 and signs.dtype == torch.float32
    assert offsets.tolist() == [[ref.offset(r, c) for c in (0, 1, 4096, 5000)] for r in range(rows)]
    assert signs.tolist() == [[ref.chunk_sign(r, c) for c in (0, 1, 4096, 5000)] for r in range(rows)]
    seen = list(H.chunk_hashes(h))
    assert [c for c, _, _ in seen] == list(range(5001))
    for c in (0, 1, 4095, 4096, 4097, 5000):
        assert seen[c][1] == [ref.offset(r, c) for r in range(rows)]
        assert seen[c][2] == [ref.chunk_sign(r, c) for r in range(rows)]
    hs, ho = h.block_hash(4090, 4100)
    assert hs.tolist() == [[ref.offset(r, c) for c in range(4090, 4100)] for r in range(rows)]
    assert ho.tolist() == [[ref.chunk_sign(r, c) for c in range(4090, 4100)] for r in range(rows)]


@pytest.mark.parametrize(("rows", "cols", "n_chunks"), [(3, 8, 5001), (5, 300, 40), (1, 2047, 3), (600, 64, 3)])
def test_blocks_cover_every_chunk_in_steps_of_block_chunks(rows: int, cols: int, n_chunks: int) -> None:
    h = H.TabulationHash.derive(5, cols * n_chunks, rows, cols, CPU)
    ref = reference(5, cols * n_chunks, rows, cols) if rows < 10 else None
    step = h.block_chunks(CPU)
    assert step == max(1, (32768 // rows) // cols)
    seen = list(h.blocks(CPU))
    assert [h0 for h0, _, _, _ in seen] == list(range(0, n_chunks, step))
    assert all(h1 == min(n_chunks, h0 + step) for h0, h1, _, _ in seen)
    for h0, h1, offsets, signs in seen:
        assert offsets.shape == signs.shape == (rows, h1 - h0)
        if ref is not None and (h0 == 0 or h1 == n_chunks or h0 <= 4096 < h1):
            assert offsets.tolist() == [[ref.offset(r, c) for c in range(h0, h1)] for r in range(rows)]
            assert signs.tolist() == [[ref.chunk_sign(r, c) for c in range(h0, h1)] for r in range(rows)]


def test_block_sizes_and_paths_per_device() -> None:
    big = H.TabulationHash.derive(0, 10, 3, 2**15, CPU)
    assert big.block_chunks(CPU) == 1 and big.block_chunks(META) == 2**21 // 2**15
    small = H.TabulationHash.derive(0, 10, 2, 100, CPU)
    assert small.block_chunks(CPU) == 16384 // 100 and small.block_chunks(META) == 2**21 // 100
    assert H.TabulationHash.derive(0, 10, 2, 2048, CPU).use_windows(CPU)
    assert not H.TabulationHash.derive(0, 10, 2, 2047, CPU).use_windows(CPU)
    assert not big.use_windows(META)


def test_pieces_split_for_serial_ops_on_a_cpu_and_in_blocks_elsewhere() -> None:
    assert list(H.pieces(25_000, 3, CPU)) == [slice(0, 10922), slice(10922, 21844), slice(21844, 32766)]
    assert list(H.pieces(3, 40_000, CPU)) == [slice(0, 1), slice(1, 2), slice(2, 3)]
    assert list(H.pieces(5_000_000, 5, META)) == [slice(i, i + 2**21) for i in (0, 2**21, 2**22)]
    assert list(H.pieces(0, 5, CPU)) == []


def test_chunk_of_pads_with_zeros_past_the_end() -> None:
    vec = torch.arange(1.0, 8.0)
    assert torch.equal(H.chunk_of(vec, 2, 3), torch.tensor([3.0, 4.0, 5.0]))
    assert torch.equal(H.chunk_of(vec, 5, 4), torch.tensor([6.0, 7.0, 0.0, 0.0]))
    assert torch.equal(H.chunk_of(vec, 8, 2), torch.zeros(2))


def test_work_dtype_keeps_float64_and_widens_the_rest_to_float32() -> None:
    assert H.work_dtype(torch.float64) == torch.float64
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        assert H.work_dtype(dtype) == torch.float32


@functools.cache
def reference_table(seed: int, d: int, rows: int, cols: int) -> tuple[torch.Tensor, np.ndarray]:
    """Integer entries in [-3, 3], about 8 nonzero per bucket, and their sketch in float64."""
    gen = torch.Generator().manual_seed(seed)
    vec = torch.randint(-3, 4, (d,), generator=gen) * (torch.rand(d, generator=gen) < 8 * cols / d)
    return vec, reference(seed, d, rows, cols).table(vec.double().numpy())


ACCUMULATE_CASES = [
    (3, 4 * 2**15 + 123, 3, 140_000),  # direct windows (cols > 4 C), some wrap around the row's end
    (4, 3 * 2**15 + 5, 5, 40_000),  # wide windows (4 C > cols), folded at the end
    (5, 7 * 2048 + 1, 4, 2048),  # the smallest window chunk, one window per row
    (6, 9000, 2, 8192),  # C = 8192 = cols / 1: wide; a float64 table
    (7, 20 * 2047 + 11, 3, 2047),  # vectorized blocks (chunk below WINDOW_MIN_CHUNK)
    (8, 5000 * 8 + 7, 5, 8),  # blocks over more than one HASH_SPAN of chunks
    (9, 1000, 1, 300),
]


@pytest.mark.parametrize(("seed", "d", "rows", "cols"), ACCUMULATE_CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_accumulate_dense_equals_the_reference_table(
    seed: int, d: int, rows: int, cols: int, dtype: torch.dtype
) -> None:
    """Small integer sums: every partial sum is exact even in bfloat16, whatever the order of the additions."""
    vec, expected = reference_table(seed, d, rows, cols)
    vec = vec.to(dtype)
    start = torch.full((rows, cols), 2.0, dtype=dtype)  # accumulate adds to what the table holds
    h = H.TabulationHash.derive(seed, d, rows, cols, CPU)
    H.accumulate_dense(start, vec, h)
    assert start.dtype == dtype
    assert np.array_equal(start.double().numpy(), expected + 2.0)


def test_the_direct_window_case_wraps() -> None:
    """The first case above really wraps windows past the end of a row."""
    seed, d, rows, cols = ACCUMULATE_CASES[0]
    ref = reference(seed, d, rows, cols)
    starts = [ref.offset(r, c) for r in range(rows) for c in range(-(-d // ref.chunk))]
    assert any(s > cols - ref.chunk for s in starts)


@pytest.mark.parametrize(("seed", "d", "rows", "cols"), ACCUMULATE_CASES)
def test_a_float64_table_is_accumulated_in_float64(seed: int, d: int, rows: int, cols: int) -> None:
    """Entries a + b 2**-40 (a, b in [-3, 3]): their sums are exact in float64 and would round in float32."""
    vec, _ = reference_table(seed, d, rows, cols)
    fine = vec.double() + torch.randint(-3, 4, (d,), generator=torch.Generator().manual_seed(1)).double() * 2.0**-40
    expected = reference(seed, d, rows, cols).table(fine.numpy())
    table = torch.zeros(rows, cols, dtype=torch.float64)
    H.accumulate_dense(table, fine, H.TabulationHash.derive(seed, d, rows, cols, CPU))
    assert np.array_equal(table.numpy(), expected)


def emulate_windows(ref: Reference, weights: list[float], mode: str) -> np.ndarray:
    """One row starting at -1, chunk c adding +weights[c] to each bucket of its window, in float32.

    ``direct``: each window added straight into the table, wrapping at the row's end (what a float32 table
    with ``cols >= 4 C`` gets). ``wide``: windows summed into a ``cols + C`` buffer that is folded onto the
    table at the end (``4 C > cols``). ``buffer``, windows summed in a buffer wrapped at ``cols`` and added once,
    is another order, only to show that a case tells the three apart.
    """
    C, cols = ref.chunk, ref.cols
    buffer = np.full(cols, -1.0, np.float32) if mode == "direct" else np.zeros(cols + C, np.float32)
    for c, w in enumerate(weights):
        idx = ref.offset(0, c) + np.arange(C)
        buffer[idx if mode == "wide" else idx % cols] += np.float32(w)
    if mode == "direct":
        return buffer
    table = np.float32(-1.0) + buffer[:cols]
    table[:C] += buffer[cols:]
    return table


@pytest.mark.parametrize(
    ("seed", "cols", "mode"),
    [(21, 4 * 2**15, "direct"), (20, 140_000, "direct"), (20, 40_000, "wide"), (23, 5000, "wide")],
)
def test_a_float32_table_gets_windows_directly_or_through_a_float32_buffer(seed: int, cols: int, mode: str) -> None:
    """Start -1; chunk 0 adds 1 and chunk 1 adds 2**-30 to each bucket they cover (vector = each coordinate's sign).

    Where both cover a bucket, direct adds give 2**-30 and a float32 buffer gives 0 (1 + 2**-30 rounds to 1);
    a float64 buffer would give 2**-30 again. A wide buffer is folded at the end: where chunk 0's window
    covers a bucket that chunk 1's reaches by wrapping, that gives 2**-30 too.
    """
    ref = reference(seed, 2 * min(2**15, cols), 1, cols)
    d, C = ref.d, ref.chunk
    _, signs = ref.every_hash
    weights = [1.0, 2.0**-30]
    vec = torch.from_numpy((signs[0] * np.repeat(weights, C)).astype(np.float32))
    table = torch.full((1, cols), -1.0)
    H.accumulate_dense(table, vec, H.TabulationHash.derive(seed, d, 1, cols, CPU))
    expected = emulate_windows(ref, weights, mode)
    for other in {"direct", "buffer", "wide"} - {mode}:  # the case tells the orders apart
        assert not np.array_equal(expected, emulate_windows(ref, weights, other)), other
    assert np.array_equal(table[0].numpy(), expected)
