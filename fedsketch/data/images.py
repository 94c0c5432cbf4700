"""Image datasets read from local files in their published formats, never downloaded.

- MNIST (LeCun et al. 1998) and Fashion-MNIST (Xiao et al. 2017): IDX files
  (a big-endian int32 magic number, one int32 per dimension, then raw bytes),
  plain or gzipped, in ``root/MNIST/raw/`` and ``root/FashionMNIST/raw/`` (or
  directly in ``root``).
- CIFAR-10 and CIFAR-100 (Krizhevsky 2009): the "python version" pickled
  batches, in ``root/cifar-10-batches-py/`` and ``root/cifar-100-python/``.

The layout is torchvision's, so its ``download=True`` produces what is read
here; why not ``torchvision.datasets`` itself: docs/data.md. Pixels become
float32 ``(N, C, H, W)`` tensors normalized by the usual per-dataset channel
mean and standard deviation (:data:`NORMALIZATION`).
"""

from __future__ import annotations

import gzip
import pickle
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

# Channel mean and std of the training pixels in [0, 1]: MNIST's are the values of
# the PyTorch MNIST example; Fashion-MNIST's and CIFAR's are computed over their
# training sets (CIFAR-10's true std, not the often-copied 0.2023/0.1994/0.2010).
NORMALIZATION: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
    "mnist": ((0.1307,), (0.3081,)),
    "fashion_mnist": ((0.2860,), (0.3530,)),
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
}
_IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
_MNIST_FOLDERS = {"mnist": "MNIST", "fashion_mnist": "FashionMNIST"}
_MNIST_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
_CIFAR = {  # folder, training files, test file, label key, torchvision class
    "cifar10": (
        "cifar-10-batches-py",
        tuple(f"data_batch_{i}" for i in range(1, 6)),
        "test_batch",
        "labels",
        "CIFAR10",
    ),
    "cifar100": ("cifar-100-python", ("train",), "test", "fine_labels", "CIFAR100"),
}
RawSplits = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def load_idx(path: str | Path) -> np.ndarray:
    """Read one IDX file (plain or gzipped) into an array of its stored type and shape.

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    ValueError
        If the header is not IDX or the payload does not match the dimensions.
    """
    path = Path(path)
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":  # the gzip magic, whatever the file is called
        raw = gzip.decompress(raw)
    if len(raw) < 4 or raw[:2] != b"\x00\x00" or raw[2] not in _IDX_DTYPES:
        raise ValueError(f"{path} is not an IDX file: its header is {raw[:4].hex()}")
    dtype, ndim = np.dtype(_IDX_DTYPES[raw[2]]), raw[3]
    offset = 4 + 4 * ndim
    if len(raw) < offset:
        raise ValueError(f"{path}: the IDX header announces {ndim} dimensions but the file ends first")
    dims = tuple(int(d) for d in np.frombuffer(raw, dtype=">i4", count=ndim, offset=4))
    expected = int(np.prod(dims)) * dtype.itemsize
    if len(raw) - offset != expected:
        raise ValueError(f"{path}: header says {dims} ({expected} bytes) but {len(raw) - offset} bytes follow")
    return np.frombuffer(raw, dtype=dtype, offset=offset).reshape(dims).astype(dtype.newbyteorder("="))


def load_idx_images(path: str | Path) -> np.ndarray:
    """Images of an IDX3 file (magic 2051) as uint8 ``(N, H, W)``."""
    images = load_idx(path)
    if images.ndim != 3 or images.dtype != np.uint8:
        raise ValueError(f"{path}: expected uint8 images (N, H, W); got {images.dtype} {images.shape}")
    return images


def load_idx_labels(path: str | Path) -> np.ndarray:
    """Labels of an IDX1 file (magic 2049) as int64 ``(N,)``."""
    labels = load_idx(path)
    if labels.ndim != 1:
        raise ValueError(f"{path}: expected labels of shape (N,); got {labels.shape}")
    return labels.astype(np.int64)


def normalize(images: np.ndarray, dataset: str) -> torch.Tensor:
    """uint8 ``(N, C, H, W)`` (or ``(N, H, W)``) to float32, scaled to [0, 1] and standardized."""
    if dataset not in NORMALIZATION:
        raise ValueError(f"no normalization known for {dataset!r}; known: {', '.join(NORMALIZATION)}")
    if images.dtype != np.uint8 or images.ndim not in (3, 4):
        raise ValueError(f"expected uint8 images (N, H, W) or (N, C, H, W); got {images.dtype} {images.shape}")
    x = torch.from_numpy(np.ascontiguousarray(images if images.ndim == 4 else images[:, None]))
    mean, std = (torch.tensor(v, dtype=torch.float32).view(1, -1, 1, 1) for v in NORMALIZATION[dataset])
    if x.shape[1] != mean.shape[1]:
        raise ValueError(f"{dataset} has {mean.shape[1]} channels; images have {x.shape[1]}")
    return x.float().div_(255.0).sub_(mean).div_(std)


def load_mnist_like(root: str | Path, dataset: str) -> RawSplits:
    """uint8 train images, int64 train labels, test images, test labels of MNIST or Fashion-MNIST."""
    folder = _MNIST_FOLDERS[dataset]
    found = [
        _find_idx(Path(root), folder, name, dataset) for split in ("train", "test") for name in _MNIST_FILES[split]
    ]
    x_train, x_test = load_idx_images(found[0]), load_idx_images(found[2])
    y_train, y_test = load_idx_labels(found[1]), load_idx_labels(found[3])
    return x_train, y_train, x_test, y_test


def _find_idx(root: Path, folder: str, name: str, dataset: str) -> Path:
    candidates = [root / folder / "raw" / name, root / name]
    for path in candidates:
        for option in (path, path.with_name(name + ".gz")):
            if option.is_file():
                return option
    cls = "MNIST" if dataset == "mnist" else "FashionMNIST"
    raise FileNotFoundError(
        f"{dataset}: no file {name} (or {name}.gz) in {candidates[0].parent} or {root}. "
        f'On a machine with internet run `python -c "from torchvision.datasets import {cls}; '
        f"{cls}('{root}', train=True, download=True); {cls}('{root}', train=False, download=True)\"` "
        f"and copy {root / folder} here"
    )


def load_cifar(root: str | Path, dataset: str) -> RawSplits:
    """uint8 ``(N, 3, 32, 32)`` images and int64 labels of CIFAR-10 or CIFAR-100 (train, test)."""
    folder, train_files, test_file, label_key, cls = _CIFAR[dataset]
    base = Path(root) / folder
    missing = [name for name in (*train_files, test_file) if not (base / name).is_file()]
    if missing:
        raise FileNotFoundError(
            f"{dataset}: missing {', '.join(missing)} in {base}. On a machine with internet run "
            f"`python -c \"from torchvision.datasets import {cls}; {cls}('{root}', download=True)\"` "
            f"and copy {base} here"
        )
    train = [_read_cifar_batch(base / name, label_key) for name in train_files]
    x_test, y_test = _read_cifar_batch(base / test_file, label_key)
    return np.concatenate([x for x, _ in train]), np.concatenate([y for _, y in train]), x_test, y_test


def _read_cifar_batch(path: Path, label_key: str) -> tuple[np.ndarray, np.ndarray]:
    with path.open("rb") as f:
        batch = {(k.decode() if isinstance(k, bytes) else k): v for k, v in _SafeUnpickler(f).load().items()}
    if "data" not in batch or label_key not in batch:
        raise ValueError(f"{path}: expected keys 'data' and {label_key!r}; found {sorted(batch)}")
    data = np.asarray(batch["data"], dtype=np.uint8)
    labels = np.asarray(batch[label_key], dtype=np.int64)
    if data.ndim != 2 or data.shape[1] != 3 * 32 * 32 or data.shape[0] != labels.shape[0]:
        raise ValueError(f"{path}: expected data (N, 3072) and N labels; got {data.shape} and {labels.shape}")
    return data.reshape(-1, 3, 32, 32), labels  # rows are 1024 red, 1024 green, 1024 blue values


class _SafeUnpickler(pickle.Unpickler):
    """Unpickles plain containers and numpy arrays only: a data file must not run code."""

    _ALLOWED: ClassVar[set[tuple[str, str]]] = {
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy._core.numeric", "_frombuffer"),
        ("numpy.core.numeric", "_frombuffer"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("_codecs", "encode"),
    }

    def __init__(self, file: Any) -> None:
        super().__init__(file, encoding="bytes")  # CIFAR's batches were pickled by Python 2

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in self._ALLOWED:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a data file")
        return super().find_class(module, name)
