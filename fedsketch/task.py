"""From a run config to the concrete pieces: data, model, local training spec.

Both the server (for evaluation) and every client call these; data and models
are built once per process (``load_federated`` caches), never per client call.
"""

from __future__ import annotations

from dataclasses import fields
from typing import TYPE_CHECKING

import torch
from torch import nn

from fedsketch.data import DataSpec, FederatedData, load_federated
from fedsketch.local import LocalSpec
from fedsketch.models import build_model

if TYPE_CHECKING:  # a method's module calls these (PowerSGD's layout), and the config imports every method
    from fedsketch.config import RunConfig

SPEC_NAMES = {"root": "data_root", "alpha": "partition_alpha"}
"""The DataSpec fields whose run setting has another name; the others share theirs."""


def data_spec(cfg: RunConfig) -> DataSpec:
    """The dataset and partition a run uses."""
    return DataSpec(**{f.name: getattr(cfg, SPEC_NAMES.get(f.name, f.name)) for f in fields(DataSpec)})


def load_data(cfg: RunConfig) -> FederatedData:
    """The run's federated dataset (cached per process)."""
    return load_federated(data_spec(cfg))


def make_model(cfg: RunConfig, data: FederatedData) -> nn.Module:
    """The run's model, initialised deterministically from the run seed."""
    model = build_model(
        cfg.model, data.input_shape, data.num_classes, seed=cfg.seed, norm=cfg.model_norm, hidden=cfg.model_hidden
    )
    return model.to(resolve_device(cfg.device))


def local_spec(cfg: RunConfig) -> LocalSpec:
    """How clients train."""
    return LocalSpec(
        cfg.client_update, cfg.local_batch_size, cfg.local_steps, cfg.client_lr, cfg.weight_decay, cfg.client_momentum
    )


def resolve_device(name: str) -> torch.device:
    """``auto`` picks CUDA when present; asking for CUDA without one is an error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("setting 'device' is 'cuda' but no CUDA device is available")
    return torch.device(name)
