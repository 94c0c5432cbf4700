"""From a run config to the concrete pieces a process trains with: the model on its device, the local training spec.

Both the server (for evaluation) and every client call these; data and models
are built once per process (``load_federated`` caches), never per client call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from fedsketch.data import FederatedData
from fedsketch.model.build import build
from fedsketch.settings import device
from fedsketch.training.local import LocalSpec

if TYPE_CHECKING:
    from fedsketch.config import RunConfig


def make_model(cfg: RunConfig, data: FederatedData) -> nn.Module:
    """The run's model, initialised deterministically from the run seed."""
    return build(cfg, data.input_shape, data.num_classes).to(resolve_device(cfg.device))


def local_spec(cfg: RunConfig) -> LocalSpec:
    """How clients train."""
    return LocalSpec(
        cfg.client_update, cfg.local_batch_size, cfg.local_steps, cfg.client_lr, cfg.weight_decay, cfg.client_momentum
    )


def resolve_device(name: str) -> torch.device:
    """The torch device setting ``device`` stands for in this process: ``auto`` is CUDA when present.

    Raises
    ------
    ValueError
        For a CUDA device this process does not see (:func:`fedsketch.settings.device.check`).
    """
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device.check(name, torch.cuda.device_count())
    return torch.device(name)
