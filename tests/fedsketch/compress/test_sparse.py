"""Sparse encodings: exact round trips and the smallest encoding chosen, then byte for byte.

The byte-for-byte tests pin :mod:`fedsketch.compress.sparse` (docs/mutation.md, "compress_wire"):
the varint (LEB128) bytes of gaps at every length boundary against a Python reference, the encoding
picked at the ``d / 32`` boundary and by :func:`~fedsketch.compress.sparse.pick_encoding`, the dtypes
on both sides, the support payloads, and each malformed payload refused with its whole message.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedsketch.compress import decode_sparse, decode_sparse_pairs, encode_sparse, payload_nbytes, sparse, sparse_count
from fedsketch.compress.sparse import decode_support, encode_support, pick_encoding

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


# byte for byte: LEB128 against a Python reference, exact messages, the chosen encoding ----------------------


def leb128(numbers: list[int]) -> list[int]:
    """Unsigned LEB128, one number after another: 7 bits a byte, low first, 0x80 on all but the last."""
    out: list[int] = []
    for n in numbers:
        while True:
            low, n = n & 0x7F, n >> 7
            out.append(low | (0x80 if n else 0))
            if not n:
                break
    return out


BOUNDARY_GAPS = [0, 1, 127, 128, 255, 2**14 - 1, 2**14, 2**21 - 1, 2**21, 2**28 - 1, 2**28, 2**31 - 2]


def test_varint_bytes_match_leb128_at_every_length_boundary() -> None:
    gaps = np.array(BOUNDARY_GAPS, dtype=np.int64)
    out = sparse._varint_encode(gaps)
    assert out.dtype == np.uint8
    assert out.tolist() == leb128(BOUNDARY_GAPS)
    assert [len(leb128([g])) for g in BOUNDARY_GAPS] == [1, 1, 1, 2, 2, 2, 3, 3, 4, 4, 5, 5]
    decoded = sparse._varint_decode(np.array(leb128(BOUNDARY_GAPS), dtype=np.uint8), len(BOUNDARY_GAPS))
    assert decoded.dtype == np.int64
    assert decoded.tolist() == BOUNDARY_GAPS


def test_a_varint_payload_sends_the_gaps_after_each_index() -> None:
    d = 2**31 - 1
    idx = np.array([5, 6, 134, 2**14 + 135, 2**28 + 2**14 + 136, d - 1])
    gaps = [5, 0, 127, 2**14, 2**28, d - 1 - (2**28 + 2**14 + 136) - 1]
    payload = encode_sparse(idx[::-1].copy(), np.arange(6, dtype=np.float32), d, varint=True)
    assert sorted(payload) == ["enc", "gaps", "val"]
    assert payload["enc"].dtype == np.uint8 and payload["enc"].tolist() == [VARINT]
    assert payload["gaps"].tolist() == leb128(gaps)
    assert payload["val"].tolist() == [5.0, 4.0, 3.0, 2.0, 1.0, 0.0]  # in increasing index order
    out_idx, out_val = decode_sparse_pairs(payload, d)
    assert out_idx.dtype == torch.int64 and out_idx.tolist() == idx.tolist()
    assert out_val.dtype == torch.float32 and out_val.tolist() == [5.0, 4.0, 3.0, 2.0, 1.0, 0.0]


def test_varint_bytes_that_do_not_hold_the_count_are_refused() -> None:
    with pytest.raises(ValueError, match=r"^varint gaps hold 1 complete numbers; expected 2$"):
        sparse._varint_decode(np.array([0x81, 0x01], np.uint8), 2)
    with pytest.raises(ValueError, match=r"^varint gaps hold 1 complete numbers; expected 1$"):
        sparse._varint_decode(np.array([0x05, 0x81], np.uint8), 1)  # the last number is cut off
    with pytest.raises(ValueError, match=r"^varint gaps hold 2 complete numbers; expected 2$"):
        sparse._varint_decode(np.array([0x05, 0x06, 0x81], np.uint8), 2)  # the same, after two
    with pytest.raises(ValueError, match=r"^a varint gap is longer than 5 bytes$"):
        sparse._varint_decode(np.array([0x80] * 5 + [0x01], np.uint8), 1)
    assert sparse._varint_decode(np.array([0xFF] * 4 + [0x07], np.uint8), 1).tolist() == [2**31 - 1]
    assert sparse._varint_decode(np.zeros(0, np.uint8), 0).tolist() == []
    payload = encode_sparse(np.array([0, 300]), np.ones(2, np.float32), 1000, varint=True)
    with pytest.raises(ValueError, match=r"^varint gaps hold 2 complete numbers; expected 3$"):
        decode_sparse({**payload, "val": np.ones(3, np.float32)}, 1000)


def test_the_cheapest_encoding_wins_and_varint_only_when_asked() -> None:
    spread = np.arange(0, 1000, 100)  # 10 of 1000: 40 index bytes, 125 mask bytes, 10 gap bytes
    vals = np.ones(10, np.float32)
    default = encode_sparse(spread, vals, 1000)
    assert sorted(default) == ["enc", "idx", "val"]
    assert default["idx"].dtype == np.int32 and default["idx"].tolist() == spread.tolist()
    assert sorted(encode_sparse(spread, vals, 1000, varint=True)) == ["enc", "gaps", "val"]
    dense = np.arange(0, 1000, 2)  # 500 of 1000: the 125-byte mask
    mask = encode_sparse(dense, np.ones(500, np.float32), 1000, varint=True)
    assert mask["enc"].tolist() == [BITMAP]
    assert mask["mask"].dtype == np.uint8 and mask["mask"].tolist() == [0x55] * 125
    assert decode_sparse(mask, 1000).tolist() == [1.0, 0.0] * 500


@pytest.mark.parametrize("d", [8, 9, 100, 3200, 3201, 10001])
def test_pick_encoding_is_the_encoders_choice(d: int) -> None:
    for count in sorted({0, 1, d // 32 - 1, d // 32, d // 32 + 1, d // 32 + 2, d} - {-1}):
        count = min(count, d)
        payload = encode_sparse(np.arange(count), np.ones(count, np.float32), d)
        assert pick_encoding(count, d) == int(payload["enc"][0]), (d, count)
        assert pick_encoding(count, d) == (BITMAP if 4 * count > (d + 7) // 8 else INDICES)
    assert pick_encoding(100, 3200) == INDICES  # 400 bytes either way: the lower enc
    assert pick_encoding(101, 3200) == BITMAP
    with pytest.raises(ValueError, match=r"^d must be in \[1, 2147483647\]; got 0$"):
        pick_encoding(1, 0)


def test_decoding_gives_int64_indices_and_float32_values_whatever_the_default_dtype() -> None:
    payload = encode_sparse(torch.tensor([4, 1]), torch.tensor([2.5, -1.0], dtype=torch.float64), 6)
    assert payload["val"].dtype == np.float32 and payload["val"].tolist() == [-1.0, 2.5]
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        out = decode_sparse(payload, 6)
    finally:
        torch.set_default_dtype(before)
    assert out.dtype == torch.float32
    assert out.tolist() == [0.0, -1.0, 0.0, 0.0, 2.5, 0.0]
    assert sparse_count(payload) == 2
    empty = encode_sparse(np.array([]), np.array([]), 6)  # float64 empty indices are taken
    assert empty["idx"].dtype == np.int32 and empty["idx"].size == 0
    assert decode_sparse(empty, 6).tolist() == [0.0] * 6


def test_decoded_values_do_not_share_the_payloads_buffer() -> None:
    payload = encode_sparse(np.array([1, 3]), np.array([1.0, 2.0], np.float32), 5)
    _, val = decode_sparse_pairs(payload, 5)
    payload["val"][0] = 99.0
    assert val.tolist() == [1.0, 2.0]


def test_bad_pairs_are_refused_with_the_whole_message() -> None:
    one = np.ones(2, np.float32)
    with pytest.raises(ValueError, match=r"^indices and values must be 1-D of equal length; got \(1, 2\) and \(2,\)$"):
        encode_sparse(np.array([[1, 2]]), one, 10)
    with pytest.raises(ValueError, match=r"^indices and values must be 1-D of equal length; got \(2,\) and \(1, 2\)$"):
        encode_sparse(np.array([1, 2]), one.reshape(1, 2), 10)
    with pytest.raises(ValueError, match=r"^indices and values must be 1-D of equal length; got \(2,\) and \(3,\)$"):
        encode_sparse(np.array([1, 2]), np.ones(3), 10)
    with pytest.raises(ValueError, match=r"^indices must be integers; got float64$"):
        encode_sparse(np.array([1.0, 2.0]), one, 10)
    with pytest.raises(ValueError, match=r"^indices must be in \[0, 10\); got \[-1, 2\]$"):
        encode_sparse(np.array([2, -1]), one, 10)
    with pytest.raises(ValueError, match=r"^indices must be in \[0, 10\); got \[2, 10\]$"):
        encode_sparse(np.array([10, 2]), one, 10)
    with pytest.raises(ValueError, match=r"^indices must be in \[0, 10\); got \[2, 10\]$"):
        encode_sparse(np.array([10, 2, 3]), np.ones(3, np.float32), 10)  # the last of three, not the second
    with pytest.raises(ValueError, match=r"^indices must be distinct$"):
        encode_sparse(np.array([3, 3]), one, 10)
    graded = torch.tensor([1.5, -2.0], requires_grad=True)  # values that need detaching
    assert decode_sparse(encode_sparse(torch.tensor([4, 1]), graded, 100), 100)[[1, 4]].tolist() == [-2.0, 1.5]
    edges = encode_sparse(np.array([9, 0]), one, 10)
    assert decode_sparse_pairs(edges, 10)[0].tolist() == [0, 9]


def test_bad_sparse_payloads_are_refused_with_the_whole_message() -> None:
    good = encode_sparse(np.array([1, 500]), np.ones(2, np.float32), 1000)
    with pytest.raises(
        ValueError, match=r"^unknown sparse encoding 3; known: \{0: 'indices', 1: 'bitmap', 2: 'varint'\}$"
    ):
        decode_sparse({**good, "enc": np.array([3], np.uint8)}, 1000)
    with pytest.raises(ValueError, match=r"^sparse payload has no 'enc' array; keys: \['idx', 'val'\]$"):
        decode_sparse({"idx": good["idx"], "val": good["val"]}, 1000)
    with pytest.raises(ValueError, match=r"^sparse payload 'val' must be float32\[k\]; got float64\[2\]$"):
        decode_sparse({**good, "val": np.ones(2)}, 1000)
    with pytest.raises(ValueError, match=r"^sparse payload 'val' must be float32\[k\]; got float32\[1, 2\]$"):
        decode_sparse({**good, "val": np.ones((1, 2), np.float32)}, 1000)
    with pytest.raises(ValueError, match=r"^sparse payload 'idx' is int64\[2\]; expected int32\[2\]"):
        decode_sparse({**good, "idx": np.array([1, 500])}, 1000)
    three = {**good, "val": np.ones(3, np.float32)}
    with pytest.raises(ValueError, match=r"^sparse payload positions are not distinct, sorted and within \[0, 1000\)$"):
        decode_sparse({**three, "idx": np.array([1, 2, 1000], np.int32)}, 1000)  # the last of three
    for idx in ([-1, 500], [1, 1000], [500, 1], [1, 1]):
        with pytest.raises(
            ValueError, match=r"^sparse payload positions are not distinct, sorted and within \[0, 1000\)$"
        ):
            decode_sparse({**good, "idx": np.array(idx, np.int32)}, 1000)
    assert decode_sparse({**good, "idx": np.array([0, 999], np.int32)}, 1000)[[0, 999]].tolist() == [1.0, 1.0]
    with pytest.raises(ValueError, match=r"^d must be in \[1, 2147483647\]; got 0$"):
        decode_sparse(good, 0)


def test_bad_bitmap_and_varint_payloads_are_refused_with_the_whole_message() -> None:
    bitmap = encode_sparse(np.arange(8), np.ones(8, np.float32), 10)
    assert bitmap["enc"].tolist() == [BITMAP]
    with pytest.raises(ValueError, match=r"^sparse payload has 8 positions but 7 values$"):
        decode_sparse({**bitmap, "val": np.ones(7, np.float32)}, 10)
    with pytest.raises(ValueError, match=r"^sparse payload 'mask' is uint8\[2\]; expected uint8\[3\]"):
        decode_sparse(bitmap, 20)
    varint = encode_sparse(np.array([2, 7]), np.ones(2, np.float32), 10, varint=True)
    varint = {"enc": np.array([VARINT], np.uint8), "gaps": np.array([2, 4], np.uint8), "val": varint["val"]}
    assert decode_sparse(varint, 10).tolist() == [0, 0, 1, 0, 0, 0, 0, 1, 0, 0]
    with pytest.raises(ValueError, match=r"^sparse payload 'gaps' must be uint8\[n\]; got int64\[2\]$"):
        decode_sparse({**varint, "gaps": np.array([2, 4])}, 10)
    with pytest.raises(ValueError, match=r"^sparse payload 'gaps' must be uint8\[n\]; got uint8\[1, 2\]$"):
        decode_sparse({**varint, "gaps": np.array([[2, 4]], np.uint8)}, 10)
    with pytest.raises(ValueError, match=r"^sparse payload positions are not distinct, sorted and within \[0, 7\)$"):
        decode_sparse(varint, 7)


@pytest.mark.parametrize("varint", [False, True])
@pytest.mark.parametrize("positions", [[], [0], [3, 9, 2], list(range(0, 40, 2)), list(range(40))])
def test_support_round_trips_positions_only(positions: list[int], varint: bool) -> None:
    d = 40
    payload = encode_support(np.array(positions, dtype=np.int64), d, varint=varint)
    assert "val" not in payload
    full = encode_sparse(np.array(positions, dtype=np.int64), np.zeros(len(positions), np.float32), d, varint=varint)
    assert sorted(payload) == sorted(k for k in full if k != "val")
    for key in payload:
        assert np.array_equal(payload[key], full[key]) and payload[key].dtype == full[key].dtype
    out = decode_support(payload, d)
    assert out.dtype == torch.int64
    assert out.tolist() == sorted(positions)


def test_varint_support_is_chosen_only_when_asked() -> None:
    positions = torch.tensor([0, 500, 999])
    assert sorted(encode_support(positions, 1000)) == ["enc", "idx"]
    small = encode_support(positions, 1000, varint=True)
    assert sorted(small) == ["enc", "gaps"]
    assert small["gaps"].tolist() == leb128([0, 499, 498])
    assert decode_support(small, 1000).tolist() == [0, 500, 999]


def test_bad_support_payloads_are_refused_with_the_whole_message() -> None:
    with pytest.raises(ValueError, match=r"^support payload has no 'enc' array; keys: \['idx'\]$"):
        decode_support({"idx": np.array([1], np.int32)}, 10)
    with pytest.raises(ValueError, match=r"^support payload 'mask' is uint8\[2\]; expected uint8\[3\]"):
        decode_support(encode_support(np.arange(8), 10), 20)
    with pytest.raises(ValueError, match=r"^support payload 'enc' is int64\[1\]; expected uint8\[1\]"):
        decode_support({"enc": np.array([0]), "idx": np.array([1], np.int32)}, 10)
    with pytest.raises(ValueError, match=r"^d must be in \[1, 2147483647\]; got 0$"):
        decode_support(encode_support(np.arange(2), 10), 0)
    with pytest.raises(ValueError, match=r"^sparse payload 'gaps' must be uint8\[n\]; got int64\[2\]$"):
        decode_support({"enc": np.array([VARINT], np.uint8), "gaps": np.array([1, 2])}, 10)
    with pytest.raises(ValueError, match=r"^sparse payload 'gaps' must be uint8\[n\]; got float64\[2\]$"):
        decode_support({"enc": np.array([VARINT], np.uint8), "gaps": np.array([1.0, 2.0])}, 10)
    with pytest.raises(ValueError, match=r"^sparse payload 'gaps' must be uint8\[n\]; got object\[\]$"):
        decode_support({"enc": np.array([VARINT], np.uint8)}, 10)
