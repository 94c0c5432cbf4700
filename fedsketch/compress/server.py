"""Server steps of the top-k baselines, as explicit state transitions.

FetchSGD (Rothchild et al., ICML 2020, Sec. 6) is compared with two top-k
methods whose server keeps momentum ``u`` and, when it sparsifies, an error
accumulator ``e`` in the full ``d``-dimensional space:

*true top-k* (clients upload dense updates; ``k`` required)::

    u = rho * u + g                  g = weighted mean of the client updates
    e = e + lr * u                   (error accumulation)
    Delta = top-k(e);  e = e - Delta
    u[support(Delta)] = 0            (``momentum_zeroing``, as FetchSGD does)
    w = w - Delta

This is FetchSGD's Algorithm 1 with the sketch replaced by the exact vector,
i.e. what FetchSGD approximates. Error accumulation makes the step conserve
mass: ``sum(Delta) + e == sum(lr * u)`` over rounds.

*local top-k* (clients upload their own top-k, with client-side error feedback
if they keep state): ``g`` is the weighted mean of the decoded sparse updates
(:func:`weighted_mean_sparse`). Without ``download_k`` the step is plain
momentum SGD, ``Delta = lr * u`` (the download is the union of the clients'
supports); with ``download_k`` the update sent back is sparsified like true
top-k's. The same step serves every other compressed-upload baseline (random-k,
Gaussian-k, QSGD, TernGrad, signSGD): average the decompressed payloads, then step.

The FetchSGD paper zeroes momentum at Delta's support (its Algorithm 1, line
"u, e zeroed at support"); ``momentum_zeroing=False`` keeps plain heavy-ball
momentum instead. It only has an effect when the step sparsifies.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from fedsketch.compress.common import Payload, check_d, check_int
from fedsketch.compress.sparse import decode_sparse_pairs


@dataclass(frozen=True)
class TopkServerParams:
    """Hyper-parameters fixed for a whole run; checked on construction.

    ``k`` is the number of coordinates in each model update, or ``None`` for no
    sparsification on the server (local top-k without download compression).
    """

    d: int
    k: int | None
    momentum: float = 0.9
    momentum_zeroing: bool = True

    def __post_init__(self) -> None:
        check_d(self.d)
        if self.k is not None:
            check_int("k", self.k, 1, self.d)
        if not 0.0 <= self.momentum < 1.0:
            raise ValueError(f"momentum must be in [0, 1); got {self.momentum}")


def true_topk(d: int, k: int, *, momentum: float = 0.9, momentum_zeroing: bool = True) -> TopkServerParams:
    """Parameters of the true top-k server (dense uploads, top-k of the accumulated error)."""
    return TopkServerParams(
        d=d,
        k=check_int("k", k, 1, d),
        momentum=momentum,
        momentum_zeroing=momentum_zeroing,
    )


def local_topk(
    d: int,
    *,
    download_k: int | None = None,
    momentum: float = 0.9,
    momentum_zeroing: bool = True,
) -> TopkServerParams:
    """Parameters of the local top-k server; ``download_k`` sparsifies the model update."""
    return TopkServerParams(d=d, k=download_k, momentum=momentum, momentum_zeroing=momentum_zeroing)


@dataclass(frozen=True)
class TopkServerState:
    """Server memory between rounds, both of length ``d``."""

    # u, the heavy-ball velocity
    momentum: torch.Tensor
    # e, accumulated but not yet applied (stays zero when k is None)
    error: torch.Tensor


def init(params: TopkServerParams, device: torch.device | str | None = None) -> TopkServerState:
    """Zero momentum and error."""
    zeros = torch.zeros(params.d, dtype=torch.float32, device=device)
    return TopkServerState(momentum=zeros, error=zeros.clone())


def step(
    state: TopkServerState,
    mean_update: torch.Tensor,
    params: TopkServerParams,
    lr: float,
) -> tuple[TopkServerState, torch.Tensor]:
    """One server round; returns the new state and the dense ``Delta`` to subtract from ``w``.

    Parameters
    ----------
    state
        Momentum and error from the previous round (not modified).
    mean_update
        ``g``, the weighted mean of this round's (decoded) client updates.
    params
        The run's hyper-parameters.
    lr
        This round's learning rate (schedules are the caller's business).
    """
    if mean_update.shape != (params.d,) or state.momentum.shape != (params.d,):
        raise ValueError(
            f"update has shape {tuple(mean_update.shape)} and state {tuple(state.momentum.shape)}; "
            f"expected ({params.d},)"
        )
    if not math.isfinite(lr) or lr < 0:
        raise ValueError(f"lr must be finite and >= 0; got {lr}")
    velocity = params.momentum * state.momentum + mean_update.to(state.momentum)
    if params.k is None:
        return TopkServerState(momentum=velocity, error=state.error), lr * velocity
    error = state.error + lr * velocity
    support = torch.topk(error.abs(), params.k, sorted=False).indices
    delta = torch.zeros_like(error)
    delta[support] = error[support]
    error[support] = 0.0  # == error - delta, exactly: x - x is 0 in floating point
    if params.momentum_zeroing:
        velocity[support] = 0.0
    return TopkServerState(momentum=velocity, error=error), delta


def weighted_mean(updates: Sequence[torch.Tensor], weights: Sequence[float]) -> torch.Tensor:
    """``sum_i w_i x_i / sum_i w_i`` of dense client updates (e.g. by example counts)."""
    norm = _normalized(weights, len(updates))
    out = torch.zeros_like(updates[0], dtype=torch.float32)
    for x, w in zip(updates, norm):
        if x.shape != out.shape:
            raise ValueError(f"updates have shapes {tuple(out.shape)} and {tuple(x.shape)}")
        out.add_(x.to(out), alpha=w)
    return out


def weighted_mean_sparse(payloads: Sequence[Payload], weights: Sequence[float], d: int) -> torch.Tensor:
    """Weighted mean of sparse payloads without densifying each one (O(sum of k) work)."""
    norm = _normalized(weights, len(payloads))
    out = torch.zeros(check_d(d), dtype=torch.float32)
    for payload, w in zip(payloads, norm):
        idx, val = decode_sparse_pairs(payload, d)
        out.index_add_(0, idx, val, alpha=w)
    return out


def _normalized(weights: Sequence[float], n: int) -> list[float]:
    """Weights divided by their sum, after checking there is one per update."""
    if n == 0 or len(weights) != n:
        raise ValueError(f"need one weight per update and at least one update; got {len(weights)} and {n}")
    if any(not math.isfinite(w) or w < 0 for w in weights) or sum(weights) <= 0:
        raise ValueError(f"weights must be finite, >= 0 and not all zero; got {list(weights)}")
    total = float(sum(weights))
    return [float(w) / total for w in weights]
