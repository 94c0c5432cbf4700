"""QSGD: unbiased stochastic quantization to ``s`` levels.

Alistarh et al., "QSGD: Communication-Efficient SGD via Gradient Quantization
and Encoding", NeurIPS 2017, Sec. 3.1. Each coordinate is sent as
``||v|| * sign(v_i) * l_i / s``, with ``l_i`` the floor or the ceiling of
``s |v_i| / ||v||`` drawn so that ``E[l_i / s] = |v_i| / ||v||``: **unbiased**,
no error feedback needed. One norm per bucket (:mod:`fedsketch.compress.buckets`)
bounds the variance; levels are bit-packed with a fixed ``ceil(log2(s + 1))``
bits each instead of the paper's Elias code (docs/methods.md).

Payload (``nb`` = 1, or ``ceil(d / bucket_size)``):
``norm: float32[nb]``, ``sign: uint8[ceil(d / 8)]`` (1 = negative),
``level: uint8[ceil(d * b / 8)]`` with ``b = ceil(log2(s + 1))``.
"""

from __future__ import annotations

import numpy as np
import torch

from fedsketch.compress import buckets, common
from fedsketch.compress.bits import MAX_BITS, pack_bits, packed_size, unpack_bits
from fedsketch.compress.common import Payload

METHOD = "qsgd"
MAX_LEVELS = (1 << MAX_BITS) - 1


def level_bits(s: int) -> int:
    """Bits per level, ``ceil(log2(s + 1))``: levels ``0..s`` must fit."""
    return common.check_int("s", s, 1, MAX_LEVELS).bit_length()


def compress(vec: torch.Tensor, *, s: int, seed: int, bucket_size: int | None = None) -> Payload:
    """Quantize ``vec`` to ``s`` levels per bucket norm, with stochastic rounding from ``seed``.

    The rounding noise comes from a private generator on ``vec``'s device; only
    the client needs it, so the server does not have to reproduce it.
    """
    vec = common.check_vector(vec)
    bits = level_bits(s)
    bucket_size = common.check_bucket_size(bucket_size)
    gen = common.generator(common.check_seed(seed, METHOD), vec.device)
    rows = buckets.split(vec, bucket_size)
    norms = torch.linalg.vector_norm(rows, dim=1, keepdim=True)
    safe = torch.where(norms > 0, norms, torch.ones_like(norms))
    # |v_i| <= ||v|| mathematically; clamp so float rounding cannot exceed level s.
    ratio = (rows.abs() / safe * s).clamp_(0, s)
    low = ratio.floor()
    up = torch.rand(ratio.shape, generator=gen, device=vec.device) < (ratio - low)
    levels = (low + up).to(torch.uint8).reshape(-1)[: vec.numel()]
    return {
        "norm": common.scalars(norms),
        "sign": pack_bits((vec < 0).cpu().numpy(), 1),
        "level": pack_bits(levels.cpu().numpy(), bits),
    }


def decompress(payload: Payload, d: int, *, s: int, bucket_size: int | None = None) -> torch.Tensor:
    """``norm * sign * level / s`` per coordinate, as a float32 vector of length ``d``."""
    d = common.check_d(d)
    bits = level_bits(s)
    bucket_size = common.check_bucket_size(bucket_size)
    norms = common.require(payload, "norm", np.float32, (common.num_buckets(d, bucket_size),), METHOD)
    sign = common.require(payload, "sign", np.uint8, (packed_size(d, 1),), METHOD)
    level = common.require(payload, "level", np.uint8, (packed_size(d, bits),), METHOD)
    levels = torch.from_numpy(unpack_bits(level, bits, d)).to(torch.float32)
    if levels.numel() and float(levels.max()) > s:
        raise ValueError(f"qsgd payload has a level above s={s} (was it sent with another s?)")
    signs = 1.0 - 2.0 * torch.from_numpy(unpack_bits(sign, 1, d)).to(torch.float32)
    scale = buckets.expand(torch.from_numpy(norms.copy()), d, bucket_size)
    return scale * signs * levels / s
