"""Every upload compressor, bound to a vector length and its options.

``NAME_compressor(d, **options)`` (``topk_compressor(d, k=...)``, ...) checks the
options once, when the run starts, and returns an object with ``compress(vec,
seed=...)`` and ``decompress(payload, seed=...)``; each method calls its own
(:mod:`fedsketch.methods.compressed`). ``get_compressor(name, d, **options)`` finds
one by name, for tools and tests. The functions underneath are the modules'
pure ``compress`` / ``decompress``; a :class:`Compressor` only binds ``d`` and the options.

``seed`` is per client and round (see :func:`fedsketch.compress.derive_seed`).
Randomized compressors (``random_k``, ``qsgd``, ``terngrad``) refuse ``None``;
``random_k`` also needs the same seed to decompress, since its coordinates are
not sent. The others ignore it.

``unbiased`` says whether ``E[decompress(compress(x))] = x``; a biased
compressor should run under error feedback (Karimireddy et al., ICML 2019).
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable
from dataclasses import dataclass

import torch

from fedsketch.compress import common as c
from fedsketch.compress import gaussiank, identity, qsgd, random_k, signsgd, terngrad, topk
from fedsketch.compress.common import Payload

Encode = Callable[[torch.Tensor, int | None], Payload]
Decode = Callable[[Payload, int | None], torch.Tensor]


@dataclass(frozen=True)
class Compressor:
    """One compressor bound to a vector length and its options; ``seed`` as the module docstring says."""

    name: str
    d: int
    unbiased: bool
    encode: Encode
    decode: Decode

    def compress(self, vec: torch.Tensor, *, seed: int | None = None) -> Payload:
        """The payload of ``vec`` (checked to be a float vector of length ``d``)."""
        return self.encode(c.check_vector(vec, self.d), seed)

    def decompress(self, payload: Payload, *, seed: int | None = None) -> torch.Tensor:
        """The float32 vector a payload stands for."""
        return self.decode(payload, seed)


def none_compressor(d: int) -> Compressor:
    """``"none"``: the dense float32 vector (:mod:`fedsketch.compress.identity`)."""
    c.check_d(d)
    return Compressor("none", d, True, lambda v, _: identity.compress(v), lambda p, _: identity.decompress(p, d))


def topk_compressor(d: int, k: int, varint: bool = False) -> Compressor:
    """``"topk"``: exact top-k (:mod:`fedsketch.compress.topk`)."""
    c.check_int("k", k, 1, c.check_d(d))
    encode: Encode = lambda v, _: topk.compress(v, k=k, varint=varint)
    return Compressor("topk", d, False, encode, lambda p, _: topk.decompress(p, d))


def random_k_compressor(d: int, k: int, rescale: bool = False) -> Compressor:
    """``"random_k"``: k shared-seed coordinates, values only; the seed decodes them too (:mod:`~.random_k`)."""
    c.check_int("k", k, 1, c.check_d(d))
    encode: Encode = lambda v, s: random_k.compress(v, k=k, seed=c.check_seed(s, "random_k"), rescale=rescale)
    return Compressor(
        "random_k", d, rescale, encode, lambda p, s: random_k.decompress(p, d, seed=c.check_seed(s, "random_k"))
    )


def gaussiank_compressor(
    d: int, k: int, max_rounds: int = 3, adjust: str = "paper", cap: bool = True, varint: bool = False
) -> Compressor:
    """``"gaussiank"``: the threshold of a Gaussian fit, adjusted towards k (:mod:`~.gaussiank`)."""
    c.check_int("k", k, 1, c.check_d(d))
    c.check_int("max_rounds", max_rounds, 1)
    if adjust not in gaussiank.ADJUST_RULES:
        raise ValueError(f"adjust must be one of {gaussiank.ADJUST_RULES}; got {adjust!r}")
    return Compressor(
        "gaussiank",
        d,
        False,
        lambda v, _: gaussiank.compress(v, k=k, max_rounds=max_rounds, adjust=adjust, cap=cap, varint=varint),
        lambda p, _: gaussiank.decompress(p, d),
    )


def qsgd_compressor(d: int, s: int, bucket_size: int | None = None) -> Compressor:
    """``"qsgd"``: s-level stochastic quantization (:mod:`fedsketch.compress.qsgd`)."""
    c.check_d(d)
    qsgd.level_bits(s)
    c.check_bucket_size(bucket_size)
    encode: Encode = lambda v, seed: qsgd.compress(v, s=s, seed=c.check_seed(seed, "qsgd"), bucket_size=bucket_size)
    return Compressor("qsgd", d, True, encode, lambda p, _: qsgd.decompress(p, d, s=s, bucket_size=bucket_size))


def terngrad_compressor(d: int, bucket_size: int | None = None) -> Compressor:
    """``"terngrad"``: stochastic ternarization (:mod:`fedsketch.compress.terngrad`)."""
    c.check_d(d)
    c.check_bucket_size(bucket_size)
    encode: Encode = lambda v, seed: terngrad.compress(v, seed=c.check_seed(seed, "terngrad"), bucket_size=bucket_size)
    return Compressor("terngrad", d, True, encode, lambda p, _: terngrad.decompress(p, d, bucket_size=bucket_size))


def signsgd_compressor(d: int, bucket_size: int | None = None, random_zeros: bool = False) -> Compressor:
    """``"signsgd"``: the scaled sign of EF-signSGD; ``random_zeros``: a fair sign for zeros, for votes."""
    c.check_d(d)
    c.check_bucket_size(bucket_size)

    def encode(v: torch.Tensor, seed: int | None) -> Payload:
        zero_seed = c.check_seed(seed, "signsgd with random_zeros") if random_zeros else None
        return signsgd.compress(v, bucket_size=bucket_size, zero_seed=zero_seed)

    return Compressor("signsgd", d, False, encode, lambda p, _: signsgd.decompress(p, d, bucket_size=bucket_size))


COMPRESSORS: dict[str, Callable[..., Compressor]] = {
    "none": none_compressor,
    "topk": topk_compressor,
    "random_k": random_k_compressor,
    "gaussiank": gaussiank_compressor,
    "qsgd": qsgd_compressor,
    "terngrad": terngrad_compressor,
    "signsgd": signsgd_compressor,
}


def get_compressor(name: str, d: int, **options: object) -> Compressor:
    """The compressor ``name`` for vectors of length ``d``, with its options checked now.

    Raises
    ------
    ValueError
        If the name is unknown, an option is unknown or missing, or a value is
        out of range; the message lists what the compressor accepts.
    """
    if name not in COMPRESSORS:
        close = difflib.get_close_matches(name, COMPRESSORS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"unknown compressor {name!r}{hint}; known: {sorted(COMPRESSORS)}")
    factory = COMPRESSORS[name]
    params = inspect.signature(factory).parameters
    accepted = sorted(p for p in params if p != "d")
    unknown = sorted(set(options) - set(params) | ({"d"} & set(options)))
    missing = sorted(
        p for p, spec in params.items() if p != "d" and spec.default is inspect.Parameter.empty and p not in options
    )
    if unknown or missing:
        raise ValueError(f"{name} takes options {accepted}; unknown: {unknown}, missing: {missing}")
    return factory(d=d, **options)
