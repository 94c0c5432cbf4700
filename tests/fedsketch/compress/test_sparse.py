"""Sparse encodings: exact round trips, and the smallest encoding chosen."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedsketch.compress import (
    decode_sparse,
    decode_sparse_pairs,
    encode_sparse,
    payload_nbytes,
    sparse_count,
)

INDICES, BITMAP, VARINT = 0, 1, 2


def random_sparse(d: int, k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    idx = rng.choice(d, size=k, replace=False)
    return idx, rng.standard_normal(k).astype(np.float32)


@st.composite
def sparse_vectors(draw: st.DrawFn) -> tuple[int, np.ndarray, np.ndarray]:
    d = draw(st.integers(1, 3000))
    k = draw(st.integers(0, d))
    idx, val = random_sparse(d, k, draw(st.integers(0, 2**32 - 1)))
    return d, idx, val


@settings(max_examples=150, deadline=None)
@given(sparse_vectors(), st.booleans())
def test_round_trip(case: tuple[int, np.ndarray, np.ndarray], varint: bool) -> None:
    d, idx, val = case
    payload = encode_sparse(idx, val, d, varint=varint)
    expected = torch.zeros(d)
    expected[torch.from_numpy(idx)] = torch.from_numpy(val)
    torch.testing.assert_close(decode_sparse(payload, d), expected, rtol=0, atol=0)
    out_idx, out_val = decode_sparse_pairs(payload, d)
    order = np.argsort(idx)
    np.testing.assert_array_equal(out_idx.numpy(), idx[order])
    np.testing.assert_array_equal(out_val.numpy(), val[order])
    assert sparse_count(payload) == idx.size


@pytest.mark.parametrize("d", [25, 100, 3200, 10001])
def test_bitmap_exactly_when_it_is_smaller(d: int) -> None:
    """4k index bytes against ceil(d/8) mask bytes: bitmap iff k > d/32 (ties: indices)."""
    for k in sorted({1, d // 32 - 1, d // 32, d // 32 + 1, d // 32 + 2, d // 2, d} - {0, -1}):
        idx, val = random_sparse(d, k, seed=k)
        payload = encode_sparse(idx, val, d)
        bitmap = 4 * k > (d + 7) // 8
        assert int(payload["enc"][0]) == (BITMAP if bitmap else INDICES), (d, k)
        if bitmap:
            assert payload["mask"].dtype == np.uint8
            assert payload["mask"].shape == ((d + 7) // 8,)
        else:
            assert payload["idx"].dtype == np.int32
            assert payload["idx"].shape == (k,)
        assert payload["val"].dtype == np.float32
        assert payload_nbytes(payload) == 1 + 4 * k + min(4 * k, (d + 7) // 8)


def test_exact_bytes_at_the_d_over_32_boundary() -> None:
    d = 3200  # d/32 = 100; 4k = 400 = ceil(d/8) at k = 100
    at = encode_sparse(*random_sparse(d, 100, 0), d)
    above = encode_sparse(*random_sparse(d, 101, 0), d)
    assert (int(at["enc"][0]), payload_nbytes(at)) == (INDICES, 1 + 400 + 400)
    assert (int(above["enc"][0]), payload_nbytes(above)) == (BITMAP, 1 + 400 + 404)


def test_varint_wins_on_spread_out_indices_and_is_opt_in() -> None:
    d, k = 1_000_000, 1000  # mean gap 1000 < 2**14: 2 bytes per index instead of 4
    idx, val = random_sparse(d, k, 1)
    default = encode_sparse(idx, val, d)
    small = encode_sparse(idx, val, d, varint=True)
    assert int(default["enc"][0]) == INDICES
    assert int(small["enc"][0]) == VARINT
    assert small["gaps"].dtype == np.uint8
    assert payload_nbytes(small) < payload_nbytes(default)
    assert small["gaps"].size <= 2 * k


def test_varint_handles_the_largest_gaps() -> None:
    d = 2**31 - 1
    idx = np.array([0, 127, 128, 2**14, 2**21, 2**28, d - 1])
    payload = encode_sparse(idx, np.ones(idx.size, np.float32), d, varint=True)
    out_idx, _ = decode_sparse_pairs(payload, d)
    np.testing.assert_array_equal(out_idx.numpy(), idx)


def test_encode_rejects_bad_pairs() -> None:
    with pytest.raises(ValueError, match="distinct"):
        encode_sparse(np.array([3, 3]), np.ones(2), 10)
    with pytest.raises(ValueError, match=r"in \[0, 10\)"):
        encode_sparse(np.array([10]), np.ones(1), 10)
    with pytest.raises(ValueError, match="equal length"):
        encode_sparse(np.array([1, 2]), np.ones(3), 10)
    with pytest.raises(ValueError, match=r"d must be in \[1"):
        encode_sparse(np.array([1]), np.ones(1), 0)


def test_decode_rejects_payloads_that_do_not_fit() -> None:
    payload = encode_sparse(np.array([1, 500]), np.ones(2), 1000)
    assert int(payload["enc"][0]) == INDICES
    with pytest.raises(ValueError, match=r"within \[0, 100\)"):
        decode_sparse(payload, 100)
    with pytest.raises(ValueError, match="unknown sparse encoding"):
        decode_sparse({**payload, "enc": np.array([7], np.uint8)}, 1000)
    bitmap = encode_sparse(np.arange(8), np.ones(8), 10)
    with pytest.raises(ValueError, match=r"expected uint8\[3\]"):
        decode_sparse(bitmap, 20)
    with pytest.raises(ValueError, match=r"'idx' is int32\[2\]; expected int32\[1\]"):
        decode_sparse({**payload, "val": np.ones(1, np.float32)}, 1000)
