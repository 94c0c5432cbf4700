"""Every upload compressor by name, bound to a vector length and its options.

``get_compressor(name, d, **options)`` checks the options once, when the run
starts, and returns an object with ``compress(vec, seed=...)`` and
``decompress(payload, seed=...)``. The functions underneath are the modules'
pure ``compress`` / ``decompress``; these classes only hold ``d`` and the options.

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
from typing import ClassVar, Protocol

import torch

from fedsketch.compress import (
    gaussiank,
    identity,
    qsgd,
    random_k,
    signsgd,
    terngrad,
    topk,
)
from fedsketch.compress.common import (
    Payload,
    check_bucket_size,
    check_d,
    check_int,
    check_seed,
    check_vector,
)


class Compressor(Protocol):
    """What a registry entry offers."""

    @property
    def d(self) -> int: ...

    @property
    def unbiased(self) -> bool: ...

    def compress(self, vec: torch.Tensor, *, seed: int | None = None) -> Payload: ...

    def decompress(self, payload: Payload, *, seed: int | None = None) -> torch.Tensor: ...


@dataclass(frozen=True)
class NoCompression:
    """``"none"``: the dense float32 vector (:mod:`fedsketch.compress.identity`)."""

    d: int
    unbiased: ClassVar[bool] = True

    def __post_init__(self) -> None:
        check_d(self.d)

    def compress(self, vec: torch.Tensor, *, seed: int | None = None) -> Payload:
        return identity.compress(check_vector(vec, self.d))

    def decompress(self, payload: Payload, *, seed: int | None = None) -> torch.Tensor:
        return identity.decompress(payload, self.d)


@dataclass(frozen=True)
class TopK:
    """``"topk"``: exact top-k (:mod:`fedsketch.compress.topk`)."""

    d: int
    k: int
    varint: bool = False
    unbiased: ClassVar[bool] = False

    def __post_init__(self) -> None:
        check_int("k", self.k, 1, check_d(self.d))

    def compress(self, vec: torch.Tensor, *, seed: int | None = None) -> Payload:
        return topk.compress(check_vector(vec, self.d), k=self.k, varint=self.varint)

    def decompress(self, payload: Payload, *, seed: int | None = None) -> torch.Tensor:
        return topk.decompress(payload, self.d)


@dataclass(frozen=True)
class RandomK:
    """``"random_k"``: k shared-seed coordinates, values only (:mod:`fedsketch.compress.random_k`)."""

    d: int
    k: int
    rescale: bool = False

    def __post_init__(self) -> None:
        check_int("k", self.k, 1, check_d(self.d))

    @property
    def unbiased(self) -> bool:
        return self.rescale

    def compress(self, vec: torch.Tensor, *, seed: int | None = None) -> Payload:
        return random_k.compress(
            check_vector(vec, self.d),
            k=self.k,
            seed=check_seed(seed, "random_k"),
            rescale=self.rescale,
        )

    def decompress(self, payload: Payload, *, seed: int | None = None) -> torch.Tensor:
        return random_k.decompress(payload, self.d, seed=check_seed(seed, "random_k"))


@dataclass(frozen=True)
class GaussianK:
    """``"gaussiank"``: threshold from a Gaussian fit (:mod:`fedsketch.compress.gaussiank`)."""

    d: int
    k: int
    max_rounds: int = 3
    adjust: str = "paper"
    cap: bool = True
    varint: bool = False
    unbiased: ClassVar[bool] = False

    def __post_init__(self) -> None:
        check_int("k", self.k, 1, check_d(self.d))
        check_int("max_rounds", self.max_rounds, 1)
        if self.adjust not in gaussiank.ADJUST_RULES:
            raise ValueError(f"adjust must be one of {gaussiank.ADJUST_RULES}; got {self.adjust!r}")

    def compress(self, vec: torch.Tensor, *, seed: int | None = None) -> Payload:
        return gaussiank.compress(
            check_vector(vec, self.d),
            k=self.k,
            max_rounds=self.max_rounds,
            adjust=self.adjust,
            cap=self.cap,
            varint=self.varint,
        )

    def decompress(self, payload: Payload, *, seed: int | None = None) -> torch.Tensor:
        return gaussiank.decompress(payload, self.d)


@dataclass(frozen=True)
class QSGD:
    """``"qsgd"``: s-level stochastic quantization (:mod:`fedsketch.compress.qsgd`)."""

    d: int
    s: int
    bucket_size: int | None = None
    unbiased: ClassVar[bool] = True

    def __post_init__(self) -> None:
        check_d(self.d)
        qsgd.level_bits(self.s)
        check_bucket_size(self.bucket_size)

    def compress(self, vec: torch.Tensor, *, seed: int | None = None) -> Payload:
        return qsgd.compress(
            check_vector(vec, self.d),
            s=self.s,
            seed=check_seed(seed, "qsgd"),
            bucket_size=self.bucket_size,
        )

    def decompress(self, payload: Payload, *, seed: int | None = None) -> torch.Tensor:
        return qsgd.decompress(payload, self.d, s=self.s, bucket_size=self.bucket_size)


@dataclass(frozen=True)
class TernGrad:
    """``"terngrad"``: stochastic ternarization (:mod:`fedsketch.compress.terngrad`)."""

    d: int
    bucket_size: int | None = None
    unbiased: ClassVar[bool] = True

    def __post_init__(self) -> None:
        check_d(self.d)
        check_bucket_size(self.bucket_size)

    def compress(self, vec: torch.Tensor, *, seed: int | None = None) -> Payload:
        return terngrad.compress(
            check_vector(vec, self.d),
            seed=check_seed(seed, "terngrad"),
            bucket_size=self.bucket_size,
        )

    def decompress(self, payload: Payload, *, seed: int | None = None) -> torch.Tensor:
        return terngrad.decompress(payload, self.d, bucket_size=self.bucket_size)


@dataclass(frozen=True)
class SignSGD:
    """``"signsgd"``: scaled sign of EF-signSGD (:mod:`fedsketch.compress.signsgd`)."""

    d: int
    bucket_size: int | None = None
    random_zeros: bool = False  # a fair random sign for zeros (needs a seed), for majority votes
    unbiased: ClassVar[bool] = False

    def __post_init__(self) -> None:
        check_d(self.d)
        check_bucket_size(self.bucket_size)

    def compress(self, vec: torch.Tensor, *, seed: int | None = None) -> Payload:
        zero_seed = check_seed(seed, "signsgd with random_zeros") if self.random_zeros else None
        return signsgd.compress(check_vector(vec, self.d), bucket_size=self.bucket_size, zero_seed=zero_seed)

    def decompress(self, payload: Payload, *, seed: int | None = None) -> torch.Tensor:
        return signsgd.decompress(payload, self.d, bucket_size=self.bucket_size)


COMPRESSORS: dict[str, Callable[..., Compressor]] = {
    "none": NoCompression,
    "topk": TopK,
    "random_k": RandomK,
    "gaussiank": GaussianK,
    "qsgd": QSGD,
    "terngrad": TernGrad,
    "signsgd": SignSGD,
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
