"""Scaled sign compression, the compressor of EF-signSGD, and majority vote.

Karimireddy et al., "Error Feedback Fixes SignSGD and other Gradient
Compression Schemes", ICML 2019, Algorithm 1: ``C(p) = (||p||_1 / d) sign(p)``,
a contraction but **biased**: use it under error feedback
(:mod:`fedsketch.compress.error_feedback`). ``bucket_size`` gives each bucket
its own scale, as the paper's code does per layer. A zero is sent as ``+scale``.
:func:`majority_vote` is signSGD with majority vote (Bernstein, Zhao,
Azizzadenesheli and Anandkumar, ICLR 2019): the server applies the sign of the
sum of the workers' signs. More on both: docs/methods.md.

Payload (``nb`` = 1, or ``ceil(d / bucket_size)``):
``scale: float32[nb]``, ``sign: uint8[ceil(d / 8)]`` (1 = negative).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from fedsketch.compress import buckets
from fedsketch.compress.bits import pack_bits, packed_size, unpack_bits
from fedsketch.compress.common import (
    Payload,
    check_bucket_size,
    check_d,
    check_vector,
    generator,
    num_buckets,
    require,
    scalars,
)

METHOD = "signsgd"


def compress(vec: torch.Tensor, *, bucket_size: int | None = None, zero_seed: int | None = None) -> Payload:
    """Signs of ``vec`` and the mean magnitude of each bucket.

    One bit cannot say "zero". By default a zero is sent as ``+`` (deterministic;
    error feedback corrects it next round). With ``zero_seed`` each zero gets a
    fair random sign instead, as the Sketched-SGD authors' signSGD code does: in
    a majority vote, coordinates whose gradient is zero on every worker (unused
    inputs, dead units) would otherwise all be pushed the same way every round.
    """
    vec = check_vector(vec)
    bucket_size = check_bucket_size(bucket_size)
    rows = buckets.split(vec, bucket_size)
    counts = buckets.sizes(vec.numel(), bucket_size).to(vec.device)
    scale = rows.abs().sum(dim=1) / counts  # padding is zero, so it adds nothing
    negative = vec < 0
    if zero_seed is not None:
        coin = torch.rand(vec.shape, generator=generator(zero_seed, "cpu")).to(vec.device) < 0.5
        negative = torch.where(vec == 0, coin, negative)
    return {"scale": scalars(scale), "sign": pack_bits(negative.cpu().numpy(), 1)}


def decompress(payload: Payload, d: int, *, bucket_size: int | None = None) -> torch.Tensor:
    """``scale * (+1 or -1)`` per coordinate, as a float32 vector of length ``d``."""
    d = check_d(d)
    bucket_size = check_bucket_size(bucket_size)
    scale = require(payload, "scale", np.float32, (num_buckets(d, bucket_size),), METHOD)
    sign = require(payload, "sign", np.uint8, (packed_size(d, 1),), METHOD)
    signs = 1.0 - 2.0 * torch.from_numpy(unpack_bits(sign, 1, d)).to(torch.float32)
    return buckets.expand(torch.from_numpy(scale.copy()), d, bucket_size) * signs


def majority_vote(decoded: Sequence[torch.Tensor]) -> torch.Tensor:
    """``sign(sum_i sign(x_i))`` per coordinate: +1, -1, or 0 on a tie.

    ``decoded`` are decompressed payloads (or any vectors); only their signs
    count, one vote per worker. A worker whose whole scale is zero abstains.

    Raises
    ------
    ValueError
        If there are no votes or their shapes differ.
    """
    if not decoded:
        raise ValueError("majority_vote needs at least one vector")
    total = torch.zeros_like(decoded[0], dtype=torch.float32)
    for vec in decoded:
        if vec.shape != total.shape:
            raise ValueError(f"votes have shapes {tuple(total.shape)} and {tuple(vec.shape)}")
        total += torch.sign(vec.to(total))
    return torch.sign(total)
