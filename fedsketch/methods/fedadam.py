"""FedAdam: dense uploads, Adam on the server (Reddi et al., ICLR 2021).

Clients upload their dense update as for ``fedavg``; the server takes the
example-weighted mean and applies Adam (:mod:`fedsketch.algorithms.fedadam`),
with the run's ``momentum`` as ``beta1``. Uploads add up, so clipping, DP and
secure aggregation apply as for FedAvg.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from fedsketch.algorithms import fedadam
from fedsketch.methods.dense import encode, layout, mean_update
from fedsketch.methods.method import Client, Method, Round, Server, Wire
from fedsketch.settings.declared import DECLARATIONS

if TYPE_CHECKING:
    from fedsketch.config import RunConfig

BETA2, TAU = DECLARATIONS["fedadam"].settings


def init(cfg: RunConfig, d: int, device: torch.device) -> fedadam.AdamState:
    """Zero moments."""
    return fedadam.init(d, device=device)


def step(state: fedadam.AdamState, rnd: Round, cfg: RunConfig) -> tuple[fedadam.AdamState, torch.Tensor]:
    """The weighted mean of the dense updates, then one Adam step."""
    return fedadam.step(state, mean_update(rnd), rnd.lr, cfg.momentum, BETA2.of(cfg), TAU.of(cfg))


METHOD = Method(DECLARATIONS["fedadam"], Client(encode), Server(init, step), Wire(layout))
