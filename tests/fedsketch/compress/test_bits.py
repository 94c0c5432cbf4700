"""Bit packing: exact round trip for every width and length, documented layout, and its edges.

The edges: sizes, empty and boolean inputs, and each refusal with its exact message.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedsketch.compress import pack_bits, unpack_bits
from fedsketch.compress.bits import MAX_BITS, packed_size


@st.composite
def widths_and_values(draw: st.DrawFn) -> tuple[int, np.ndarray]:
    bits = draw(st.integers(1, 8))
    values = draw(st.lists(st.integers(0, (1 << bits) - 1), max_size=200))
    return bits, np.array(values, dtype=np.int64)


@settings(max_examples=300, deadline=None)
@given(widths_and_values())
def test_round_trip_any_width_and_length(case: tuple[int, np.ndarray]) -> None:
    bits, values = case
    packed = pack_bits(values, bits)
    assert packed.dtype == np.uint8
    assert packed.shape == ((values.size * bits + 7) // 8,)
    out = unpack_bits(packed, bits, values.size)
    assert out.dtype == np.uint8
    np.testing.assert_array_equal(out, values)


@pytest.mark.parametrize("bits", range(1, 9))
@pytest.mark.parametrize("n", [1, 7, 9, 13, 1001])
def test_layout_is_a_little_endian_bit_stream(bits: int, n: int) -> None:
    """Bit t of value i is stream bit i*b + t; stream bit j is bit j % 8 of byte j // 8."""
    values = np.random.default_rng(bits * 1000 + n).integers(0, 1 << bits, n)
    stream = [(int(v) >> t) & 1 for v in values for t in range(bits)]
    stream += [0] * (-len(stream) % 8)
    expected = [sum(stream[8 * j + q] << q for q in range(8)) for j in range(len(stream) // 8)]
    np.testing.assert_array_equal(pack_bits(values, bits), np.array(expected, dtype=np.uint8))


def test_one_bit_matches_numpy_packbits() -> None:
    values = np.random.default_rng(0).integers(0, 2, 77).astype(np.uint8)
    np.testing.assert_array_equal(pack_bits(values, 1), np.packbits(values, bitorder="little"))


def test_rejects_values_that_do_not_fit() -> None:
    with pytest.raises(ValueError, match=r"must be in \[0, 8\) for 3 bits"):
        pack_bits(np.array([0, 8]), 3)
    with pytest.raises(ValueError, match=r"must be in \[0, 4\)"):
        pack_bits(np.array([-1]), 2)


def test_rejects_bad_widths_and_arrays() -> None:
    with pytest.raises(ValueError, match=r"bits must be in \[1, 8\]"):
        pack_bits(np.array([1]), 9)
    with pytest.raises(ValueError, match=r"bits must be in \[1, 8\]"):
        unpack_bits(np.zeros(1, np.uint8), 0, 1)
    with pytest.raises(ValueError, match="1-D integer array"):
        pack_bits(np.array([0.5]), 4)


def test_unpack_rejects_a_length_mismatch() -> None:
    packed = pack_bits(np.arange(10) % 8, 3)  # 4 bytes
    with pytest.raises(ValueError, match=r"uint8\[5\] for 11 values of 3 bits"):
        unpack_bits(packed, 3, 11)


# the edges: sizes, empty and boolean inputs, each refusal with its exact message ----------------------------


@pytest.mark.parametrize(
    ("count", "bits", "size"), [(0, 1, 0), (1, 1, 1), (8, 1, 1), (9, 1, 2), (3, 8, 3), (8, 3, 3), (5, 3, 2), (3, 5, 2)]
)
def test_packed_size_is_the_ceiling_of_count_times_bits_over_eight(count: int, bits: int, size: int) -> None:
    assert packed_size(count, bits) == size
    assert isinstance(packed_size(count, bits), int)


def test_empty_input_packs_to_nothing_and_back() -> None:
    for bits in (1, MAX_BITS):
        packed = pack_bits(np.array([], dtype=np.int64), bits)
        assert packed.dtype == np.uint8 and packed.shape == (0,)
        out = unpack_bits(packed, bits, 0)
        assert out.dtype == np.uint8 and out.shape == (0,)


def test_booleans_pack_as_single_bits() -> None:
    flags = np.array([True, False, True, True, False, False, False, False, True])
    packed = pack_bits(flags, 1)
    assert packed.tolist() == [0b00001101, 0b1]
    assert unpack_bits(packed, 1, 9).tolist() == flags.astype(np.uint8).tolist()


def test_a_full_group_of_eight_bit_values_is_the_values_themselves() -> None:
    values = np.array([255, 0, 1, 128, 7, 64, 200, 3, 9], dtype=np.int32)
    packed = pack_bits(values, 8)
    assert packed.tolist() == values.tolist()
    assert unpack_bits(packed, 8, 9).tolist() == values.tolist()


def test_three_bit_values_cross_byte_boundaries() -> None:
    values = np.array([5, 3, 7, 1, 0, 6], dtype=np.uint8)
    stream = sum(int(v) << (3 * i) for i, v in enumerate(values))  # 18 bits, little-endian
    packed = pack_bits(values, 3)
    assert packed.tolist() == [(stream >> (8 * j)) & 0xFF for j in range(3)]
    assert unpack_bits(packed, 3, 6).tolist() == values.tolist()
    # a payload with the padding bits set still decodes the same values
    dirty = packed.copy()
    dirty[-1] |= 0b11111100
    assert unpack_bits(dirty, 3, 6).tolist() == values.tolist()


def test_values_at_the_edges_of_their_range_are_taken() -> None:
    for bits in range(1, MAX_BITS + 1):
        values = np.array([0, (1 << bits) - 1, 0, (1 << bits) - 1])
        assert unpack_bits(pack_bits(values, bits), bits, 4).tolist() == values.tolist()


def test_pack_refusals_name_the_problem() -> None:
    with pytest.raises(ValueError, match=r"^bits must be in \[1, 8\]; got 0$"):
        pack_bits(np.array([0]), 0)
    with pytest.raises(ValueError, match=r"^bits must be in \[1, 8\]; got 9$"):
        pack_bits(np.array([0]), 9)
    with pytest.raises(ValueError, match=r"^values must be a 1-D integer array; got int64\[2, 2\]$"):
        pack_bits(np.zeros((2, 2), dtype=np.int64), 2)
    with pytest.raises(ValueError, match=r"^values must be a 1-D integer array; got float32\[3\]$"):
        pack_bits(np.zeros(3, dtype=np.float32), 2)
    with pytest.raises(ValueError, match=r"^values must be in \[0, 8\) for 3 bits; got \[0, 8\]$"):
        pack_bits(np.array([0, 8, 3]), 3)
    with pytest.raises(ValueError, match=r"^values must be in \[0, 2\) for 1 bits; got \[-1, 1\]$"):
        pack_bits(np.array([1, -1]), 1)


def test_unpack_refusals_name_the_problem() -> None:
    with pytest.raises(ValueError, match=r"^bits must be in \[1, 8\]; got 0$"):
        unpack_bits(np.zeros(1, np.uint8), 0, 1)
    with pytest.raises(ValueError, match=r"^bits must be in \[1, 8\]; got 9$"):
        unpack_bits(np.zeros(9, np.uint8), 9, 8)
    with pytest.raises(ValueError, match=r"^count must be in \[0\]; got -1$"):
        unpack_bits(np.zeros(0, np.uint8), 1, -1)
    with pytest.raises(ValueError, match=r"^packed must be uint8\[2\] for 9 values of 1 bits; got int8\[2\]$"):
        unpack_bits(np.zeros(2, np.int8), 1, 9)
    with pytest.raises(ValueError, match=r"^packed must be uint8\[2\] for 9 values of 1 bits; got uint8\[1, 2\]$"):
        unpack_bits(np.zeros((1, 2), np.uint8), 1, 9)
    with pytest.raises(ValueError, match=r"^packed must be uint8\[2\] for 9 values of 1 bits; got uint8\[3\]$"):
        unpack_bits(np.zeros(3, np.uint8), 1, 9)
