"""A run's model from its config: the shapes of its parameters without any weights, or the model itself."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from fedsketch.data import registry
from fedsketch.data.run import load_data
from fedsketch.model.models import build_model
from fedsketch.settings import entry

if TYPE_CHECKING:
    from fedsketch.config import RunConfig


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
        model = build(cfg, *fixed)
    return tuple(tuple(p.shape) for p in model.parameters())


def build(cfg: RunConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """The run's model for inputs of ``input_shape`` and ``num_classes`` classes, on the current default device."""
    return build_model(cfg.model, input_shape, num_classes, seed=cfg.seed, norm=cfg.model_norm, hidden=cfg.model_hidden)
