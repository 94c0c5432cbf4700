"""A data set's arrays are checked as they load: each refusal names the array, its source and the first bad index."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset, IterableDataset

from fedsketch.data.checks import DataError, as_samples, check_features, check_labels


def _features(n: int, bad: dict[int, float], shape: tuple[int, ...] = (2, 3)) -> torch.Tensor:
    x = torch.zeros(n, *shape)
    for row, value in bad.items():
        x[row].view(-1)[-1] = value  # the last entry of the sample: a check must look at every one
    return x


@pytest.mark.parametrize(
    ("bad", "first", "kind"),
    [
        ({3: math.nan}, 3, "NaN"),
        ({1: math.inf, 4: math.nan}, 1, "an infinite value"),
        ({0: -math.inf}, 0, "an infinite value"),
        ({2: math.nan, 5: math.nan, 6: math.inf}, 2, "NaN"),
    ],
)
def test_a_sample_that_is_not_finite_is_named_with_its_kind_and_the_count(
    bad: dict[int, float], first: int, kind: str
) -> None:
    with pytest.raises(DataError) as caught:
        check_features(_features(8, bad), "x_train", "mylab:load")
    assert str(caught.value) == (
        f"x_train of mylab:load: sample {first} holds {kind} ({len(bad)} of 8 samples are not finite as float32); "
        "clean or drop them before training"
    )


def test_finite_or_empty_features_pass() -> None:
    check_features(_features(5, {}), "x", "s")
    check_features(torch.full((3, 4), 3.0e38), "x", "s")
    check_features(torch.zeros(0, 2, 3), "x", "s")
    check_features(torch.zeros(4, 0), "x", "s")  # samples of no features: nothing is not finite


@pytest.mark.parametrize(("labels", "first", "outside"), [([0, 3, 1, -1], 1, 2), ([5, 0, 7], 0, 2), ([0, 1, 4], 2, 1)])
@pytest.mark.parametrize("declared", [True, False])
def test_a_label_outside_the_classes_is_named_with_its_index_and_where_the_count_came_from(
    labels: list[int], first: int, outside: int, declared: bool
) -> None:
    origin = "the setting 'num-classes'" if declared else "the data set"
    with pytest.raises(DataError) as caught:
        check_labels(torch.tensor(labels), "y_test", "file.npz", 3, declared)
    assert str(caught.value) == (
        f"y_test of file.npz: label {labels[first]} at index {first} is outside [0, 3) "
        f"(3 classes, from {origin}; {outside} labels outside)"
    )


def test_labels_from_zero_to_the_last_class_pass() -> None:
    check_labels(torch.tensor([0, 1, 2, 2, 0]), "y", "s", 3, True)
    check_labels(torch.zeros(0, dtype=torch.int64), "y", "s", 3, False)


class _Pairs(Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.int64]:
        return np.full((2,), i, dtype=np.float64), np.int64(i % 2)


class _Stream(IterableDataset):
    def __iter__(self):  # type: ignore[no-untyped-def]
        yield from ()


@pytest.mark.parametrize(
    ("x", "y"),
    [
        (np.arange(6, dtype=np.float64).reshape(3, 2), np.array([0, 1, 1], dtype=np.int32)),
        (torch.arange(6).reshape(3, 2), torch.tensor([0, 1, 1], dtype=torch.uint8)),
        ([[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]], [0, 1, 1]),
        (_Pairs(3), None),
    ],
)
def test_arrays_tensors_lists_and_datasets_become_float32_samples_and_int64_labels(x: object, y: object) -> None:
    xt, yt = as_samples(x, y, "train", "src")
    assert xt.dtype == torch.float32 and yt.dtype == torch.int64
    assert xt.shape == (3, 2) and yt.shape == (3,)
    if isinstance(x, _Pairs):
        assert xt[:, 0].tolist() == [0.0, 1.0, 2.0] and yt.tolist() == [0, 1, 0]
    else:
        assert xt.flatten().tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0] and yt.tolist() == [0, 1, 1]


@pytest.mark.parametrize(
    ("x", "y", "split", "message"),
    [
        (
            _Pairs(2),
            np.zeros(2),
            "train",
            "src: labels come from the train Dataset's (sample, label) pairs; pass no y_train",
        ),
        (_Stream(), None, "test", "src: the test Dataset has no length (an IterableDataset?); pass a map-style one"),
        (_Pairs(0), None, "train", "src: the train Dataset is empty"),
        (np.array([["a"], ["b"]]), np.zeros(2, dtype=int), "train", "x_train of src must hold real numbers; got <U1"),
        (np.zeros((2, 1)), np.array(["a", "b"]), "test", "y_test of src must hold integer labels; got <U1"),
        ([["a"], ["b"]], [0, 1], "train", "x_train of src must hold real numbers; got <U1"),  # a list, as an array
        (
            np.zeros((2, 4), dtype=np.uint8),
            np.zeros(2, dtype=int),
            "train",
            (
                "x_train of src is uint8: scale it to float32 first (x / 255, then standardize per channel; "
                "fedsketch.data.normalize does both for the image sets it ships)"
            ),
        ),
        (np.zeros((2, 1)), np.zeros(2), "train", "y_train of src must hold integer labels; got torch.float64"),
        (np.zeros((2, 1)), np.zeros(2, dtype=bool), "train", "y_train of src must hold integer labels; got torch.bool"),
        (
            np.zeros((2, 1)),
            np.zeros(2, dtype=np.complex64),
            "test",
            "y_test of src must hold integer labels; got complex64",
        ),
        (
            torch.zeros(2, 1),
            torch.zeros(2, dtype=torch.complex64),
            "test",
            "y_test of src must hold integer labels; got torch.complex64",
        ),
        (
            np.zeros((3, 1)),
            np.zeros(2, dtype=int),
            "train",
            "src: expected x_train (N, ...) and y_train (N,); got (3, 1) and (2,)",
        ),
        (
            np.zeros(3),
            np.zeros(3, dtype=int),
            "train",
            "src: expected x_train (N, ...) and y_train (N,); got (3,) and (3,)",
        ),
        (
            np.zeros((3, 1)),
            np.zeros((3, 1), dtype=int),
            "test",
            "src: expected x_test (N, ...) and y_test (N,); got (3, 1) and (3, 1)",
        ),
        (
            np.zeros((0, 2)),
            np.zeros(0, dtype=int),
            "train",
            "x_train and y_train of src are empty (0 samples): they are what the clients train on",
        ),
        (
            np.zeros((0, 2)),
            np.zeros(0, dtype=int),
            "test",
            "x_test and y_test of src are empty (0 samples): they are what the server evaluates on",
        ),
    ],
)
def test_what_cannot_be_trained_on_is_refused_naming_the_array_and_source(
    x: object, y: object, split: str, message: str
) -> None:
    with pytest.raises(ValueError) as caught:
        as_samples(x, y, split, "src")
    assert str(caught.value) == message
