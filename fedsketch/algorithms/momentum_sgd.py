"""Uncompressed server step: SGD with (heavy-ball) momentum on the mean update.

The uncompressed baseline of FetchSGD (Rothchild et al., ICML 2020, Sec. 5):
clients upload dense updates, the server averages them and applies momentum.
With ``momentum = 0``, ``lr = 1`` and clients that upload their model delta
after local training, this is exactly FedAvg (McMahan et al., AISTATS 2017):
``w - mean_i (w - w_i) = mean_i w_i``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class MomentumState:
    """The velocity ``u`` (length ``d``)."""

    velocity: torch.Tensor


def init(d: int, device: torch.device | str | None = None) -> MomentumState:
    """Zero velocity."""
    return MomentumState(velocity=torch.zeros(d, device=device))


def step(
    state: MomentumState, mean_update: torch.Tensor, lr: float, momentum: float
) -> tuple[MomentumState, torch.Tensor]:
    """``u = rho * u + g``; returns the new state and ``lr * u`` to subtract from ``w``."""
    if mean_update.shape != state.velocity.shape:
        raise ValueError(f"update has shape {tuple(mean_update.shape)}; expected {tuple(state.velocity.shape)}")
    velocity = momentum * state.velocity + mean_update
    return MomentumState(velocity=velocity), lr * velocity
