"""Loaders on small files written here in the published formats, the cache, bring-your-own data."""

from __future__ import annotations

import gzip
import pickle
import re
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
    assert torch.allclose(pixels, expected)
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


def test_synthetic_text_is_the_generated_documents_of_the_seed() -> None:
    from fedsketch.data import text

    data = load_federated(DataSpec(dataset="synthetic_text", partition="iid", num_clients=3, seed=5))
    made = text.generate_text(5)
    assert data.name == "synthetic_text" and data.num_classes == text.NUM_CLASSES == 10
    assert data.input_shape == (text.DOC_LEN,) and data.num_clients == 3
    for got, want in ((data.train_x, made.x_train), (data.train_y, made.y_train), (data.test_x, made.x_test)):
        assert np.array_equal(got.numpy(), want)
    assert np.array_equal(data.test_y.numpy(), made.y_test)


def test_synthetic_data_follows_its_settings() -> None:
    from fedsketch.data.synthetic import NUM_CLASSES, generate_synthetic

    spec = DataSpec(
        num_clients=4, synthetic_devices=6, synthetic_alpha=0.5, synthetic_beta=1.5, seed=2, partition="iid"
    )
    data = load_federated(spec)
    made = generate_synthetic(6, 0.5, 1.5, 2)
    assert data.name == "synthetic(0.5,1.5)" and data.num_classes == NUM_CLASSES and data.num_clients == 4
    assert np.array_equal(data.train_x.numpy(), made.x_train) and np.array_equal(data.test_y.numpy(), made.y_test)
    one = load_federated(DataSpec(num_clients=1, seed=1, synthetic_alpha=1.0, synthetic_beta=1.0))
    assert int(max(one.train_y.max(), one.test_y.max())) < 9 and one.num_classes == NUM_CLASSES == 10  # not the labels'
    natural = load_federated(DataSpec(num_clients=5, seed=2, synthetic_alpha=0.5, synthetic_beta=1.5))
    made = generate_synthetic(5, 0.5, 1.5, 2)  # the devices default to the clients
    assert np.array_equal(natural.train_x.numpy(), made.x_train)
    assert [p.tolist() for p in natural.client_indices] == [
        np.flatnonzero(made.client_train == c).tolist() for c in range(5)
    ]


def _npz(path: Path, **extra: np.ndarray) -> Path:
    rng = np.random.default_rng(4)
    arrays = {"x_train": rng.normal(size=(8, 3)), "y_train": np.arange(8) % 4, "x_test": rng.normal(size=(4, 3))}
    np.savez(path, **{**arrays, "y_test": np.arange(4) % 2, **extra})
    return path


def test_npz_arrays_are_read_as_saved_and_named_by_their_file(tmp_path: Path) -> None:
    path = _npz(tmp_path / "mine.npz")
    data = load_federated(DataSpec(dataset="npz", root=str(path), partition="iid", num_clients=2))
    with np.load(path) as saved:
        assert np.array_equal(data.train_x.numpy(), saved["x_train"].astype(np.float32))
        assert data.test_y.tolist() == saved["y_test"].tolist() and data.num_classes == 4
    assert data.name == f"npz:{path}"
    with pytest.raises(ValueError, match=f"^npz:{re.escape(str(path))} has no natural clients"):
        load_federated(DataSpec(dataset="npz", root=str(path), num_clients=2))


@pytest.mark.parametrize(
    ("saved", "message"),
    [
        ({"x_train": np.zeros((2, 2))}, "lacks arrays ['y_train', 'x_test', 'y_test']; it has ['x_train']"),
        (
            {"y_test": np.zeros(2), "x_test": np.zeros((2, 2)), "w": np.zeros(1)},
            "lacks arrays ['x_train', 'y_train']; it has ['w', 'x_test', 'y_test']",
        ),
    ],
)
def test_an_npz_without_every_split_names_what_it_lacks(
    tmp_path: Path, saved: dict[str, np.ndarray], message: str
) -> None:
    path = tmp_path / "part.npz"
    np.savez(path, **saved)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=f"^npz: {re.escape(str(path))} {re.escape(message)}$"):
        load_federated(DataSpec(dataset="npz", root=str(path), partition="iid", num_clients=1))


@pytest.mark.parametrize("root", ["", "missing.npz"])
def test_a_missing_npz_says_how_to_write_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, root: str) -> None:
    monkeypatch.chdir(tmp_path)
    where = tmp_path / root if root else "(empty data root)"
    with pytest.raises(FileNotFoundError) as err:
        load_federated(DataSpec(dataset="npz", root=str(tmp_path / root) if root else "", partition="iid"))
    assert str(err.value) == (
        f"npz: no file at {where}; set the data root to a .npz written by numpy.savez(path, x_train=..., "
        "y_train=..., x_test=..., y_test=..., client_ids=...) (client_ids optional, for the natural partition)"
    )


def _t10k(folder: Path, n: int, *, labels: int | None = None, gz: bool = False) -> tuple[Path, Path]:
    images = np.arange(n * 4, dtype=np.uint8).reshape(n, 2, 2)
    suffix = ".gz" if gz else ""
    write_idx(folder / f"t10k-images-idx3-ubyte{suffix}", images, gz=gz)
    write_idx(folder / f"t10k-labels-idx1-ubyte{suffix}", np.arange(n if labels is None else labels) % 10, gz=gz)
    return folder / f"t10k-images-idx3-ubyte{suffix}", folder / f"t10k-labels-idx1-ubyte{suffix}"


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_idx_files_hold_out_a_seeded_part_and_keep_every_image_once_in_order(tmp_path: Path, seed: int) -> None:
    from fedsketch.data import from_idx_files

    images, labels = _t10k(tmp_path, 30)
    spec = DataSpec(partition="iid", num_clients=2, seed=seed)
    data = from_idx_files(str(images), str(labels), spec, holdout=7)
    pixels = np.concatenate([data.train_x[:, 0, 0, 0].numpy(), data.test_x[:, 0, 0, 0].numpy()])
    rows = np.rint((pixels * 0.3081 + 0.1307) * 255 / 4).astype(int)  # pixel (0, 0) of image i is 4 i
    train, test = rows[:23], rows[23:]
    assert sorted(rows.tolist()) == list(range(30)) and len(test) == 7
    assert train.tolist() == sorted(train.tolist()) and test.tolist() == sorted(test.tolist())
    assert data.train_y.tolist() == (train % 10).tolist() and data.test_y.tolist() == (test % 10).tolist()
    expected = np.sort(np.random.default_rng([seed, 0x1D5]).permutation(30)[:7])
    assert test.tolist() == expected.tolist()
    assert data.name == "mnist:t10k-images-idx3-ubyte" and data.num_classes == 10 and data.input_shape == (1, 2, 2)


def test_idx_files_take_the_named_data_sets_figures(tmp_path: Path) -> None:
    from fedsketch.data import from_idx_files

    images, labels = _t10k(tmp_path, 12, gz=True)
    data = from_idx_files(images, labels, DataSpec(partition="iid", num_clients=1), holdout=1, dataset="fashion_mnist")
    assert data.name == "fashion_mnist:t10k-images-idx3-ubyte.gz" and data.train_x.shape[0] == 11
    (mean,), (std,) = NORMALIZATION["fashion_mnist"]
    first = torch.cat([data.train_x, data.test_x])[:, 0, 0, 0].min()
    assert torch.allclose(first, torch.tensor(-mean / std))  # image 0's pixel (0, 0) is 0


@pytest.mark.parametrize("holdout", [0, 10, 11, -1])
def test_idx_files_refuse_a_holdout_that_leaves_a_split_empty(tmp_path: Path, holdout: int) -> None:
    from fedsketch.data import from_idx_files

    images, labels = _t10k(tmp_path, 10)
    with pytest.raises(ValueError, match=rf"^holdout must be between 1 and 9; got {holdout}$"):
        from_idx_files(str(images), str(labels), DataSpec(partition="iid", num_clients=1), holdout=holdout)
    assert (
        from_idx_files(str(images), str(labels), DataSpec(partition="iid", num_clients=1), holdout=9).test_x.shape[0]
        == 9
    )


def test_idx_files_of_different_lengths_are_refused(tmp_path: Path) -> None:
    from fedsketch.data import from_idx_files

    images, labels = _t10k(tmp_path, 10, labels=9)
    with pytest.raises(ValueError, match=f"^{re.escape(f'{images} has 10 images but {labels} has 9 labels')}$"):
        from_idx_files(str(images), str(labels), DataSpec(partition="iid", num_clients=1))


def test_mnist_t10k_prefers_the_root_and_plain_files(tmp_path: Path) -> None:
    _t10k(tmp_path / "MNIST" / "raw", T10K_N)
    assert load_federated(_t10k_spec(tmp_path)).name == "mnist:t10k-images-idx3-ubyte"
    _t10k(tmp_path, T10K_N, gz=True)
    assert load_federated(_t10k_spec(tmp_path, seed=1)).name == "mnist:t10k-images-idx3-ubyte.gz"
    _t10k(tmp_path, T10K_N)
    assert load_federated(_t10k_spec(tmp_path, seed=2)).name == "mnist:t10k-images-idx3-ubyte"


T10K_N = 2010


def _t10k_spec(root: Path | str, seed: int = 0) -> DataSpec:
    return DataSpec(dataset="mnist_t10k", root=str(root), partition="iid", num_clients=2, seed=seed)


def test_mnist_t10k_with_an_empty_root_does_not_read_the_working_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _t10k(tmp_path, T10K_N)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError) as err:
        load_federated(_t10k_spec(""))
    assert str(err.value) == (
        "mnist_t10k: no t10k-images-idx3-ubyte[.gz] in (empty data root) or its MNIST/raw/; set the data root to a "
        "folder holding MNIST's test split (t10k-images-idx3-ubyte.gz, t10k-labels-idx1-ubyte.gz)"
    )


def test_mnist_t10k_without_the_labels_names_them(tmp_path: Path) -> None:
    _t10k(tmp_path, T10K_N)
    (tmp_path / "t10k-labels-idx1-ubyte").unlink()
    with pytest.raises(FileNotFoundError, match=rf"^mnist_t10k: no t10k-labels-idx1-ubyte\[\.gz\] in {tmp_path} or"):
        load_federated(_t10k_spec(tmp_path))


@pytest.mark.parametrize("dataset", ["mnist", "fashion_mnist", "cifar10", "cifar100"])
def test_an_image_set_with_an_empty_root_names_the_files_to_put_there(dataset: str) -> None:
    from fedsketch.data.registry import DATASETS

    message = (
        f"dataset {dataset!r} is read from local files and the data root is empty: "
        f"set it to a folder holding {DATASETS[dataset].files}"
    )
    with pytest.raises(FileNotFoundError, match=f"^{re.escape(message)}$"):
        load_federated(DataSpec(dataset=dataset, partition="iid"))


def test_a_hugging_face_folder_keeps_its_classes_clients_and_name(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    features = datasets.Features(
        {"v": datasets.Value("float32"), "label": datasets.ClassLabel(num_classes=5), "who": datasets.Value("string")}
    )
    rows = {"v": [float(i) for i in range(12)], "label": [i % 3 for i in range(12)], "who": list("aabbbccccaab")}
    split = datasets.Dataset.from_dict(rows, features=features)
    datasets.DatasetDict({"train": split, "test": split.select(range(4))}).save_to_disk(str(tmp_path / "hf"))
    spec = DataSpec(dataset="huggingface", root=str(tmp_path / "hf"), hf_client_id="who", num_clients=3)
    data = load_federated(spec)
    assert data.name == f"huggingface:{tmp_path / 'hf'}" and data.num_classes == 5  # the ClassLabel's, not 3
    assert [p.tolist() for p in data.client_indices] == [[0, 1, 9, 10], [2, 3, 4, 11], [5, 6, 7, 8]]
    assert data.train_y.tolist() == rows["label"] and data.test_y.tolist() == rows["label"][:4]
    assert data.input_shape == (1,) and data.train_x.dtype == torch.float32


def test_an_npz_holding_pickled_objects_is_refused(tmp_path: Path) -> None:
    """An object array is a pickle, and unpickling a data file can run code."""
    path = _npz(tmp_path / "objects.npz", client_ids=np.array(["a", 1, None, "b"] * 2, dtype=object))
    with pytest.raises(ValueError, match="allow_pickle=False"):
        load_federated(DataSpec(dataset="npz", root=str(path), num_clients=3))


@pytest.mark.parametrize(
    ("given", "setting", "classes"),
    [(None, 0, 5), (None, 7, 7), (6, 7, 6), (6, 0, 6)],
)
def test_the_class_count_is_the_given_one_else_the_setting_else_the_largest_label_of_both_splits(
    given: int | None, setting: int, classes: int
) -> None:
    x = torch.zeros(6, 2)
    y_train, y_test = torch.tensor([0, 2, 1, 0, 2, 1]), torch.tensor([4, 0, 1, 0, 1, 2])
    spec = DataSpec(partition="iid", num_clients=2, num_classes=setting)
    assert from_arrays(x, y_train, x, y_test, spec, num_classes=given).num_classes == classes
    spec = DataSpec(partition="iid", num_clients=2, num_classes=setting)
    assert from_arrays(x, y_test, x, y_train, spec, num_classes=given).num_classes == classes


@pytest.mark.parametrize(
    ("given", "setting", "origin"), [(3, 0, "the setting 'num-classes'"), (None, 3, "the setting 'num-classes'")]
)
def test_a_label_outside_the_declared_classes_is_refused_naming_the_split(
    given: int | None, setting: int, origin: str
) -> None:
    from fedsketch.data.checks import DataError

    x, y = torch.zeros(4, 2), torch.tensor([0, 1, 2, 1])
    spec = DataSpec(partition="iid", num_clients=1, num_classes=setting)
    message = f"y_test of mine: label 5 at index 2 is outside [0, 3) (3 classes, from {origin}; 1 labels outside)"
    with pytest.raises(DataError, match=f"^{re.escape(message)}$"):
        from_arrays(x, y, x, torch.tensor([0, 1, 5, 1]), spec, name="mine", num_classes=given)
    with pytest.raises(
        DataError, match=r"^y_train of mine: label -1 at index 0 .*from the data set; 1 labels outside\)$"
    ):
        from_arrays(x, torch.tensor([-1, 1, 2, 1]), x, y, DataSpec(partition="iid", num_clients=1), name="mine")


@pytest.mark.parametrize("split", ["train", "test"])
def test_a_sample_that_is_not_finite_is_refused_naming_its_split(split: str) -> None:
    from fedsketch.data.checks import DataError

    x, y = torch.zeros(4, 2), torch.tensor([0, 1, 0, 1])
    bad = x.clone()
    bad[3, 1] = float("inf")
    arrays = (bad, y, x, y) if split == "train" else (x, y, bad, y)
    with pytest.raises(DataError, match=f"^x_{split} of mine: sample 3 holds"):
        from_arrays(*arrays, DataSpec(partition="iid", num_clients=1), name="mine")


def test_from_arrays_keeps_the_arrays_shape_name_and_natural_clients() -> None:
    x, y = torch.arange(24.0).reshape(6, 2, 2), torch.tensor([0, 1, 0, 1, 2, 2])
    ids = ["b", "a", "b", "c", "a", "c"]
    data = from_arrays(x, y, x[:2], y[:2], DataSpec(num_clients=3), client_ids=ids, name="mine")  # type: ignore[arg-type]
    assert data.name == "mine" and data.input_shape == (2, 2) and data.num_classes == 3
    assert torch.equal(data.train_x, x) and torch.equal(data.test_x, x[:2]) and torch.equal(data.test_y, y[:2])
    assert [p.tolist() for p in data.client_indices] == [[1, 4], [0, 2], [3, 5]]  # ids in sorted order
    assert isinstance(data.client_indices, tuple)
    with pytest.raises(ValueError) as err:
        from_arrays(x, y, x, y, DataSpec(num_clients=3), name="mine")
    assert str(err.value) == (
        "mine has no natural clients (no client ids): choose partition iid, dirichlet, pathological or shards"
    )


@pytest.mark.parametrize("split", ["train", "test"])
@pytest.mark.parametrize("name", [None, "mine"])
def test_labels_that_are_not_integers_are_refused_naming_the_split_and_the_source(split: str, name: str | None) -> None:
    x, y = torch.zeros(4, 2), torch.tensor([0, 1, 0, 1])
    arrays = (x, y.float(), x, y) if split == "train" else (x, y, x, y.float())
    spec = DataSpec(partition="iid", num_clients=1)
    message = f"y_{split} of {name or 'arrays'} must hold integer labels; got torch.float32"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        from_arrays(*arrays, spec) if name is None else from_arrays(*arrays, spec, name=name)


def test_arrays_given_no_name_are_called_arrays() -> None:
    x, y = torch.zeros(4, 2), torch.tensor([0, 1, 0, 1])
    assert from_arrays(x, y, x, y, DataSpec(partition="iid", num_clients=1)).name == "arrays"


def test_flower_datasets_natural_partition_without_client_ids_says_they_are_missing() -> None:
    pytest.importorskip("datasets")
    x, y = torch.zeros(4, 2), torch.tensor([0, 1, 0, 1])
    with pytest.raises(ValueError, match="^partition 'flwr-natural-id' needs the data's own client ids"):
        from_arrays(x, y, x, y, DataSpec(partition="flwr-natural-id", num_clients=1))


def test_synthetic_text_has_its_own_ten_classes_whatever_the_setting() -> None:
    spec = DataSpec(dataset="synthetic_text", partition="iid", num_clients=2, seed=5, num_classes=20)
    assert load_federated(spec).num_classes == 10


def test_femnist_calls_itself_femnist(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    from PIL import Image

    rows = {
        "image": [Image.new("L", (28, 28), color=i) for i in range(20)],
        "writer_id": ["w1"] * 10 + ["w2"] * 10,
        "character": [i % 62 for i in range(20)],
    }
    features = datasets.Features(
        {"image": datasets.Image(), "writer_id": datasets.Value("string"), "character": datasets.Value("int64")}
    )
    datasets.Dataset.from_dict(rows, features=features).save_to_disk(str(tmp_path / "femnist"))
    data = load_federated(DataSpec(dataset="femnist", root=str(tmp_path / "femnist"), num_clients=2))
    assert data.name == "femnist" and data.num_classes == 62 and data.train_x.shape[0] == 18
