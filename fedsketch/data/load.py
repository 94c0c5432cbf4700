"""From a :class:`DataSpec` (or your own arrays) to a partitioned :class:`FederatedData`.

:func:`load_federated` loads and partitions once per process and spec, so the
server and every simulated client of a run share one copy and a client call
never reloads or re-partitions.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedsketch.data import femnist, handoff, huggingface, text
from fedsketch.data.checks import as_samples, check_features, check_labels
from fedsketch.data.images import (
    load_cifar,
    load_idx_images,
    load_idx_labels,
    load_mnist_like,
    normalize,
)
from fedsketch.data.partition import partition_labels
from fedsketch.data.registry import DATASETS, num_classes
from fedsketch.data.spec import DataSpec, FederatedData
from fedsketch.data.synthetic import NUM_CLASSES, generate_synthetic

_NPZ_KEYS = ("x_train", "y_train", "x_test", "y_test")
_HOLDOUT_STREAM = 0x1D5
_T10K_FILES = ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
T10K_HOLDOUT = 2000
"""``mnist_t10k``: images of the 10,000-image test split held out for evaluation (the rest go to clients)."""


@functools.lru_cache(maxsize=4)
def load_federated(spec: DataSpec) -> FederatedData:
    """The dataset and partition ``spec`` describes, built once per process.

    The same spec returns the same object (specs are frozen and hashable), so
    nothing is reloaded, regenerated or re-partitioned. An ``npz`` file is read
    once: changing the file under a running process is not noticed.

    Raises
    ------
    FileNotFoundError
        If the dataset's files are not where ``spec.root`` says; the message
        names the path and how to fetch the files on a machine with internet.
    ValueError
        If the files are malformed or the partition is impossible.
    """
    if spec.dataset == "synthetic":
        return _load_synthetic(spec)
    if spec.dataset == "synthetic_text":
        return _load_text(spec)
    if spec.dataset == "npz":
        return _load_npz(spec)
    if handoff.handed(spec):  # a user's loader or an image folder: loaded once per command
        got = handoff.load(spec)
        return from_arrays(
            got.x_train,
            got.y_train,
            got.x_test,
            got.y_test,
            spec,
            client_ids=got.client_ids,
            name=got.name,
            num_classes=got.num_classes,
        )
    if spec.dataset == "huggingface":
        hf = huggingface.load(spec)
        return from_arrays(
            hf.x_train,
            hf.y_train,
            hf.x_test,
            hf.y_test,
            spec,
            client_ids=hf.client_ids,
            name=hf.name,
            num_classes=hf.num_classes,
        )
    if spec.dataset == "femnist":
        return _load_femnist(spec)
    if spec.dataset == "mnist_t10k":
        return _load_mnist_t10k(spec)
    if not spec.root:
        raise FileNotFoundError(
            f"dataset {spec.dataset!r} is read from local files and the data root is empty: "
            f"set it to a folder holding {DATASETS[spec.dataset].files}"
        )
    reader = load_cifar if spec.dataset.startswith("cifar") else load_mnist_like
    x_train, y_train, x_test, y_test = reader(spec.root, spec.dataset)
    return from_arrays(
        normalize(x_train, spec.dataset),
        y_train,
        normalize(x_test, spec.dataset),
        y_test,
        spec,
        name=spec.dataset,
        num_classes=num_classes(spec.dataset),
    )


def from_arrays(
    x_train: Any,
    y_train: Any,
    x_test: Any,
    y_test: Any,
    spec: DataSpec,
    client_ids: np.ndarray | None = None,
    *,
    name: str = "arrays",
    num_classes: int | None = None,
) -> FederatedData:
    """Bring your own data: arrays (or torch Datasets) in, a partitioned dataset out.

    Parameters
    ----------
    x_train, x_test
        Samples as numpy arrays or tensors of shape ``(N, *input_shape)``, used
        as given (normalize them first), or a ``torch.utils.data.Dataset`` of
        ``(sample, label)`` pairs, in which case the matching ``y_*`` is None.
    y_train, y_test
        Integer labels ``(N,)``, or None with a Dataset.
    spec
        The partition settings (``dataset`` and ``root`` are not used), and
        ``num_classes`` where the data set's own count is not given.
    client_ids
        Each training sample's own client, for ``partition="natural"``.
    name, num_classes
        Where the data came from (it names the source in errors); the number of
        classes (default: ``spec.num_classes``, else the largest label + 1).

    Raises
    ------
    ValueError
        If shapes or types disagree, or the partition is impossible.
    DataError
        If a feature is not finite or a label lies outside the classes (naming
        the array and the first offending index).
    """
    xtr, ytr = as_samples(x_train, y_train, "train", name)
    xte, yte = as_samples(x_test, y_test, "test", name)
    if spec.partition == "natural" and client_ids is None:
        raise ValueError(
            f"{name} has no natural clients (no client ids): choose partition iid, dirichlet, pathological or shards"
        )
    declared = num_classes if num_classes is not None else spec.num_classes or None
    classes = declared if declared is not None else int(max(ytr.max(), yte.max())) + 1  # neither split is empty
    for split, x, y in (("train", xtr, ytr), ("test", xte, yte)):
        check_features(x, f"x_{split}", name)
        check_labels(y, f"y_{split}", name, classes, declared=declared is not None)
    parts = partition_labels(ytr.numpy(), spec, None if client_ids is None else np.asarray(client_ids))
    return FederatedData(xtr, ytr, xte, yte, tuple(parts), classes, tuple(xtr.shape[1:]), name)


@functools.lru_cache(maxsize=2)
def from_idx_files(
    images_path: str | Path,
    labels_path: str | Path,
    spec: DataSpec,
    *,
    holdout: int = 2000,
    dataset: str = "mnist",
) -> FederatedData:
    """A federated dataset from one pair of IDX files, with a random ``holdout`` as test set.

    Made for real-data checks on the published MNIST test split alone
    (10,000 images: 8,000 for clients, 2,000 held out), read where it lies, plain
    or gzipped. ``dataset`` picks the normalization constants. Cached like
    :func:`load_federated`.
    """
    x, y = load_idx_images(images_path), load_idx_labels(labels_path)
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"{images_path} has {x.shape[0]} images but {labels_path} has {y.shape[0]} labels")
    if not 0 < holdout < x.shape[0]:
        raise ValueError(f"holdout must be between 1 and {x.shape[0] - 1}; got {holdout}")
    perm = np.random.default_rng([spec.seed, _HOLDOUT_STREAM]).permutation(x.shape[0])
    test, train = np.sort(perm[:holdout]), np.sort(perm[holdout:])
    return from_arrays(
        normalize(x[train], dataset),
        y[train],
        normalize(x[test], dataset),
        y[test],
        spec,
        name=f"{dataset}:{Path(images_path).name}",
        num_classes=DATASETS[dataset].num_classes if dataset in DATASETS else None,
    )


def _load_synthetic(spec: DataSpec) -> FederatedData:
    devices = spec.synthetic_devices or spec.num_clients
    s = generate_synthetic(devices, spec.synthetic_alpha, spec.synthetic_beta, spec.seed)
    return from_arrays(
        s.x_train,
        s.y_train,
        s.x_test,
        s.y_test,
        spec,
        client_ids=s.client_train,
        name=f"synthetic({spec.synthetic_alpha:g},{spec.synthetic_beta:g})",
        num_classes=NUM_CLASSES,
    )


def _load_text(spec: DataSpec) -> FederatedData:
    t = text.generate_text(spec.seed)
    return from_arrays(
        t.x_train, t.y_train, t.x_test, t.y_test, spec, name="synthetic_text", num_classes=text.NUM_CLASSES
    )


def _load_npz(spec: DataSpec) -> FederatedData:
    path = Path(spec.root)
    if not path.is_file():
        raise FileNotFoundError(
            f"npz: no file at {path if spec.root else '(empty data root)'}; set the data root to a .npz written "
            "by numpy.savez(path, x_train=..., y_train=..., x_test=..., y_test=..., client_ids=...) "
            "(client_ids optional, for the natural partition)"
        )
    with np.load(path, allow_pickle=False) as f:
        missing = [key for key in _NPZ_KEYS if key not in f.files]
        if missing:
            raise ValueError(f"npz: {path} lacks arrays {missing}; it has {sorted(f.files)}")
        arrays = {key: f[key] for key in f.files}
    return from_arrays(
        arrays["x_train"],
        arrays["y_train"],
        arrays["x_test"],
        arrays["y_test"],
        spec,
        client_ids=arrays.get("client_ids"),
        name=f"npz:{path}",
    )


def _load_mnist_t10k(spec: DataSpec) -> FederatedData:
    """MNIST's published test split alone: ``T10K_HOLDOUT`` images held out (by seed), the rest for clients.

    For machines that hold only the 10,000 test images (``t10k-*-ubyte[.gz]``,
    directly in ``root``): real images without the 60,000-image training split.
    """
    root = Path(spec.root)
    found = []
    for name in _T10K_FILES:
        options = [folder / f for folder in (root, root / "MNIST" / "raw") for f in (name, name + ".gz")]
        path = next((p for p in options if spec.root and p.is_file()), None)
        if path is None:
            raise FileNotFoundError(
                f"mnist_t10k: no {name}[.gz] in {root if spec.root else '(empty data root)'} or its MNIST/raw/; set "
                "the data root to a folder holding MNIST's test split (t10k-images-idx3-ubyte.gz, "
                "t10k-labels-idx1-ubyte.gz)"
            )
        found.append(path)
    return from_idx_files(str(found[0]), str(found[1]), spec, holdout=T10K_HOLDOUT, dataset="mnist")


def _load_femnist(spec: DataSpec) -> FederatedData:
    ds = femnist.open_femnist(spec.root)
    writers, chars = femnist.columns(ds)
    held_out = femnist.split_rows(writers, spec.seed)
    train_rows = np.flatnonzero(~held_out)
    parts = partition_labels(chars[train_rows], spec, writers[train_rows])
    kept = np.sort(np.concatenate(parts))  # positions in train_rows that some client holds
    test_rows = np.flatnonzero(held_out & np.isin(writers, writers[train_rows[kept]]))
    pixels = femnist.images(ds, train_rows[kept]).float().div_(255.0)
    mean, std = float(pixels.mean()), float(pixels.std())
    x_test = femnist.images(ds, test_rows).float().div_(255.0)
    return FederatedData(
        train_x=pixels.sub_(mean).div_(std),
        train_y=torch.from_numpy(chars[train_rows[kept]]),
        test_x=x_test.sub_(mean).div_(std),
        test_y=torch.from_numpy(chars[test_rows]),
        client_indices=tuple(np.searchsorted(kept, part).astype(np.int64) for part in parts),
        num_classes=num_classes("femnist"),
        input_shape=(1, 28, 28),
        name="femnist",
    )
