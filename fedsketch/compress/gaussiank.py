"""Gaussian-k: approximate top-k by a threshold from a Gaussian fit.

Shi, Chu, Cheung and See, "Understanding Top-k Sparsification in Distributed
Deep Learning", 2019 (arXiv:1911.08772), Sec. 5. Fit ``N(mu, sigma)`` to the
vector and keep the coordinates above ``t = |mu| + sigma * Phi^{-1}(1 - k / (2 d))``
(``|mu|``, not the authors' ``mu``, so that ``x`` and ``-x`` select alike); while
the count is outside ``[2k/3, 4k/3]``, correct ``t`` for at most ``max_rounds``
thresholds by one of two named rules: ``"paper"`` (default, the authors' code:
halve ``t`` or multiply it by 1.5) or ``"interpolate"`` (interpolate
``log(count)`` to ``log(k)`` once ``t`` is bracketed). ``cap=True`` then keeps
the ``k`` largest selected. Biased like top-k: use it under error feedback.
How close to ``k`` each rule lands, and its speed: docs/methods.md.

Payload: a sparse payload (:mod:`fedsketch.compress.sparse`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import torch

from fedsketch.compress.common import Payload, check_d, check_int, check_vector
from fedsketch.compress.sparse import decode_sparse, encode_sparse

LOW, HIGH = 2.0 / 3.0, 4.0 / 3.0
"""Accepted count window, as fractions of k (the authors' code)."""
SHRINK, GROW = 0.5, 1.5
"""Threshold factors when too few / too many are selected (the authors' code)."""
ADJUST_RULES = ("paper", "interpolate")


@dataclass(frozen=True)
class Selection:
    """The coordinates a threshold selected.

    ``indices`` are int64 in increasing order and ``values = vec[indices]``;
    ``threshold`` is the last one evaluated and ``rounds`` how many were.
    """

    indices: torch.Tensor
    values: torch.Tensor
    threshold: float
    rounds: int

    @property
    def count(self) -> int:
        """How many coordinates were selected (compare with ``k``)."""
        return int(self.indices.numel())


def initial_threshold(vec: torch.Tensor, k: int) -> float:
    """``|mu| + sigma * Phi^{-1}(1 - k / (2 d))`` for the vector's mean and std."""
    vec = check_vector(vec)
    d = vec.numel()
    k = check_int("k", k, 1, d)
    std, mean = torch.std_mean(vec, correction=0)
    z = NormalDist().inv_cdf(1.0 - k / (2.0 * d))
    return abs(float(mean)) + z * float(std)


def select(vec: torch.Tensor, k: int, *, max_rounds: int = 3, adjust: str = "paper") -> Selection:
    """Threshold selection of about ``k`` coordinates of ``vec`` (see the module docstring).

    Raises
    ------
    ValueError
        If ``k`` is not in ``[1, len(vec)]``, ``max_rounds < 1`` or ``adjust`` is unknown.
    """
    vec = check_vector(vec)
    max_rounds = check_int("max_rounds", max_rounds, 1)
    if adjust not in ADJUST_RULES:
        raise ValueError(f"adjust must be one of {ADJUST_RULES}; got {adjust!r}")
    threshold = initial_threshold(vec, k)
    magnitude = vec.abs()
    tried: list[tuple[float, int]] = []
    for rounds in range(1, max_rounds + 1):
        mask = magnitude > threshold
        count = int(mask.sum())
        tried.append((threshold, count))
        if LOW * k <= count <= HIGH * k or rounds == max_rounds:
            break
        threshold = _next_threshold(tried, k, adjust)
    indices = torch.nonzero(mask).reshape(-1)
    return Selection(indices=indices, values=vec[indices], threshold=threshold, rounds=rounds)


def encode(selection: Selection, k: int, d: int, *, cap: bool = True, varint: bool = False) -> Payload:
    """Sparse payload of a selection; ``cap`` keeps only its ``k`` largest coordinates."""
    indices, values = selection.indices, selection.values
    if cap and selection.count > k:
        keep = torch.topk(values.abs(), k, sorted=False).indices
        indices, values = indices[keep], values[keep]
    return encode_sparse(indices, values, d, varint=varint)


def compress(
    vec: torch.Tensor,
    *,
    k: int,
    max_rounds: int = 3,
    adjust: str = "paper",
    cap: bool = True,
    varint: bool = False,
) -> Payload:
    """``encode(select(vec, k, ...))``; call the two yourself to also log ``Selection.count``."""
    sel = select(vec, k, max_rounds=max_rounds, adjust=adjust)
    return encode(sel, k, vec.numel(), cap=cap, varint=varint)


def decompress(payload: Payload, d: int) -> torch.Tensor:
    """The dense float32 vector (zeros off the support)."""
    return decode_sparse(payload, check_d(d))


def _next_threshold(tried: list[tuple[float, int]], k: int, adjust: str) -> float:
    """The next threshold to try, given the ``(threshold, count)`` pairs so far."""
    threshold, count = tried[-1]
    too_low = [t for t in tried if t[1] > HIGH * k]  # thresholds that selected too many
    too_high = [t for t in tried if t[1] < LOW * k]
    if adjust == "interpolate" and too_low and too_high:
        t_a, c_a = max(too_low)
        t_b, c_b = min(too_high)
        if c_b == 0:
            return 0.5 * (t_a + t_b)
        # log(count) linear in t between the bracketing pairs; c_a > c_b > 0.
        return t_a + (math.log(k) - math.log(c_a)) * (t_b - t_a) / (math.log(c_b) - math.log(c_a))
    return threshold * (SHRINK if count < LOW * k else GROW)
