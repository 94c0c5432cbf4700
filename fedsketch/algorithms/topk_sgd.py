"""Server steps of the top-k baselines, as explicit state transitions.

FetchSGD (Rothchild et al., ICML 2020, Sec. 6) is compared with top-k methods
whose server keeps momentum ``u`` and an error accumulator ``e`` in the full
``d``-dimensional space. *True top-k* (dense uploads) is FetchSGD's Algorithm 1
with the sketch replaced by the exact vector::

    u = rho * u + g;  e = e + lr * u;  Delta = top-k(e);  e = e - Delta
    u[support(Delta)] = 0   (momentum_zeroing);  w = w - Delta

*Local top-k* and every other compressed-upload baseline average the decoded
payloads (one weighted mean, :func:`fedsketch.algorithms.aggregate.weighted_mean`) and take a plain momentum step,
``Delta = lr * u``, or, with ``download_k``, sparsify it like true top-k.
Derivations and what each variant sends back: docs/methods.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from fedsketch.compress.common import check_d, check_int


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
