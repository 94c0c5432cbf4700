"""Any image or tabular classification data set that Hugging Face ``datasets`` opens: ``dataset = "huggingface"``.

``data-root`` names it: a folder written by ``save_to_disk`` (how an offline
machine holds a hub data set; read with ``datasets.load_from_disk``), else
anything ``datasets.load_dataset`` takes, a hub name (``ylecun/mnist``, fetched
and cached by ``datasets`` when online) or a local folder of data files.

- Splits: clients train on ``hf-train-split``; the server evaluates on
  ``hf-test-split``, or on a held-out ``hf-test-fraction`` of the training split
  (``Dataset.train_test_split`` with the run seed) for data sets with one split.
- Labels (``hf-label``): a ``ClassLabel`` column (its names fix the classes),
  integers, or strings (classes in sorted order, as torchvision's ``ImageFolder``
  numbers its folders; a test label unseen in training is refused).
- Features (``hf-features``, comma-separated; empty: the image column if the
  data has exactly one, else every column but the label and client-id columns):
  one image column (``datasets.Image``), decoded one
  channel for grayscale and RGB otherwise, scaled to [0, 1] and standardized per
  channel; or numeric columns (numbers, booleans, fixed-length arrays of numbers),
  one sample's values side by side, standardized per feature. Both use the
  training split's mean and standard deviation. Text is not read.
- ``hf-client-id``: each sample's own client, for ``natural`` and ``flwr-natural-id``.

Any partition applies, fedsketch's or flwr-datasets' (:mod:`fedsketch.data.flwr_partition`),
and the data then goes through the checks every data set does (:func:`fedsketch.data.from_arrays`).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedsketch.data.checks import DataError
from fedsketch.data.spec import DataSpec

_SAVED = ("dataset_dict.json", "dataset_info.json", "state.json")
_GRAY = ("L", "1", "I", "I;16", "F")
_SAVE_HINT = (
    "on a machine with internet, "
    "`python -c \"from datasets import load_dataset; load_dataset('NAME').save_to_disk('FOLDER')\"`, "
    "then set the data root to FOLDER"
)


@dataclass(frozen=True)
class HFData:
    """What :func:`load` read: arrays in the contract of :func:`fedsketch.data.from_arrays`."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    client_ids: np.ndarray | None
    num_classes: int | None  # None: not fixed by the data (integer labels)
    name: str


def load(spec: DataSpec) -> HFData:
    """The splits, labels and features ``spec``'s ``hf-*`` settings name.

    Raises
    ------
    FileNotFoundError
        If ``datasets`` cannot open the data root (with how to save a copy for offline use).
    ValueError
        Naming the setting, split or column: a missing split or column, labels that are not classes,
        features that are neither one image column nor numbers, images of different sizes.
    """
    name = f"huggingface:{spec.root}"
    train, test = _splits(_open(spec.root), spec, name)
    features = _feature_columns(train, spec)
    wanted = [(spec.hf_label, "hf-label"), *((c, "hf-features") for c in features)]
    for split, label in ((train, "training"), (test, "test")):
        for column, setting in [*wanted, *([(spec.hf_client_id, "hf-client-id")] if split is train else [])]:
            if column and column not in split.column_names:
                raise ValueError(
                    f"{name}: the {label} split has no column {column!r} (setting '{setting}'); "
                    f"it has {split.column_names}"
                )
    y_train, y_test, classes = _labels(train, test, spec, name)
    if spec.num_classes and classes is not None and spec.num_classes != classes:
        raise DataError(
            f"{name}: setting 'num-classes' is {spec.num_classes} but column {spec.hf_label!r} has {classes}"
        )
    x_train, x_test = _features(train, test, features, name)
    ids = np.asarray(train.select_columns([spec.hf_client_id])[:][spec.hf_client_id]) if spec.hf_client_id else None
    return HFData(x_train, y_train, x_test, y_test, ids, classes, name)


def _open(root: str) -> Any:
    """The ``Dataset`` or ``DatasetDict`` at ``root``: a ``save_to_disk`` folder, else ``load_dataset(root)``."""
    import datasets

    if not root:
        raise FileNotFoundError(
            "huggingface: the data root is empty: set it to a folder written by save_to_disk, or a hub name"
        )
    path = Path(root).expanduser()
    if path.is_dir() and any((path / marker).is_file() for marker in _SAVED):
        try:
            return datasets.load_from_disk(str(path))
        except Exception as exc:  # noqa: BLE001  # e.g. a saved split without rows, which datasets cannot read back
            raise DataError(f"huggingface: datasets could not read the saved folder {path} ({_why(exc)})") from None
    if not path.exists() and (path.is_absolute() or root.startswith(".")):  # "~" is absolute once expanded
        raise FileNotFoundError(f"huggingface: no folder {path}; " + _SAVE_HINT)
    try:
        return datasets.load_dataset(root)
    except Exception as exc:  # noqa: BLE001  # offline, an unknown name, unreadable files: one line, and the way out
        raise FileNotFoundError(
            f"huggingface: datasets could not open {root!r} ({_why(exc)}); to work offline, " + _SAVE_HINT
        ) from None


def _why(exc: Exception) -> str:
    """An exception in one line: its type and the first 300 characters of its message."""
    return f"{type(exc).__name__}: " + " ".join(str(exc).split())[:300]


def _splits(loaded: Any, spec: DataSpec, name: str) -> tuple[Any, Any]:
    """The training and test splits (``Dataset``\\ s)."""
    import datasets

    if isinstance(loaded, datasets.DatasetDict):
        if spec.hf_train_split not in loaded:
            raise ValueError(
                f"{name}: no split {spec.hf_train_split!r} (setting 'hf-train-split'); it has {list(loaded)}"
            )
        train = loaded[spec.hf_train_split]
    elif spec.hf_test_fraction:
        train = loaded  # a saved Dataset is one split
    else:
        raise ValueError(
            f"{name} holds one split (a Dataset, not a DatasetDict): set 'hf-test-fraction' to hold out a test set"
        )
    if spec.hf_test_fraction:
        held = train.train_test_split(test_size=spec.hf_test_fraction, seed=spec.seed)
        return held["train"], held["test"]
    if spec.hf_test_split not in loaded:
        raise ValueError(
            f"{name}: no split {spec.hf_test_split!r} (setting 'hf-test-split'); it has {list(loaded)} "
            "(or hold out part of the training split: 'hf-test-fraction')"
        )
    return train, loaded[spec.hf_test_split]


def _feature_columns(train: Any, spec: DataSpec) -> list[str]:
    """The feature columns: those ``hf-features`` names; else the image column, if there is exactly one;
    else every column but the label and the client id."""
    import datasets

    if spec.hf_features:
        return [c.strip() for c in spec.hf_features.split(",") if c.strip()]
    images = [c for c, feature in train.features.items() if isinstance(feature, datasets.Image)]
    if len(images) == 1:
        return images
    return [c for c in train.column_names if c not in (spec.hf_label, spec.hf_client_id)]


def _labels(train: Any, test: Any, spec: DataSpec, name: str) -> tuple[np.ndarray, np.ndarray, int | None]:
    """Integer labels of both splits, and the classes where the column fixes them (a ``ClassLabel``, strings)."""
    import datasets

    column = spec.hf_label
    feature = train.features[column]
    y_train, y_test = (_labels_of(split, column) for split in (train, test))
    if isinstance(feature, datasets.ClassLabel):
        return y_train.astype(np.int64), y_test.astype(np.int64), feature.num_classes
    for split, y in (("training", y_train), ("test", y_test)):
        gaps = np.isnan(y) if y.dtype.kind == "f" else np.equal(y, None) if y.dtype.kind == "O" else None
        if gaps is not None and gaps.any():  # integers with a gap come as floats with NaN, strings as None
            row = int(np.flatnonzero(gaps)[0])
            raise DataError(
                f"{name}: column {column!r} (setting 'hf-label') has no label at row {row} of the {split} split"
            )
    if y_train.dtype.kind in "iu" and y_test.dtype.kind in "iu":
        return y_train.astype(np.int64), y_test.astype(np.int64), None
    if y_train.dtype.kind in "UO" and y_test.dtype.kind in "UO":
        classes = np.unique(y_train.astype(str))
        unseen = ~np.isin(y_test.astype(str), classes)
        if unseen.any():
            first = int(np.flatnonzero(unseen)[0])
            raise DataError(f"{name}: test label {str(y_test[first])!r} at index {first} is not a training label")
        return np.searchsorted(classes, y_train.astype(str)), np.searchsorted(classes, y_test.astype(str)), len(classes)
    held = (
        f"{y_train.dtype}"
        if y_train.dtype.kind == y_test.dtype.kind
        else f"{y_train.dtype} in training, {y_test.dtype} in test"
    )
    raise DataError(
        f"{name}: column {column!r} (setting 'hf-label') holds {held}; expected class labels of one kind "
        "(a ClassLabel, integers or strings)"
    )


def _features(train: Any, test: Any, columns: list[str], name: str) -> tuple[np.ndarray, np.ndarray]:
    """Float32 features of both splits, standardized with the training split's mean and std."""
    import datasets

    if not columns:
        raise ValueError(f"{name}: no feature column beside the label (setting 'hf-features')")
    images = [c for c in columns if isinstance(train.features[c], datasets.Image)]
    if images:
        if len(columns) != 1:
            raise ValueError(
                f"{name}: image column {images[0]!r} must be the only feature column (setting 'hf-features')"
            )
        x_train, x_test = _images(train, test, images[0], name)
        axes: tuple[int, ...] = (0, 2, 3)
    else:
        x_train, x_test = (_numbers(split, columns, name) for split in (train, test))
        axes = (0,)
    # Statistics of the finite values only: a NaN sample stays the one NaN sample, for the checks to name it.
    finite = np.where(np.isfinite(x_train), x_train.astype(np.float64), np.nan)
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a column without a finite value: all NaN, refused as such
        mean = np.nanmean(finite, axis=axes, keepdims=True)
        std = np.maximum(np.nanstd(finite, axis=axes, keepdims=True), 1e-8)
    return ((x_train - mean) / std).astype(np.float32), ((x_test - mean) / std).astype(np.float32)


def _images(train: Any, test: Any, column: str, name: str) -> tuple[np.ndarray, np.ndarray]:
    """Both splits' images as float32 ``(N, C, H, W)`` in [0, 1]; the first training image decides gray or RGB."""
    import datasets

    mode = "L" if train[0][column].mode in _GRAY else "RGB"
    out = []
    for split, label in ((train, "train"), (test, "test")):
        pixels = _column(split.cast_column(column, datasets.Image(mode=mode)), column)
        out.append(_stack(pixels, f"{name}: {label} images of column {column!r}") / np.float32(255.0))
    x_train, x_test = out
    if x_train.ndim == 3:
        x_train, x_test = x_train[:, None], x_test[:, None]
    else:
        x_train, x_test = x_train.transpose(0, 3, 1, 2), x_test.transpose(0, 3, 1, 2)
    if x_train.shape[1:] != x_test.shape[1:]:
        raise DataError(
            f"{name}: test images are {x_test.shape[1:]} (C, H, W); training images are {x_train.shape[1:]}"
        )
    return x_train, x_test


def _numbers(split: Any, columns: list[str], name: str) -> np.ndarray:
    """The numeric columns of one split side by side, float64 ``(N, F)`` (standardized before they become float32)."""
    table = split.select_columns(columns).with_format("numpy")[:]
    parts = []
    for column in columns:
        values = _stack(table[column], f"{name}: column {column!r}")
        if values.dtype.kind not in "biuf":
            raise DataError(
                f"{name}: column {column!r} holds {values.dtype}; features are one image column or numbers "
                "(setting 'hf-features' names them)"
            )
        parts.append(values.reshape(values.shape[0], -1).astype(np.float64))
    return np.concatenate(parts, axis=1)


def _labels_of(split: Any, column: str) -> np.ndarray:
    """A split's label column read through Arrow in one batch: integers with a gap come as floats with NaN,
    strings with a gap as objects with None."""
    values = split.select_columns([column]).with_format("arrow")[:][column].to_numpy(zero_copy_only=False)
    return values.astype(str) if values.dtype == object and all(isinstance(v, str) for v in values) else values


def _column(split: Any, column: str) -> Any:
    """One column of a split as numpy makes it, read in one batch, not row by row (docs/huggingface.md)."""
    return split.select_columns([column]).with_format("numpy")[:][column]


def _stack(values: Any, what: str) -> np.ndarray:
    """``values`` as one array; rows of different shapes are refused, naming the first that differs."""
    if isinstance(values, np.ndarray) and values.dtype != object:
        return values
    rows = [np.asarray(v) for v in values]
    for i, row in enumerate(rows):
        if row.shape != rows[0].shape:
            raise DataError(f"{what}: row {i} has shape {row.shape}; row 0 has {rows[0].shape}")
    return np.stack(rows)  # a split has rows: datasets reads back no split without
