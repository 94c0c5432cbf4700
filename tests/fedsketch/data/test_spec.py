"""What a data set must be (``fedsketch/data/spec.py``): each impossible spec or split refused in one line naming it.

A loader of the user's own returns a ``FederatedData``; its checks are what stands between a wrong
array and a run that trains on it. The settings' own checks (``fedsketch/validate.py``) come first for
the command; these hold for the Python API and every loader.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from fedsketch.data.spec import DATASETS, PARTITIONS, DataSpec, FederatedData


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"dataset": "imagenet"}, f"unknown dataset 'imagenet'; choose one of {', '.join(DATASETS)}"),
        ({"partition": "random"}, f"unknown partition 'random'; choose one of {', '.join(PARTITIONS)}"),
        ({"synthetic_devices": -1}, "synthetic_devices must be >= 0 (0: one per client); got -1"),
        (
            {"synthetic_devices": 7, "num_clients": 5},
            (
                "synthetic_devices (7) differs from num_clients (5): the natural partition gives each client one device; "
                "choose another partition or set 0"
            ),
        ),
    ],
)
def test_an_impossible_spec_is_refused_in_one_line(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as refused:
        DataSpec(**fields)
    assert str(refused.value) == message


def test_a_device_count_of_its_own_goes_with_every_partition_but_the_natural_one() -> None:
    assert DataSpec(synthetic_devices=7, num_clients=5, partition="iid").synthetic_devices == 7
    assert DataSpec(synthetic_devices=5, num_clients=5).synthetic_devices == 5


def split(**changes: Any) -> dict[str, Any]:
    """A valid split of 6 samples of shape (2,) and 3 classes over two clients, with ``changes``."""
    good = {
        "train_x": torch.zeros(6, 2),
        "train_y": torch.tensor([0, 1, 2, 0, 1, 2]),
        "test_x": torch.zeros(3, 2),
        "test_y": torch.tensor([0, 1, 2]),
        "client_indices": (np.arange(3), np.arange(3, 6)),
        "num_classes": 3,
        "input_shape": (2,),
        "name": "toy",
    }
    return {**good, **changes}


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"train_x": torch.zeros(6, 2, dtype=torch.float64)},
            "train data must be float32 samples and int64 labels; got torch.float64, torch.int64",
        ),
        (
            {"test_y": torch.tensor([0, 1, 2], dtype=torch.int32)},
            "test data must be float32 samples and int64 labels; got torch.float32, torch.int32",
        ),
        ({"train_y": torch.tensor([0, 1, 2, 0, 1])}, "train has 6 samples but labels of shape (5,)"),
        ({"test_y": torch.tensor([[0], [1], [2]])}, "test has 3 samples but labels of shape (3, 1)"),
        (
            {"test_x": torch.zeros(3, 2, 1)},
            "toy: test samples have shape (2, 1); expected (2,), the training samples' shape",
        ),
        ({"train_y": torch.tensor([0, 1, 3, 0, 1, 2])}, "train labels must lie in [0, 3); got 0..3"),
        ({"test_y": torch.tensor([-1, 1, 2])}, "test labels must lie in [0, 3); got -1..2"),
        ({"client_indices": ()}, "a federated dataset needs at least one client"),
        (
            {"client_indices": (np.arange(3), np.arange(3, 6, dtype=np.int32))},
            "client 1: indices must be a 1-D int64 array; got int32, 1-D",
        ),
        (
            {"client_indices": (np.arange(6).reshape(2, 3),)},
            "client 0: indices must be a 1-D int64 array; got int64, 2-D",
        ),
        ({"client_indices": (np.arange(3), np.array([3, 6]))}, "client 1: indices must lie in [0, 6)"),
    ],
)
def test_an_impossible_split_is_refused_naming_the_split_and_what_is_wrong(
    changes: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError) as refused:
        FederatedData(**split(**changes))
    assert str(refused.value) == message


def test_a_clients_indices_are_frozen_once_the_data_holds_them() -> None:
    indices = (np.arange(3), np.arange(3, 6))
    data = FederatedData(**split(client_indices=indices))
    assert data.client_indices[1] is indices[1] and not indices[1].flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        indices[0][0] = 5
