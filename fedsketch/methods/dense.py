"""The uncompressed references: clients upload their dense update.

``fedavg``: the server averages the updates by examples and applies momentum
SGD (:mod:`fedsketch.algorithms.momentum_sgd`); with ``momentum = 0``, ``lr = 1``
and ``client-update = "delta"`` this is FedAvg (McMahan et al., AISTATS 2017)
and matches Flower's own FedAvg. ``true_topk`` (Rothchild et al., ICML 2020,
Sec. 6): the server takes the top-k of its momentum-accumulated mean with error
feedback (:func:`fedsketch.algorithms.topk_sgd.step`), FetchSGD's Algorithm 1 with
the exact vector in place of the sketch: the upper bound of what sketching can do.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from fedsketch.algorithms import momentum_sgd
from fedsketch.algorithms import topk_sgd as server
from fedsketch.algorithms.aggregate import weighted_mean
from fedsketch.compress import identity
from fedsketch.methods.method import (
    Client,
    ClientJob,
    Method,
    Payload,
    PayloadSpec,
    Round,
    Server,
    State,
    Wire,
)
from fedsketch.settings.declared import DECLARATIONS

if TYPE_CHECKING:
    from fedsketch.config import RunConfig


def encode(update: torch.Tensor, job: ClientJob, cfg: RunConfig) -> tuple[Payload, State]:
    """The float32 vector itself; no state."""
    return identity.compress(update), {}


def layout(cfg: RunConfig, d: int, server_round: int = 0) -> PayloadSpec:
    """One dense float32 vector."""
    return {"update": ((d,), np.dtype(np.float32))}


def mean_update(rnd: Round) -> torch.Tensor:
    """The example-weighted mean of the round's dense updates."""
    like = torch.zeros(rnd.d, device=rnd.device)
    return weighted_mean([u.payload["update"] for u in rnd.updates], [u.num_examples for u in rnd.updates], like)


def fedavg_init(cfg: RunConfig, d: int, device: torch.device) -> momentum_sgd.MomentumState:
    """Zero velocity."""
    return momentum_sgd.init(d, device=device)


def fedavg_step(
    state: momentum_sgd.MomentumState, rnd: Round, cfg: RunConfig
) -> tuple[momentum_sgd.MomentumState, torch.Tensor]:
    """Weighted mean of the updates, then momentum SGD."""
    return momentum_sgd.step(state, mean_update(rnd), rnd.lr, cfg.momentum)


def _topk_params(cfg: RunConfig, d: int) -> server.TopkServerParams:
    return server.true_topk(d, cfg.k, momentum=cfg.momentum, momentum_zeroing=cfg.momentum_zeroing)


def topk_init(cfg: RunConfig, d: int, device: torch.device) -> server.TopkServerState:
    """Zero momentum and error, both dense."""
    return server.init(_topk_params(cfg, d), device=device)


def topk_step(state: server.TopkServerState, rnd: Round, cfg: RunConfig) -> tuple[server.TopkServerState, torch.Tensor]:
    """Weighted mean of the dense updates, then the top-k step with error accumulation."""
    return server.step(state, mean_update(rnd), _topk_params(cfg, rnd.d), rnd.lr)


FEDAVG = Method(DECLARATIONS["fedavg"], Client(encode), Server(fedavg_init, fedavg_step), Wire(layout))
TRUE_TOPK = Method(DECLARATIONS["true_topk"], Client(encode), Server(topk_init, topk_step), Wire(layout))

METHODS = (FEDAVG, TRUE_TOPK)
