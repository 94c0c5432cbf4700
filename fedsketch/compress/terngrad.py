"""TernGrad: unbiased stochastic ternarization to ``{-s, 0, +s}``.

Wen et al., "TernGrad: Ternary Gradients to Reduce Communication in Distributed
Deep Learning", NeurIPS 2017, Eq. 2: with ``s = max_i |g_i|``, coordinate ``i``
is sent as ``s * sign(g_i) * b_i`` where ``b_i ~ Bernoulli(|g_i| / s)``. So
``E[s * sign(g_i) * b_i] = g_i``: **unbiased**, no error feedback needed. The
paper shares one ``s`` per layer (optional ``bucket_size`` here, see
:mod:`fedsketch.compress.buckets`); its gradient clipping is not applied.

Each coordinate is a 2-bit code: 0 for 0, 1 for ``+s``, 2 for ``-s``. (Base-3
packing would take 1.6 bits; 2 bits keep decoding a shift and a mask.)

Payload (``nb`` = 1, or ``ceil(d / bucket_size)``):
``scale: float32[nb]``, ``tern: uint8[ceil(d / 4)]``.
"""

from __future__ import annotations

import numpy as np
import torch

from fedsketch.compress import buckets, common
from fedsketch.compress.bits import pack_bits, packed_size, unpack_bits
from fedsketch.compress.common import Payload

METHOD = "terngrad"
_BITS = 2


def compress(vec: torch.Tensor, *, seed: int, bucket_size: int | None = None) -> Payload:
    """Ternarize ``vec`` with stochastic rounding from ``seed`` (generator on ``vec``'s device)."""
    vec = common.check_vector(vec)
    bucket_size = common.check_bucket_size(bucket_size)
    gen = common.generator(common.check_seed(seed, METHOD), vec.device)
    rows = buckets.split(vec, bucket_size)
    scale = rows.abs().amax(dim=1, keepdim=True)
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    keep = torch.rand(rows.shape, generator=gen, device=vec.device) < rows.abs() / safe
    codes = keep.to(torch.uint8) * (1 + (rows < 0).to(torch.uint8))
    return {
        "scale": common.scalars(scale),
        "tern": pack_bits(codes.reshape(-1)[: vec.numel()].cpu().numpy(), _BITS),
    }


def decompress(payload: Payload, d: int, *, bucket_size: int | None = None) -> torch.Tensor:
    """``scale * {0, +1, -1}`` per coordinate, as a float32 vector of length ``d``."""
    d = common.check_d(d)
    bucket_size = common.check_bucket_size(bucket_size)
    scale = common.require(payload, "scale", np.float32, (common.num_buckets(d, bucket_size),), METHOD)
    tern = common.require(payload, "tern", np.uint8, (packed_size(d, _BITS),), METHOD)
    codes = torch.from_numpy(unpack_bits(tern, _BITS, d))
    if codes.numel() and int(codes.max()) > 2:
        raise ValueError("terngrad payload has the unused code 3")
    unit = (codes == 1).to(torch.float32) - (codes == 2).to(torch.float32)
    return buckets.expand(torch.from_numpy(scale.copy()), d, bucket_size) * unit
