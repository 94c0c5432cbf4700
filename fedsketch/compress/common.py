"""What every compressor shares: the payload type, argument checks and seeds.

A *payload* is what one client puts on the wire: a ``dict[str, numpy.ndarray]``
of plain (non-object) arrays, so that each array survives ``np.save`` as is.
Bytes are counted by whoever serializes the payload; :func:`payload_nbytes` is
only a cross-check of the raw array sizes (it leaves out ``np.save`` headers).

Shared randomness (random-k's coordinates) comes from a private seed carried in
the round's config, never from the global RNG, so that a client and the server
derive the same values on their own (as PyTorch's PowerSGD hook does).
"""

from __future__ import annotations

import math

import numpy as np
import torch

Payload = dict[str, np.ndarray]

MAX_D = 2**31 - 1
"""Largest vector length: sparse encodings send indices as int32."""

_SEED_BOUND = 2**63
"""``torch.Generator.manual_seed`` takes seeds below 2**63."""


def payload_nbytes(payload: Payload) -> int:
    """Sum of ``arr.nbytes`` over a payload's arrays (no serialization headers).

    A cross-check for tests and formulas; the bytes a run reports are counted
    from the serialized message, in one place outside this package.
    """
    return sum(int(arr.nbytes) for arr in payload.values())


def check_vector(vec: torch.Tensor, d: int | None = None) -> torch.Tensor:
    """``vec`` as a contiguous float32 1-D tensor, after checking its shape.

    Raises
    ------
    TypeError
        If ``vec`` is not a floating-point tensor.
    ValueError
        If ``vec`` is not 1-D, is empty, is longer than :data:`MAX_D`, or
        (when ``d`` is given) does not have length ``d``.
    """
    if not isinstance(vec, torch.Tensor) or not vec.is_floating_point():
        raise TypeError(f"expected a floating-point torch.Tensor; got {type(vec).__name__}")
    if vec.dim() != 1 or vec.numel() == 0:
        raise ValueError(f"expected a non-empty 1-D vector; got shape {tuple(vec.shape)}")
    if vec.numel() > MAX_D:
        raise ValueError(f"vector length {vec.numel()} exceeds {MAX_D} (int32 indices)")
    if d is not None and vec.numel() != d:
        raise ValueError(f"vector has length {vec.numel()}; expected d={d}")
    return vec.detach().to(torch.float32).contiguous()


def check_int(name: str, value: object, lo: int, hi: int | None = None) -> int:
    """``value`` if it is an int in ``[lo, hi]``.

    Raises
    ------
    TypeError
        If ``value`` is not an int (a bool is not taken for one).
    ValueError
        If it is out of range.
    """
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int; got {value!r}")
    if value < lo or (hi is not None and value > hi):
        upper = "" if hi is None else f", {hi}"
        raise ValueError(f"{name} must be in [{lo}{upper}]; got {value}")
    return int(value)


def check_d(d: object) -> int:
    """A vector length: an int in ``[1, MAX_D]``."""
    return check_int("d", d, 1, MAX_D)


def check_bucket_size(bucket_size: int | None) -> int | None:
    """``None`` (one bucket for the whole vector) or a positive int."""
    return None if bucket_size is None else check_int("bucket_size", bucket_size, 1)


def num_buckets(d: int, bucket_size: int | None) -> int:
    """How many scales a bucketed quantizer sends for a vector of length ``d``."""
    return 1 if bucket_size is None else math.ceil(d / bucket_size)


def require(payload: Payload, key: str, dtype: type, shape: tuple[int, ...], method: str) -> np.ndarray:
    """``payload[key]``, after checking that it exists with this dtype and shape.

    Raises
    ------
    ValueError
        Naming the method and the array that does not match, so a payload
        decoded with the wrong settings (``d``, ``s``, bucket size) fails loudly
        instead of decoding to garbage.
    """
    if key not in payload:
        raise ValueError(f"{method} payload has no {key!r} array; keys: {sorted(payload)}")
    arr = np.asarray(payload[key])
    if arr.dtype != np.dtype(dtype) or arr.shape != shape:
        raise ValueError(
            f"{method} payload {key!r} is {arr.dtype}{list(arr.shape)}; "
            f"expected {np.dtype(dtype)}{list(shape)} (do d and the settings match the sender's?)"
        )
    return arr


def check_seed(seed: int | None, method: str) -> int:
    """A seed for ``torch.Generator.manual_seed``; ``None`` is an error."""
    if seed is None:
        raise ValueError(f"{method} is randomized and needs a seed (see derive_seed)")
    return check_int("seed", seed, 0, _SEED_BOUND - 1)


def derive_seed(*parts: int) -> int:
    """A seed in ``[0, 2**63)`` mixed from non-negative ints, e.g. ``(run_seed, round, cid)``.

    Uses numpy's ``SeedSequence`` hash, whose output is fixed across numpy
    versions and platforms, so every party derives the same seed. Distinct
    tuples give unrelated seeds (no ``seed + round`` collisions across runs).
    """
    if not parts:
        raise ValueError("derive_seed needs at least one part")
    for i, part in enumerate(parts):
        check_int(f"part {i}", part, 0)
    state = np.random.SeedSequence([int(p) for p in parts]).generate_state(1, dtype=np.uint64)
    return int(state[0]) % _SEED_BOUND


def generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    """A private generator seeded with ``seed`` (never the global RNG)."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return gen


def scalars(values: torch.Tensor) -> np.ndarray:
    """Per-bucket scales as a float32 numpy array (1-element for one bucket)."""
    return values.detach().to(torch.float32).reshape(-1).cpu().numpy()
