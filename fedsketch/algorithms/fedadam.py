"""FedAdam: the server applies Adam to the mean client update.

Reddi, Charles, Zaheer, Garrett, Rush, Konecny, Kumar and McMahan, "Adaptive
Federated Optimization", ICLR 2021, Algorithm 2 (FedOpt with ServerOpt = Adam).
With ``g`` the weighted mean of the round's updates (fedsketch's sign: the
model moves by ``w -= Delta``)::

    m = beta1 m + (1 - beta1) g;   v = beta2 v + (1 - beta2) g^2
    Delta = lr m / (sqrt(v) + tau)

No bias correction, as in the paper; ``tau`` bounds the adaptivity.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class AdamState:
    """The first and second moments ``m`` and ``v`` (length ``d`` each)."""

    m: torch.Tensor
    v: torch.Tensor


def init(d: int, device: torch.device | str | None = None) -> AdamState:
    """Zero moments."""
    return AdamState(torch.zeros(d, device=device), torch.zeros(d, device=device))


def step(
    state: AdamState, g: torch.Tensor, lr: float, beta1: float, beta2: float, tau: float
) -> tuple[AdamState, torch.Tensor]:
    """One server step; returns the new moments and ``Delta`` to subtract from ``w``.

    Raises
    ------
    ValueError
        If ``g`` does not have the moments' shape.
    """
    if g.shape != state.m.shape:
        raise ValueError(f"update has shape {tuple(g.shape)}; expected {tuple(state.m.shape)}")
    m = beta1 * state.m + (1 - beta1) * g
    v = beta2 * state.v + (1 - beta2) * g * g
    return AdamState(m, v), lr * m / (v.sqrt() + tau)
