"""One logical client's upload, judged as the server judges it, and a cohort's linear uploads merged.

The server accepts an upload only if its arrays have the method's exact layout and every float is
finite and below :data:`MAX_ABS` (``strategies/replies.py``). A simulated node that runs a cohort of
logical clients may instead merge their uploads before it replies (``merge-uploads``): it judges each
client's upload with the same checks (:func:`check_upload`), clips it as the server would
(``clip-norm``, :func:`clip_payload`), and sends one example-weighted mean (:func:`merge`) beside each
client's metrics and billed bytes. The server's mean of the nodes' means, weighted by their example
counts, is the mean of the clients' uploads (FetchSGD's tables are linear, Rothchild et al., ICML 2020),
up to the order of float additions; what it saves: docs/simulation.md, "Merged uploads" and "On one H200".
"""

from __future__ import annotations

import math
import statistics
import warnings
from typing import TYPE_CHECKING

import numpy as np
import torch

from fedsketch.algorithms.aggregate import weighted_mean
from fedsketch.methods import get_method
from fedsketch.methods.method import ClientUpdate, Payload, PayloadSpec

if TYPE_CHECKING:
    from fedsketch.config import RunConfig

MAX_ABS = 1e20
"""No float a client sends may exceed this in magnitude. Training that produces such values has diverged
already; below it, a round's sum over clients and its accumulation over rounds stay far from float32's
3.4e38, so admitted values can never overflow the server's state."""
TORCH_FLOATS = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))

warnings.filterwarnings("ignore", "The given NumPy array is not writable", UserWarning, __name__)
"""A reply's arrays are read-only views of its bytes (``strategies/limits.py``), which :func:`check_values` only
reads: torch's warning that a tensor made from one could write to it is noise here."""


def check_values(name: str, arr: np.ndarray, max_abs: float = MAX_ABS) -> None:
    """Reject a float array holding NaN, Inf or a value beyond ``+-max_abs``.

    Its minimum and maximum say it all without a temporary array: either is NaN when any value is,
    infinite when any value is and none is NaN, and ``max(|min|, |max|)`` is the largest magnitude
    otherwise. torch finds both in one pass, on all of its threads (numpy: two passes, on one).
    """
    if arr.dtype.kind != "f" or not arr.size:
        return
    if arr.dtype in TORCH_FLOATS:
        low, high = torch.aminmax(torch.from_numpy(arr))
    else:  # float128, say: torch has no such type
        low, high = arr.min(), arr.max()
    largest = max(abs(float(low)), abs(float(high)))
    if not math.isfinite(largest):
        raise ValueError(f"array '{name}' has NaN or Inf")
    if largest > max_abs:
        raise ValueError(f"array '{name}' has a value beyond +-{max_abs:g}")


def check_layout(payload: Payload, spec: PayloadSpec) -> None:
    """Reject a payload whose arrays are not exactly ``spec``'s names, shapes and dtypes."""
    if set(payload) != set(spec):
        raise ValueError(f"payload arrays {sorted(payload)[:8]} != expected {sorted(spec)}")
    for name, (shape, dtype) in spec.items():
        arr = payload[name]
        if arr.shape != shape or arr.dtype != dtype:
            raise ValueError(f"array '{name}' is {arr.dtype}{list(arr.shape)[:8]}; expected {dtype}{list(shape)}")


def check_upload(payload: Payload, spec: PayloadSpec) -> None:
    """The server's checks of one upload of a fixed layout: the layout, then every float array's values."""
    check_layout(payload, spec)
    for name, arr in payload.items():
        check_values(name, arr)


def clip_payload(payload: Payload, factor: float) -> Payload:
    """Every float array times ``factor``, in its own dtype (``clip-norm``'s scaling, wherever it is done)."""
    return {
        name: (arr * np.float32(factor)).astype(arr.dtype) if arr.dtype.kind == "f" else arr
        for name, arr in payload.items()
    }


def beyond_bound(norms: list[float], bound: float) -> list[bool]:
    """Which uploads' norms exceed ``bound`` times the median of ``norms`` (``norm-bound``; all False when it is 0).

    A norm bound keeps one client's upload from outweighing the rest (norm bounding, Sun et al., "Can You
    Really Backdoor Federated Learning?", 2019), set relative to the round's median, a robust reference
    (Yin et al., "Byzantine-Robust Distributed Learning", ICML 2018), so that it needs no scale of its own.
    """
    ordered = sorted(norms)
    if bound <= 0 or not ordered:
        return [False] * len(norms)
    mid = len(ordered) // 2
    median = ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
    return [median > 0 and n > bound * median for n in norms]


def set_aside(
    cfg: RunConfig, d: int, updates: list[ClientUpdate], judged: str = "the round's"
) -> tuple[list[ClientUpdate], dict[int, str]]:
    """The updates within ``norm-bound`` times the median norm of ``updates``, and why each other one is set aside.

    Set aside, not scaled: a client that keeps error feedback (local top-k) would otherwise be out of step
    with what the server applied; its new state is simply not committed. Not applied under client-level DP
    (``clip-norm`` bounds each update there, and which clients count must not depend on the others' data),
    nor for methods whose upload has no norm the server can read (two exchanges).
    """
    norm_of = get_method(cfg.strategy).privacy.norm
    if cfg.norm_bound <= 0 or norm_of is None or cfg.dp_noise_multiplier > 0 or len(updates) < 2:
        return updates, {}
    norms = [norm_of(u, cfg, d) for u in updates]
    median = statistics.median(norms)
    aside = {
        u.cid: f"upload norm {n:.3g} is beyond norm-bound {cfg.norm_bound:g} x {judged} median {median:.3g}"
        for u, n, out in zip(updates, norms, beyond_bound(norms, cfg.norm_bound), strict=True)
        if out
    }
    return [u for u in updates if u.cid not in aside], aside


def mergeable(cfg: RunConfig) -> bool:
    """Whether a node may merge its cohort's uploads in this run: ``merge-uploads`` is on and nothing needs
    each client's own upload on the server.

    That rules out methods whose uploads do not add up or have no fixed layout, clients with state
    (their new state waits for the server to apply their own upload), two-exchange methods (the server
    asks each client again), ``diagnose-sketch`` (each client's dense update), client-level DP (equal
    weights and noise on the sum of single clients) and secure aggregation (its own sums).
    """
    method = get_method(cfg.strategy)
    return (
        cfg.merge_uploads
        and method.linear
        and isinstance(method.wire.layout(cfg, 1, 0), dict)
        and method.client.state_vectors(cfg) == 0
        and method.server.ask is None
        and not cfg.diagnose_sketch
        and cfg.dp_noise_multiplier == 0
        and not cfg.secure_aggregation
    )


def merge(payloads: list[Payload], weights: list[int], spec: PayloadSpec, device: torch.device) -> Payload:
    """The ``weights``-weighted mean of ``payloads``, array by array, added on ``device`` in the order given and
    returned in each array's dtype (:func:`fedsketch.algorithms.aggregate.weighted_mean`, the server's own mean)."""
    out = {}
    for name, (shape, dtype) in spec.items():
        like = torch.zeros(shape, dtype=torch.from_numpy(np.zeros(0, dtype)).dtype, device=device)
        out[name] = weighted_mean([p[name] for p in payloads], weights, like=like).cpu().numpy()
    return out
