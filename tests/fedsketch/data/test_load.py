"""Loaders on small files written here in the published formats, the cache, bring-your-own data."""

from __future__ import annotations

import gzip
import pickle
import struct
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import IterableDataset, TensorDataset

from fedsketch.data import (
    NORMALIZATION,
    DataSpec,
    from_arrays,
    load_federated,
    load_idx_images,
    load_idx_labels,
)


def write_idx(path: Path, array: np.ndarray, *, gz: bool = False) -> None:
    """IDX as published: 0, 0, type 0x08 (uint8), ndim, big-endian int32 dims, raw bytes."""
    header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}i", *array.shape)
    payload = header + array.astype(np.uint8).tobytes()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(payload) if gz else payload)


def write_mnist(root: Path, folder: str, *, gz: bool, n_train: int = 40, n_test: int = 10) -> None:
    rng = np.random.default_rng(0)
    raw = root / folder / "raw"
    suffix = ".gz" if gz else ""
    for split, n in (("train", n_train), ("t10k", n_test)):
        images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
        images[:, 0, 0] = 0  # a known pixel to check the normalization
        write_idx(raw / f"{split}-images-idx3-ubyte{suffix}", images, gz=gz)
        write_idx(raw / f"{split}-labels-idx1-ubyte{suffix}", np.arange(n) % 10, gz=gz)


def write_cifar(root: Path, dataset: str, *, n: int = 20, protocol: int = 2) -> None:
    rng = np.random.default_rng(1)
    if dataset == "cifar10":
        base, key, classes = root / "cifar-10-batches-py", b"labels", 10
        files = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
        meta = ("batches.meta", {b"label_names": [f"c{i}".encode() for i in range(10)]})
    else:
        base, key, classes = root / "cifar-100-python", b"fine_labels", 100
        files, meta = (
            ["train", "test"],
            ("meta", {b"fine_label_names": [f"c{i}".encode() for i in range(100)]}),
        )
    base.mkdir(parents=True)
    for name in files:
        batch = {
            b"data": rng.integers(0, 256, size=(n, 3072), dtype=np.uint8),
            key: [i % classes for i in range(n)],
        }
        (base / name).write_bytes(pickle.dumps(batch, protocol=protocol))
    (base / meta[0]).write_bytes(pickle.dumps(meta[1], protocol=protocol))


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize(("dataset", "folder"), [("mnist", "MNIST"), ("fashion_mnist", "FashionMNIST")])
def test_mnist_like_from_idx_files(tmp_path: Path, dataset: str, folder: str, gz: bool) -> None:
    write_mnist(tmp_path, folder, gz=gz)
    data = load_federated(DataSpec(dataset=dataset, root=str(tmp_path), partition="iid", num_clients=4))
    assert data.train_x.shape == (40, 1, 28, 28) and data.test_x.shape == (10, 1, 28, 28)
    assert data.train_x.dtype == torch.float32 and data.input_shape == (1, 28, 28) and data.num_classes == 10
    (mean,), (std,) = NORMALIZATION[dataset]
    assert torch.allclose(data.train_x[:, 0, 0, 0], torch.full((40,), -mean / std))
    assert data.test_y.tolist() == list(range(10))
    assert sorted(np.concatenate(data.client_indices).tolist()) == list(range(40))


def test_idx_header_is_the_published_one(tmp_path: Path) -> None:
    write_idx(tmp_path / "img", np.zeros((3, 5, 7), dtype=np.uint8))
    write_idx(tmp_path / "lab.gz", np.array([1, 2, 3]), gz=True)
    assert struct.unpack(">i", (tmp_path / "img").read_bytes()[:4]) == (2051,)
    assert load_idx_images(tmp_path / "img").shape == (3, 5, 7)
    assert load_idx_labels(tmp_path / "lab.gz").tolist() == [1, 2, 3]
    (tmp_path / "bad").write_bytes(b"\x00\x00\x08\x01\x00\x00\x00\x05\x01")
    with pytest.raises(ValueError, match="5"):
        load_idx_labels(tmp_path / "bad")


@pytest.mark.parametrize(("dataset", "classes"), [("cifar10", 10), ("cifar100", 100)])
def test_cifar_from_pickled_batches(tmp_path: Path, dataset: str, classes: int) -> None:
    write_cifar(tmp_path, dataset)
    data = load_federated(DataSpec(dataset=dataset, root=str(tmp_path), partition="iid", num_clients=5))
    n_train = 100 if dataset == "cifar10" else 20
    assert data.train_x.shape == (n_train, 3, 32, 32) and data.test_x.shape == (20, 3, 32, 32)
    assert data.num_classes == classes and data.input_shape == (3, 32, 32)
    # Rows are 1024 red, then green, then blue values: pixel (0, 0) of the red plane is byte 0.
    folder = "cifar-10-batches-py/test_batch" if dataset == "cifar10" else "cifar-100-python/test"
    raw = pickle.loads((tmp_path / folder).read_bytes())[b"data"]
    mean, std = NORMALIZATION[dataset]
    expected = (raw[:, 1024] / 255.0 - mean[1]) / std[1]  # green plane, pixel (0, 0)
    assert np.allclose(data.test_x[:, 1, 0, 0].numpy(), expected, atol=1e-5)


def test_cifar_reads_python3_pickles_and_refuses_code(tmp_path: Path) -> None:
    write_cifar(tmp_path, "cifar10", protocol=pickle.HIGHEST_PROTOCOL)
    assert (
        load_federated(DataSpec(dataset="cifar10", root=str(tmp_path), partition="iid", num_clients=2)).num_clients == 2
    )
    evil = tmp_path / "evil"
    write_cifar(evil, "cifar10")
    (evil / "cifar-10-batches-py" / "test_batch").write_bytes(pickle.dumps({b"data": print}))
    with pytest.raises(pickle.UnpicklingError, match="refusing"):
        load_federated(DataSpec(dataset="cifar10", root=str(evil), partition="iid", num_clients=2))


@pytest.mark.parametrize(
    ("dataset", "named"),
    [
        ("mnist", "MNIST/raw"),
        ("fashion_mnist", "FashionMNIST/raw"),
        ("cifar10", "cifar-10-batches-py"),
        ("cifar100", "cifar-100-python"),
        ("npz", "nothing.npz"),
        ("femnist", "nothing"),
    ],
)
def test_missing_files_name_the_path_and_the_fix(tmp_path: Path, dataset: str, named: str) -> None:
    root = tmp_path / named.split("/")[0] if dataset in ("npz", "femnist") else tmp_path
    with pytest.raises(FileNotFoundError) as err:
        load_federated(DataSpec(dataset=dataset, root=str(root), partition="iid"))
    message = str(err.value)
    assert str(tmp_path / named) in message
    if dataset != "npz":
        assert "download" in message or "save_to_disk" in message


def test_empty_root_says_what_to_set() -> None:
    with pytest.raises(FileNotFoundError, match="data root is empty"):
        load_federated(DataSpec(dataset="cifar10", partition="iid"))


def test_npz_with_natural_client_ids(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    ids = np.repeat(np.array(["alice", "bob", "carol"]), [5, 3, 4])
    path = tmp_path / "mine.npz"
    np.savez(
        path,
        x_train=rng.normal(size=(12, 4)),
        y_train=np.arange(12) % 3,
        x_test=rng.normal(size=(6, 4)),
        y_test=np.arange(6) % 3,
        client_ids=ids,
    )
    data = load_federated(DataSpec(dataset="npz", root=str(path), num_clients=3))
    assert [part.tolist() for part in data.client_indices] == [[0, 1, 2, 3, 4], [5, 6, 7], [8, 9, 10, 11]]
    assert data.input_shape == (4,) and data.num_classes == 3 and data.train_x.dtype == torch.float32
    np.savez(tmp_path / "bad.npz", x_train=np.zeros((2, 2)))
    with pytest.raises(ValueError, match="y_train"):
        load_federated(DataSpec(dataset="npz", root=str(tmp_path / "bad.npz"), partition="iid", num_clients=1))


def test_from_arrays_accepts_torch_datasets_and_checks_inputs() -> None:
    x, y = torch.randn(30, 2, 3), torch.arange(30) % 5
    spec = DataSpec(partition="iid", num_clients=3)
    data = from_arrays(TensorDataset(x, y), None, TensorDataset(x[:4], y[:4]), None, spec)
    assert torch.equal(data.train_x, x) and data.num_classes == 5 and data.input_shape == (2, 3)
    with pytest.raises(ValueError, match="natural"):
        from_arrays(x.numpy(), y.numpy(), x.numpy(), y.numpy(), DataSpec(num_clients=3))
    with pytest.raises(ValueError, match="uint8"):
        from_arrays(np.zeros((30, 2), np.uint8), y.numpy(), x.numpy(), y.numpy(), spec)
    with pytest.raises(ValueError, match="integer labels"):
        from_arrays(x, y.float(), x, y, spec)


def test_client_data_and_bad_client_ids() -> None:
    x, y = torch.randn(12, 3), torch.arange(12) % 2
    data = from_arrays(x, y, x, y, DataSpec(partition="iid", num_clients=4))
    cx, cy = data.client_data(1)
    idx = torch.from_numpy(data.client_indices[1].copy())
    assert torch.equal(cx, x[idx]) and torch.equal(cy, y[idx])
    cx.zero_()  # a copy: the shared tensor is untouched
    assert torch.equal(data.train_x, x)
    with pytest.raises(ValueError, match="out of range.*4 clients"):
        data.client_data(4)
    with pytest.raises(ValueError, match="out of range"):
        data.client_data(-1)
    with pytest.raises(TypeError):
        data.client_data("1")  # type: ignore[arg-type]


def test_load_federated_caches_per_spec() -> None:
    spec = DataSpec(num_clients=20, seed=3)
    first = load_federated(spec)
    assert load_federated(DataSpec(num_clients=20, seed=3)) is first
    assert load_federated(DataSpec(num_clients=20, seed=4)) is not first


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("dataset", "imagenet"),
        ("partition", "random"),
        ("num_clients", 0),
        ("alpha", 0.0),
        ("classes_per_client", 0),
        ("samples_per_client", -1),
        ("synthetic_beta", -1.0),
        ("seed", -1),
        ("num_clients", 2.5),
    ],
)
def test_spec_rejects_bad_settings_with_the_reason(field: str, value: object) -> None:
    with pytest.raises((ValueError, TypeError), match=field.split("_")[0]):
        DataSpec(**{field: value})  # type: ignore[arg-type]


@pytest.mark.parametrize(("layout", "gz"), [("", True), ("MNIST/raw", False)])
def test_mnist_t10k_holds_out_a_fixed_part_of_the_test_split(tmp_path: Path, layout: str, gz: bool) -> None:
    """``mnist_t10k``: the published test split alone, ``T10K_HOLDOUT`` images held out by seed, the rest for clients."""
    from fedsketch.data.load import T10K_HOLDOUT

    n = T10K_HOLDOUT + 60
    images = np.random.default_rng(3).integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
    suffix = ".gz" if gz else ""
    write_idx(tmp_path / layout / f"t10k-images-idx3-ubyte{suffix}", images, gz=gz)
    write_idx(tmp_path / layout / f"t10k-labels-idx1-ubyte{suffix}", np.arange(n) % 10, gz=gz)
    spec = DataSpec(
        dataset="mnist_t10k", root=str(tmp_path), partition="pathological", classes_per_client=1, num_clients=10
    )
    data = load_federated(spec)
    assert data.train_x.shape == (60, 1, 28, 28) and data.test_x.shape == (T10K_HOLDOUT, 1, 28, 28)
    assert data.num_classes == 10 and data.input_shape == (1, 28, 28)
    assert all(len(np.unique(data.train_y.numpy()[p])) == 1 for p in data.client_indices)
    (mean,), (std,) = NORMALIZATION["mnist"]
    pixels = torch.cat([data.train_x, data.test_x]).flatten(1)[:, 0].sort().values
    expected = torch.from_numpy(images[:, 0, 0].astype(np.float32) / 255).sub(mean).div(std).sort().values
    torch.testing.assert_close(pixels, expected)
    other = load_federated(DataSpec(dataset="mnist_t10k", root=str(tmp_path), partition="iid", num_clients=10, seed=1))
    assert not torch.equal(other.test_y, data.test_y)  # the holdout is drawn from the seed


def test_mnist_t10k_without_the_files_names_the_folder(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=rf"t10k-images-idx3-ubyte\[\.gz\] in {tmp_path}"):
        load_federated(DataSpec(dataset="mnist_t10k", root=str(tmp_path), partition="iid"))
    with pytest.raises(FileNotFoundError, match="empty data root"):
        load_federated(DataSpec(dataset="mnist_t10k", partition="iid"))


class _Stream(IterableDataset[tuple[torch.Tensor, int]]):
    """A Dataset with no length: samples come one by one."""

    def __iter__(self) -> Iterator[tuple[torch.Tensor, int]]:
        return iter(zip(torch.randn(6, 2), range(6), strict=True))


def test_an_iterable_dataset_is_refused_naming_the_split() -> None:
    x, y = torch.randn(6, 2), torch.arange(6) % 2
    spec = DataSpec(partition="iid", num_clients=2)
    with pytest.raises(ValueError, match="^data: the train Dataset has no length"):
        from_arrays(_Stream(), None, TensorDataset(x, y), None, spec, name="data")
