"""Sparse vectors on the wire: which coordinates, and their float32 values.

Top-k (Aji & Heafield, EMNLP 2017; Stich et al., NeurIPS 2018), local top-k as
a FetchSGD baseline (Rothchild et al., ICML 2020, Sec. 6) and Gaussian-k (Shi
et al., 2019) all send ``k`` of ``d`` coordinates. The encoder picks the
smallest way to send the positions (ties go to the lower ``enc``):

- ``enc = 0``, ``indices``: ``idx: int32[k]``, sorted; ``4k`` bytes.
- ``enc = 1``, ``bitmap``: ``mask: uint8[ceil(d / 8)]``, the support packed
  little-endian (as :mod:`fedsketch.compress.bits`); smaller when ``k > d / 32``.
- ``enc = 2``, ``varint`` (opt-in, ``varint=True``): ``gaps: uint8[n]``, the
  sorted indices as gaps (``idx[0]``, then ``idx[i] - idx[i-1] - 1``), each a
  LEB128 varint. When it wins: docs/methods.md.

Every payload also has ``enc: uint8[1]`` and ``val: float32[k]``, the values in
increasing index order. ``d`` is not sent: both sides know it from the model.
"""

from __future__ import annotations

import numpy as np
import torch

from fedsketch.compress.bits import pack_bits, packed_size, unpack_bits
from fedsketch.compress.common import Payload, check_d, require

ENC_INDICES = 0
ENC_BITMAP = 1
ENC_VARINT = 2
ENCODINGS = {ENC_INDICES: "indices", ENC_BITMAP: "bitmap", ENC_VARINT: "varint"}

_VARINT_MAX_BYTES = 5  # ceil(31 / 7): a gap is below 2**31


def encode_sparse(
    indices: torch.Tensor | np.ndarray,
    values: torch.Tensor | np.ndarray,
    d: int,
    *,
    varint: bool = False,
) -> Payload:
    """The smallest payload for the sparse vector ``(indices, values)`` of length ``d``.

    Parameters
    ----------
    indices
        Distinct coordinates in ``[0, d)``, in any order.
    values
        Their values (same length), sent as float32.
    d
        Length of the dense vector.
    varint
        Also consider the delta-varint encoding (see the module docstring).

    Raises
    ------
    ValueError
        If the arrays are not 1-D of equal length, or an index is repeated or
        out of range.
    """
    d = check_d(d)
    idx, val = _sorted_pairs(indices, values, d)
    candidates: dict[int, np.ndarray] = {
        ENC_INDICES: idx.astype(np.int32),
        ENC_BITMAP: np.empty(packed_size(d, 1), dtype=np.uint8),  # built only if chosen
    }
    if varint:
        candidates[ENC_VARINT] = _varint_encode(np.diff(idx, prepend=-1) - 1)
    enc = _smallest({e: arr.nbytes for e, arr in candidates.items()})
    if enc == ENC_BITMAP:
        mask = np.zeros(d, dtype=np.uint8)
        mask[idx] = 1
        candidates[ENC_BITMAP] = pack_bits(mask, 1)
    key = {ENC_INDICES: "idx", ENC_BITMAP: "mask", ENC_VARINT: "gaps"}[enc]
    return {"enc": np.array([enc], dtype=np.uint8), key: candidates[enc], "val": val}


def pick_encoding(count: int, d: int) -> int:
    """The encoding :func:`encode_sparse` picks (without ``varint``) for ``count`` of ``d`` coordinates."""
    return _smallest({ENC_INDICES: 4 * count, ENC_BITMAP: packed_size(check_d(d), 1)})


def _smallest(sizes: dict[int, int]) -> int:
    """The encoding of fewest bytes; ties go to the lower ``enc``."""
    return min(sizes, key=lambda e: (sizes[e], e))


def decode_sparse_pairs(payload: Payload, d: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(indices, values)`` of a sparse payload: int64 sorted indices, float32 values.

    Raises
    ------
    ValueError
        If the payload is malformed or does not fit a vector of length ``d``.
    """
    d = check_d(d)
    enc_arr = require(payload, "enc", np.uint8, (1,), "sparse")
    enc = int(enc_arr[0])
    if enc not in ENCODINGS:
        raise ValueError(f"unknown sparse encoding {enc}; known: {ENCODINGS}")
    val = np.asarray(payload.get("val"))
    if val.dtype != np.float32 or val.ndim != 1:
        raise ValueError(f"sparse payload 'val' must be float32[k]; got {val.dtype}{list(val.shape)}")
    k = val.size
    if enc == ENC_INDICES:
        idx = require(payload, "idx", np.int32, (k,), "sparse").astype(np.int64)
    elif enc == ENC_BITMAP:
        bits = unpack_bits(require(payload, "mask", np.uint8, (packed_size(d, 1),), "sparse"), 1, d)
        idx = np.flatnonzero(bits)
    else:
        gaps = np.asarray(payload.get("gaps"))
        if gaps.dtype != np.uint8 or gaps.ndim != 1:
            raise ValueError(f"sparse payload 'gaps' must be uint8[n]; got {gaps.dtype}{list(gaps.shape)}")
        idx = np.cumsum(_varint_decode(gaps, k) + 1) - 1
    if idx.size != k:
        raise ValueError(f"sparse payload has {idx.size} positions but {k} values")
    if k and (idx[0] < 0 or idx[-1] >= d or np.any(np.diff(idx) <= 0)):
        raise ValueError(f"sparse payload positions are not distinct, sorted and within [0, {d})")
    return torch.from_numpy(idx), torch.from_numpy(val.copy())


def decode_sparse(payload: Payload, d: int) -> torch.Tensor:
    """The dense float32 vector of length ``d`` that a sparse payload encodes."""
    idx, val = decode_sparse_pairs(payload, d)
    out = torch.zeros(d, dtype=torch.float32)
    out[idx] = val
    return out


def encode_support(indices: torch.Tensor | np.ndarray, d: int, *, varint: bool = False) -> Payload:
    """Positions only, in the smallest of the encodings above (a sparse payload without ``val``).

    Sketched-SGD's server sends its candidate coordinates this way (Ivkin et
    al., NeurIPS 2019), and the support of the update its clients must zero.
    """
    payload = encode_sparse(indices, np.zeros(len(indices), dtype=np.float32), d, varint=varint)
    del payload["val"]
    return payload


def decode_support(payload: Payload, d: int) -> torch.Tensor:
    """The sorted int64 positions of a payload from :func:`encode_support`.

    Raises
    ------
    ValueError
        If the payload is malformed or does not fit a vector of length ``d``.
    """
    d = check_d(d)
    enc = int(require(payload, "enc", np.uint8, (1,), "support")[0])
    if enc == ENC_BITMAP:
        count = int(unpack_bits(require(payload, "mask", np.uint8, (packed_size(d, 1),), "support"), 1, d).sum())
    elif enc == ENC_VARINT:
        gaps = np.asarray(payload.get("gaps", np.zeros(0, np.uint8)))
        count = int(((gaps & 0x80) == 0).sum()) if gaps.dtype == np.uint8 else 0
    else:
        count = int(np.asarray(payload.get("idx", np.zeros(0))).size)
    return decode_sparse_pairs({**payload, "val": np.zeros(count, dtype=np.float32)}, d)[0]


def sparse_count(payload: Payload) -> int:
    """How many coordinates a sparse payload carries (the length of ``val``)."""
    return int(np.asarray(payload["val"]).size)


def _sorted_pairs(
    indices: torch.Tensor | np.ndarray, values: torch.Tensor | np.ndarray, d: int
) -> tuple[np.ndarray, np.ndarray]:
    """Validated int64 indices in increasing order, with float32 values to match."""
    idx = _to_numpy(indices)
    val = _to_numpy(values)
    if idx.ndim != 1 or val.ndim != 1 or idx.size != val.size:
        raise ValueError(f"indices and values must be 1-D of equal length; got {idx.shape} and {val.shape}")
    if idx.size and not np.issubdtype(idx.dtype, np.integer):
        raise ValueError(f"indices must be integers; got {idx.dtype}")
    idx = idx.astype(np.int64)
    order = np.argsort(idx, kind="stable")
    idx, val = idx[order], val[order].astype(np.float32)
    if idx.size and (idx[0] < 0 or idx[-1] >= d):
        raise ValueError(f"indices must be in [0, {d}); got [{idx[0]}, {idx[-1]}]")
    if np.any(np.diff(idx) == 0):
        raise ValueError("indices must be distinct")
    return idx, val


def _to_numpy(x: torch.Tensor | np.ndarray) -> np.ndarray:
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def _varint_encode(gaps: np.ndarray) -> np.ndarray:
    """LEB128: 7 bits per byte, low bits first, high bit set on all but the last byte."""
    gaps = gaps.astype(np.int64)
    lengths = np.ones(gaps.size, dtype=np.int64)
    for j in range(1, _VARINT_MAX_BYTES):
        lengths += gaps >= (1 << (7 * j))
    starts = np.cumsum(lengths) - lengths
    out = np.zeros(int(lengths.sum()), dtype=np.uint8)
    for j in range(_VARINT_MAX_BYTES):
        sel = lengths > j
        more = np.where(lengths[sel] > j + 1, 0x80, 0)
        out[starts[sel] + j] = ((gaps[sel] >> (7 * j)) & 0x7F) | more
    return out


def _varint_decode(buf: np.ndarray, count: int) -> np.ndarray:
    """Inverse of :func:`_varint_encode`; checks that it holds exactly ``count`` numbers."""
    last = (buf & 0x80) == 0
    if int(last.sum()) != count or (buf.size and not last[-1]):
        raise ValueError(f"varint gaps hold {int(last.sum())} complete numbers; expected {count}")
    group = np.cumsum(last) - last  # which number each byte belongs to
    starts = np.concatenate(([0], np.flatnonzero(last)[:-1] + 1)).astype(np.int64)
    pos = np.arange(buf.size) - starts[group]
    if buf.size and pos.max() >= _VARINT_MAX_BYTES:
        raise ValueError(f"a varint gap is longer than {_VARINT_MAX_BYTES} bytes")
    out = np.zeros(count, dtype=np.int64)
    for j in range(_VARINT_MAX_BYTES):
        sel = pos == j  # at most one byte per number at each position
        out[group[sel]] |= (buf[sel].astype(np.int64) & 0x7F) << (7 * j)
    return out
