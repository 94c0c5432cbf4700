"""From a run config to the concrete pieces: data, model, local training spec.

Both the server (for evaluation) and every client call these; data and models
are built once per process (``load_federated`` caches), never per client call.
"""

from __future__ import annotations

from dataclasses import fields
from typing import TYPE_CHECKING

import torch
from torch import nn

from fedsketch import device, entry
from fedsketch.data import DataSpec, FederatedData, load_federated, registry
from fedsketch.local import LocalSpec
from fedsketch.models import build_model

if TYPE_CHECKING:  # a method's module calls these (PowerSGD's layout), and the config imports every method
    from fedsketch.config import RunConfig

SPEC_NAMES = {"root": "data_root", "alpha": "partition_alpha"}
"""The DataSpec fields whose run setting has another name; the others share theirs."""


def data_spec(cfg: RunConfig) -> DataSpec:
    """The dataset and partition a run uses."""
    return DataSpec(**{f.name: getattr(cfg, SPEC_NAMES.get(f.name, f.name)) for f in fields(DataSpec)})


def fixed_input(cfg: RunConfig) -> tuple[tuple[int, ...], int] | None:
    """The input shape and class count the run's model follows from its settings alone (a built-in model
    on a data set of fixed shape, :mod:`fedsketch.data.registry`); ``None`` when only the data can say."""
    info = registry.DATASETS.get(cfg.dataset)
    if info is None or info.input_shape is None or info.num_classes is None or entry.is_reference(cfg.model):
        return None
    return info.input_shape, info.num_classes


def model_shapes(cfg: RunConfig) -> tuple[tuple[int, ...], ...]:
    """The shapes of the run's model parameters, in order, with no weights made (the model is built on
    the meta device) and no data read where :func:`fixed_input` knows the input; else from the data."""
    fixed = fixed_input(cfg)
    if fixed is None:
        data = load_data(cfg)
        fixed = tuple(data.input_shape), data.num_classes
    with torch.device("meta"):
        model = _build(cfg, *fixed)
    return tuple(tuple(p.shape) for p in model.parameters())


def load_data(cfg: RunConfig) -> FederatedData:
    """The run's federated dataset (cached per process)."""
    return load_federated(data_spec(cfg))


def make_model(cfg: RunConfig, data: FederatedData) -> nn.Module:
    """The run's model, initialised deterministically from the run seed."""
    return _build(cfg, data.input_shape, data.num_classes).to(resolve_device(cfg.device))


def _build(cfg: RunConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """The run's model for inputs of ``input_shape`` and ``num_classes`` classes, on the current default device."""
    return build_model(cfg.model, input_shape, num_classes, seed=cfg.seed, norm=cfg.model_norm, hidden=cfg.model_hidden)


def local_spec(cfg: RunConfig) -> LocalSpec:
    """How clients train."""
    return LocalSpec(
        cfg.client_update, cfg.local_batch_size, cfg.local_steps, cfg.client_lr, cfg.weight_decay, cfg.client_momentum
    )


def resolve_device(name: str) -> torch.device:
    """``auto`` picks CUDA when present; asking for a CUDA device this process does not see is an error
    (:func:`fedsketch.device.resolve`)."""
    return device.resolve(name)
