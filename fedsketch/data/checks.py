"""Checks of a data set's arrays, each refusal naming the array, its source and the first offending index.

:func:`as_samples` takes what a user hands over (arrays, tensors, a Dataset of pairs) to float32 samples
and int64 labels, refusing what cannot be (strings, uint8 images not yet scaled, shapes that do not pair up,
an empty split).

Run on every data set as it is loaded (:func:`fedsketch.data.from_arrays`), so
the command refuses bad data before any Flower process starts, and a Flower
process never trains on it: a NaN feature would otherwise make every client
that holds it send a non-finite update, rejected round after round as the
client's fault.
"""

from __future__ import annotations

from collections.abc import Sized
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset


class DataError(ValueError):
    """A data set's arrays cannot be trained on: non-finite features or labels outside the classes."""


def check_features(x: torch.Tensor, array: str, source: str) -> None:
    """Refuse NaN or infinite features (after the cast to float32, so overflowing values count too).

    Raises
    ------
    DataError
        Naming ``array`` of ``source``, the first sample holding one and how many there are.
    """
    bad = ~torch.isfinite(x.reshape(x.shape[0], -1)).all(dim=1) if x.numel() else torch.zeros(0, dtype=torch.bool)
    if bool(bad.any()):
        rows = torch.nonzero(bad).flatten()
        first = int(rows[0])
        kind = "NaN" if bool(torch.isnan(x[first]).any()) else "an infinite value"
        raise DataError(
            f"{array} of {source}: sample {first} holds {kind} ({rows.numel()} of {x.shape[0]} samples are not "
            "finite as float32); clean or drop them before training"
        )


def check_labels(y: torch.Tensor, array: str, source: str, num_classes: int, declared: bool) -> None:
    """Refuse labels outside ``[0, num_classes)``.

    Raises
    ------
    DataError
        Naming ``array`` of ``source``, the first offending index and label, and where the class count came from.
    """
    bad = (y < 0) | (y >= num_classes)
    if bool(bad.any()):
        first = int(torch.nonzero(bad).flatten()[0])
        origin = "the setting 'num-classes'" if declared else "the data set"
        raise DataError(
            f"{array} of {source}: label {int(y[first])} at index {first} is outside [0, {num_classes}) "
            f"({num_classes} classes, from {origin}; {int(bad.sum())} labels outside)"
        )


def as_samples(x: Any, y: Any, split: str, source: str) -> tuple[torch.Tensor, torch.Tensor]:
    """One split's samples and labels as float32 and int64 tensors: arrays, tensors, or a map-style Dataset of pairs.

    Raises
    ------
    ValueError
        Naming ``x_{split}`` or ``y_{split}`` of ``source``: samples that are not real numbers (strings,
        objects, uint8 images not yet scaled), labels that are not integers, shapes that do not pair up, or
        no samples at all.
    """
    if isinstance(x, Dataset):
        if y is not None:
            raise ValueError(
                f"{source}: labels come from the {split} Dataset's (sample, label) pairs; pass no y_{split}"
            )
        if not isinstance(x, Sized):  # bad data is a ValueError, reported in one line
            raise ValueError(  # noqa: TRY004
                f"{source}: the {split} Dataset has no length (an IterableDataset?); pass a map-style one"
            )
        pairs = [x[i] for i in range(len(x))]
        if not pairs:
            raise ValueError(f"{source}: the {split} Dataset is empty")
        x = torch.stack([torch.as_tensor(sample) for sample, _ in pairs])
        y = torch.tensor([int(label) for _, label in pairs])
    x, y = (v if isinstance(v, torch.Tensor) else np.asarray(v) for v in (x, y))
    for name, v, wanted in ((f"x_{split}", x, "real numbers"), (f"y_{split}", y, "integer labels")):
        if isinstance(v, np.ndarray) and v.dtype.kind not in "biuf":  # strings, objects: torch cannot take them
            raise ValueError(f"{name} of {source} must hold {wanted}; got {v.dtype}")
    xt, yt = torch.as_tensor(x), torch.as_tensor(y)
    if xt.dtype == torch.uint8:
        raise ValueError(
            f"x_{split} of {source} is uint8: scale it to float32 first (x / 255, then standardize per channel; "
            "fedsketch.data.normalize does both for the image sets it ships)"
        )
    if yt.is_floating_point() or yt.is_complex() or yt.dtype == torch.bool:
        raise ValueError(f"y_{split} of {source} must hold integer labels; got {yt.dtype}")
    if yt.ndim != 1 or xt.ndim < 2 or xt.shape[0] != yt.shape[0]:
        raise ValueError(
            f"{source}: expected x_{split} (N, ...) and y_{split} (N,); got {tuple(xt.shape)} and {tuple(yt.shape)}"
        )
    if xt.shape[0] == 0:
        uses = "the clients train on" if split == "train" else "the server evaluates on"
        raise ValueError(f"x_{split} and y_{split} of {source} are empty (0 samples): they are what {uses}")
    return xt.to(torch.float32), yt.to(torch.int64)
