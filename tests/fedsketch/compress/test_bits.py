"""Bit packing: exact round trip for every width and length, documented layout."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedsketch.compress import pack_bits, unpack_bits


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
