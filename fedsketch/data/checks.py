"""Checks of a data set's arrays, each refusal naming the array, its source and the first offending index.

Run on every data set as it is loaded (:func:`fedsketch.data.from_arrays`), so
the command refuses bad data before any Flower process starts, and a Flower
process never trains on it: a NaN feature would otherwise make every client
that holds it send a non-finite update, rejected round after round as the
client's fault.
"""

from __future__ import annotations

import torch


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
