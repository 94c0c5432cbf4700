"""Packing small unsigned ints, ``b`` bits each (``1 <= b <= 8``), into bytes.

Quantizers send levels of a few bits per coordinate: QSGD (Alistarh et al.,
NeurIPS 2017) ``ceil(log2(s + 1))`` bits, TernGrad (Wen et al., NeurIPS 2017)
2 bits, EF-signSGD (Karimireddy et al., ICML 2019) 1 bit. Sending them as one
byte each would waste up to 8x, so they are packed.

Layout: a little-endian bit stream. Bit ``t`` of value ``i`` is stream bit
``i * b + t``, and stream bit ``j`` is bit ``j % 8`` of byte ``j // 8``; the
last byte is zero-padded. ``n`` values take exactly ``ceil(n * b / 8)`` bytes.
For ``b = 1`` this is ``np.packbits(..., bitorder="little")``.

Both directions work on groups of 8 values, which fill exactly ``b`` bytes:
a group is assembled in one uint64 (8 values * 8 bits <= 64 bits, so the
shifts cannot overflow) and its low ``b`` bytes are kept.
"""

from __future__ import annotations

import numpy as np

from fedsketch.compress.common import check_int

MAX_BITS = 8
_SHIFTS = np.arange(8, dtype=np.uint64)


def packed_size(count: int, bits: int) -> int:
    """Bytes taken by ``count`` values of ``bits`` bits: ``ceil(count * bits / 8)``."""
    return (count * bits + 7) // 8


def pack_bits(values: np.ndarray, bits: int) -> np.ndarray:
    """Pack unsigned ints ``< 2**bits`` into a uint8 array of ``ceil(n * bits / 8)`` bytes.

    Parameters
    ----------
    values
        A 1-D array of integers in ``[0, 2**bits)``.
    bits
        Bits per value, ``1..8``.

    Raises
    ------
    ValueError
        If ``bits`` is out of range, ``values`` is not a 1-D integer array, or
        a value does not fit in ``bits`` bits.
    """
    bits = check_int("bits", bits, 1, MAX_BITS)
    arr = np.asarray(values)
    if arr.ndim != 1 or not (np.issubdtype(arr.dtype, np.integer) or arr.dtype == np.bool_):
        raise ValueError(f"values must be a 1-D integer array; got {arr.dtype}{list(arr.shape)}")
    n = arr.size
    if n and (int(arr.min()) < 0 or int(arr.max()) >= 1 << bits):
        raise ValueError(f"values must be in [0, {1 << bits}) for {bits} bits; got [{arr.min()}, {arr.max()}]")
    groups = -(-n // 8)
    padded = np.zeros(groups * 8, dtype=np.uint64)
    padded[:n] = arr
    words = np.bitwise_or.reduce(padded.reshape(groups, 8) << (_SHIFTS * np.uint64(bits)), axis=1)
    stream = words.astype("<u8").view(np.uint8).reshape(groups, 8)[:, :bits].reshape(-1)
    return np.ascontiguousarray(stream[: packed_size(n, bits)])


def unpack_bits(packed: np.ndarray, bits: int, count: int) -> np.ndarray:
    """Inverse of :func:`pack_bits`: ``count`` values as a uint8 array.

    Raises
    ------
    ValueError
        If ``packed`` is not a 1-D uint8 array of exactly
        ``ceil(count * bits / 8)`` bytes (a length mismatch means the sender used
        another ``count`` or ``bits``).
    """
    bits = check_int("bits", bits, 1, MAX_BITS)
    count = check_int("count", count, 0)
    arr = np.asarray(packed)
    expected = packed_size(count, bits)
    if arr.dtype != np.uint8 or arr.shape != (expected,):
        raise ValueError(
            f"packed must be uint8[{expected}] for {count} values of {bits} bits; got {arr.dtype}{list(arr.shape)}"
        )
    groups = -(-count // 8)
    stream = np.zeros((groups, 8), dtype=np.uint8)
    flat = np.zeros(groups * bits, dtype=np.uint8)
    flat[:expected] = arr
    stream[:, :bits] = flat.reshape(groups, bits)
    words = stream.view("<u8").reshape(groups, 1)
    mask = np.uint64((1 << bits) - 1)
    values = (words >> (_SHIFTS * np.uint64(bits))) & mask
    return values.reshape(-1)[:count].astype(np.uint8)
