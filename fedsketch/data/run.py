"""A run's data from its config: the dataset and partition it names, loaded once per process."""

from __future__ import annotations

from dataclasses import fields
from typing import TYPE_CHECKING

from fedsketch.data.load import load_federated
from fedsketch.data.spec import DataSpec, FederatedData

if TYPE_CHECKING:
    from fedsketch.settings.fields import Fields

SPEC_NAMES = {"root": "data_root", "alpha": "partition_alpha"}
"""The DataSpec fields whose run setting has another name; the others share theirs."""


def data_spec(cfg: Fields) -> DataSpec:
    """The dataset and partition a run uses."""
    return DataSpec(**{f.name: getattr(cfg, SPEC_NAMES.get(f.name, f.name)) for f in fields(DataSpec)})


def load_data(cfg: Fields) -> FederatedData:
    """The run's federated dataset (cached per process)."""
    return load_federated(data_spec(cfg))
