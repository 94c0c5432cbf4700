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
from fedsketch.methods.method import Client, Docs, Method, Privacy, Round, Server, Wire
from fedsketch.settings.setting import Setting

if TYPE_CHECKING:
    from fedsketch.config import RunConfig

BETA2 = Setting(
    "fedadam-beta2",
    float,
    0.99,
    "FedAdam's beta2, the second moment's decay (beta1 is `momentum`)",
    minimum=0.0,
    maximum=1.0,
)
TAU = Setting("fedadam-tau", float, 1e-3, "FedAdam's tau, added to sqrt(v): how adaptive the step is", minimum=1e-12)


def init(cfg: RunConfig, d: int, device: torch.device) -> fedadam.AdamState:
    """Zero moments."""
    return fedadam.init(d, device=device)


def step(state: fedadam.AdamState, rnd: Round, cfg: RunConfig) -> tuple[fedadam.AdamState, torch.Tensor]:
    """The weighted mean of the dense updates, then one Adam step."""
    return fedadam.step(state, mean_update(rnd), rnd.lr, cfg.momentum, BETA2.of(cfg), TAU.of(cfg))


METHOD = Method(
    name="fedadam",
    docs=Docs("dense float32", "none", "Reddi et al., ICLR 2021"),
    client=Client(encode),
    server=Server(init, step),
    wire=Wire(layout),
    privacy=Privacy(linear=True),
    settings=(BETA2, TAU),
    uses=("momentum",),
)
