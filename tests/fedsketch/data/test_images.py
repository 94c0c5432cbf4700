"""The image readers on small files written here: IDX types and refusals, normalization figures, CIFAR batches."""

from __future__ import annotations

import gzip
import io
import pickle
import re
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from fedsketch.data.images import (
    NORMALIZATION,
    load_cifar,
    load_idx,
    load_idx_images,
    load_idx_labels,
    load_mnist_like,
    normalize,
)

IDX_TYPES = {0x08: "u1", 0x09: "i1", 0x0B: "i2", 0x0C: "i4", 0x0D: "f4", 0x0E: "f8"}


def idx_bytes(array: np.ndarray, code: int = 0x08) -> bytes:
    """IDX as published: 0, 0, the type code, ndim, big-endian int32 dims, big-endian values."""
    header = bytes([0, 0, code, array.ndim]) + struct.pack(f">{array.ndim}i", *array.shape)
    return header + array.astype(">" + IDX_TYPES[code]).tobytes()


def write(path: Path, data: bytes, *, gz: bool = False) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


@pytest.mark.parametrize(("code", "kind"), IDX_TYPES.items())
def test_every_idx_type_reads_as_its_values_in_native_byte_order(tmp_path: Path, code: int, kind: str) -> None:
    values = np.array([[-3, 1, 100], [7, -128, 0]]) if kind != "u1" else np.array([[3, 1, 200], [7, 255, 0]])
    got = load_idx(write(tmp_path / "a", idx_bytes(values, code)))
    assert got.dtype == np.dtype(kind).newbyteorder("=") and got.dtype.isnative
    assert got.shape == (2, 3) and got.tolist() == values.tolist()


def test_a_gzipped_file_is_known_by_its_content_not_its_name(tmp_path: Path) -> None:
    labels = np.array([4, 0, 9])
    assert load_idx_labels(write(tmp_path / "labels-no-suffix", idx_bytes(labels), gz=True)).tolist() == [4, 0, 9]
    assert load_idx_labels(write(tmp_path / "plain.gz", idx_bytes(labels))).tolist() == [4, 0, 9]


def test_an_empty_idx_file_is_an_empty_array(tmp_path: Path) -> None:
    got = load_idx_labels(write(tmp_path / "none", idx_bytes(np.zeros(0, dtype=np.uint8))))
    assert got.shape == (0,) and got.dtype == np.int64


@pytest.mark.parametrize(
    ("data", "header"),
    [
        (b"\x00\x00\x08", "000008"),  # shorter than a header
        (b"\x01\x00\x08\x01\x00\x00\x00\x00", "01000801"),  # the first byte is not 0
        (b"\x00\x01\x08\x01\x00\x00\x00\x00", "00010801"),  # the second byte is not 0
        (b"\x00\x00\x07\x01\x00\x00\x00\x00", "00000701"),  # no such type
        (b"\x89PNG\r\n\x1a\n", "89504e47"),
    ],
)
def test_a_file_that_is_not_idx_is_refused_showing_its_header(tmp_path: Path, data: bytes, header: str) -> None:
    path = write(tmp_path / "x", data)
    with pytest.raises(ValueError, match=f"^{re.escape(str(path))} is not an IDX file: its header is {header}$"):
        load_idx(path)


@pytest.mark.parametrize(
    ("data", "ndim"), [(b"\x00\x00\x08\x03\x00\x00\x00\x02\x00\x00\x00\x02", 3), (b"\x00\x00\x08\x01", 1)]
)
def test_a_header_cut_short_is_refused(tmp_path: Path, data: bytes, ndim: int) -> None:
    path = write(tmp_path / "cut", data)
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}: the IDX header announces {ndim} dimensions but"):
        load_idx(path)


@pytest.mark.parametrize(("change", "follow"), [(-1, 3), (1, 5)])
def test_a_payload_of_the_wrong_length_is_refused(tmp_path: Path, change: int, follow: int) -> None:
    data = idx_bytes(np.zeros((2, 2), dtype=np.uint8))
    path = write(tmp_path / "idx", data[:change] if change < 0 else data + b"\x00" * change)
    message = f"{path}: header says (2, 2) (4 bytes) but {follow} bytes follow"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        load_idx(path)


def test_a_wider_type_counts_its_bytes(tmp_path: Path) -> None:
    data = idx_bytes(np.arange(3), 0x0C)  # 3 int32 values: 12 bytes
    path = write(tmp_path / "i4", data[:-4])
    with pytest.raises(ValueError, match=re.escape("header says (3,) (12 bytes) but 8 bytes follow")):
        load_idx(path)


@pytest.mark.parametrize(
    ("array", "code", "got"),
    [
        (np.zeros((2, 3, 4)), 0x0B, "int16 (2, 3, 4)"),
        (np.zeros((2, 3)), 0x08, "uint8 (2, 3)"),
        (np.zeros((1, 2, 3, 4)), 0x08, "uint8 (1, 2, 3, 4)"),
    ],
)
def test_images_must_be_uint8_n_h_w(tmp_path: Path, array: np.ndarray, code: int, got: str) -> None:
    path = write(tmp_path / "img", idx_bytes(array, code))
    message = f"{path}: expected uint8 images (N, H, W); got {got}"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        load_idx_images(path)


def test_labels_must_be_one_dimensional_and_come_as_int64(tmp_path: Path) -> None:
    path = write(tmp_path / "lab", idx_bytes(np.zeros((2, 3))))
    with pytest.raises(
        ValueError, match=f"^{re.escape(str(path))}: expected labels of shape \\(N,\\); got \\(2, 3\\)$"
    ):
        load_idx_labels(path)
    labels = load_idx_labels(write(tmp_path / "ok", idx_bytes(np.array([-1, 5]), 0x09)))
    assert labels.dtype == np.int64 and labels.tolist() == [-1, 5]


def test_the_normalization_figures_are_the_documented_ones() -> None:
    assert NORMALIZATION == {
        "mnist": ((0.1307,), (0.3081,)),
        "fashion_mnist": ((0.2860,), (0.3530,)),
        "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
        "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
    }
    docs = (Path(__file__).resolve().parents[3] / "docs" / "data.md").read_text(encoding="utf-8")
    for means, stds in NORMALIZATION.values():
        assert all(f"{v:.4f}" in docs for v in (*means, *stds))


@pytest.mark.parametrize("dataset", list(NORMALIZATION))
def test_normalize_scales_each_channel_by_its_own_figures(dataset: str) -> None:
    means, stds = NORMALIZATION[dataset]
    channels = len(means)
    images = np.zeros((2, channels, 2, 3), dtype=np.uint8)
    images[1] = 255
    images[0, :, 1, 2] = 51
    x = normalize(images if channels > 1 else images[:, 0], dataset)
    assert x.dtype == torch.float32 and tuple(x.shape) == (2, channels, 2, 3)
    for c, (mean, std) in enumerate(zip(means, stds, strict=True)):
        assert torch.allclose(x[0, c, 0, 0], torch.tensor(-mean / std))
        assert torch.allclose(x[0, c, 1, 2], torch.tensor((0.2 - mean) / std))
        assert torch.allclose(x[1, c], torch.full((2, 3), (1 - mean) / std))


@pytest.mark.parametrize("dataset", ["mnist", "cifar10"])
def test_normalize_gives_the_same_figures_whatever_torchs_default_type(dataset: str) -> None:
    images = np.arange(2 * 3 * 16, dtype=np.int64).astype(np.uint8).reshape(2, 3, 4, 4)
    images = images[:, :1] if dataset == "mnist" else images
    expected = normalize(images, dataset)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        got = normalize(images, dataset)
    finally:
        torch.set_default_dtype(default)
    assert got.dtype == torch.float32 and torch.equal(got, expected)


def test_normalize_keeps_the_callers_images() -> None:
    images = np.full((1, 1, 2, 2), 255, dtype=np.uint8)
    normalize(images, "mnist")
    assert images.tolist() == [[[[255, 255], [255, 255]]]]


@pytest.mark.parametrize(
    ("images", "dataset", "message"),
    [
        (
            np.zeros((1, 2, 2), np.uint8),
            "svhn",
            "no normalization known for 'svhn'; known: mnist, fashion_mnist, cifar10, cifar100",
        ),
        (
            np.zeros((1, 2, 2), np.float32),
            "mnist",
            "expected uint8 images (N, H, W) or (N, C, H, W); got float32 (1, 2, 2)",
        ),
        (np.zeros((1, 2), np.uint8), "mnist", "expected uint8 images (N, H, W) or (N, C, H, W); got uint8 (1, 2)"),
        (np.zeros((1, 1, 1, 2, 2), np.uint8), "mnist", "got uint8 (1, 1, 1, 2, 2)"),
        (np.zeros((1, 2, 2), np.uint8), "cifar10", "cifar10 has 3 channels; images have 1"),
        (np.zeros((1, 3, 2, 2), np.uint8), "mnist", "mnist has 1 channels; images have 3"),
    ],
)
def test_normalize_refuses_what_it_cannot_scale(images: np.ndarray, dataset: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        normalize(images, dataset)


@pytest.mark.parametrize(("dataset", "folder"), [("mnist", "MNIST"), ("fashion_mnist", "FashionMNIST")])
def test_mnist_files_directly_in_the_root_are_found_plain_or_gzipped(tmp_path: Path, dataset: str, folder: str) -> None:
    names = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
    arrays = (np.full((3, 2, 2), 7), np.array([1, 2, 3]), np.full((2, 2, 2), 9), np.array([4, 5]))
    for i, (name, array) in enumerate(zip(names, arrays, strict=True)):
        write(tmp_path / (name + ".gz" if i % 2 else name), idx_bytes(array), gz=bool(i % 2))
    x_train, y_train, x_test, y_test = load_mnist_like(tmp_path, dataset)
    assert x_train.shape == (3, 2, 2) and x_train.dtype == np.uint8 and int(x_train.max()) == 7
    assert y_train.tolist() == [1, 2, 3] and y_train.dtype == np.int64
    assert x_test.shape == (2, 2, 2) and int(x_test.min()) == 9 and y_test.tolist() == [4, 5]
    write(tmp_path / folder / "raw" / "t10k-labels-idx1-ubyte", idx_bytes(np.array([6, 7])))
    assert load_mnist_like(tmp_path, dataset)[3].tolist() == [6, 7]  # the torchvision layout comes first


@pytest.mark.parametrize(("dataset", "folder"), [("mnist", "MNIST"), ("fashion_mnist", "FashionMNIST")])
def test_missing_mnist_files_say_where_they_were_looked_for_and_how_to_get_them(
    tmp_path: Path, dataset: str, folder: str
) -> None:
    write(tmp_path / folder / "raw" / "train-images-idx3-ubyte", idx_bytes(np.zeros((1, 2, 2))))
    with pytest.raises(FileNotFoundError) as err:
        load_mnist_like(tmp_path, dataset)
    raw = tmp_path / folder / "raw"
    assert str(err.value) == (
        f"{dataset}: no file train-labels-idx1-ubyte (or train-labels-idx1-ubyte.gz) in {raw} or {tmp_path}. "
        f'On a machine with internet run `python -c "from torchvision.datasets import {folder}; '
        f"{folder}('{tmp_path}', train=True, download=True); {folder}('{tmp_path}', train=False, download=True)\"` "
        f"and copy {tmp_path / folder} here"
    )


def _cifar(root: Path, dataset: str, n: int = 3, **batch: object) -> Path:
    folder, files, key = (
        ("cifar-10-batches-py", [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"], b"labels")
        if dataset == "cifar10"
        else ("cifar-100-python", ["train", "test"], b"fine_labels")
    )
    base = root / folder
    base.mkdir(parents=True, exist_ok=True)
    for i, name in enumerate(files):
        data = (np.arange(3072) % 251 + i).astype(np.uint8)[None].repeat(n, 0)
        content = {b"data": data, key: [i] * n, **batch}
        (base / name).write_bytes(pickle.dumps(content, protocol=2))
    return base


@pytest.mark.parametrize(("dataset", "batches"), [("cifar10", 5), ("cifar100", 1)])
def test_cifar_rows_are_red_green_blue_planes_and_labels_int64(tmp_path: Path, dataset: str, batches: int) -> None:
    _cifar(tmp_path, dataset)
    x_train, y_train, x_test, y_test = load_cifar(tmp_path, dataset)
    assert x_train.shape == (3 * batches, 3, 32, 32) and x_train.dtype == np.uint8
    assert y_train.dtype == np.int64 and y_train.tolist() == [i for i in range(batches) for _ in range(3)]
    plane = np.arange(3072) % 251 + batches
    assert x_test.shape == (3, 3, 32, 32) and y_test.tolist() == [batches] * 3
    assert (
        x_test[0, 1, 0, 0] == plane[1024] and x_test[0, 2, 31, 31] == plane[3071] and x_test[0, 0, 0, 1] == 1 + batches
    )


@pytest.mark.parametrize(
    ("dataset", "cls", "names"),
    [("cifar10", "CIFAR10", ["data_batch_2", "test_batch"]), ("cifar100", "CIFAR100", ["train", "test"])],
)
def test_missing_cifar_files_are_all_named_with_the_download_command(
    tmp_path: Path, dataset: str, cls: str, names: list[str]
) -> None:
    base = _cifar(tmp_path, dataset)
    for name in names:
        (base / name).unlink()
    with pytest.raises(FileNotFoundError) as err:
        load_cifar(tmp_path, dataset)
    assert str(err.value) == (
        f"{dataset}: missing {', '.join(names)} in {base}. On a machine with internet run "
        f"`python -c \"from torchvision.datasets import {cls}; {cls}('{tmp_path}', download=True)\"` "
        f"and copy {base} here"
    )


@pytest.mark.parametrize(
    ("batch", "message"),
    [
        ({b"data": np.zeros((1, 3072), np.uint8)}, "expected keys 'data' and 'labels'; found ['data']"),
        ({"labels": [0]}, "expected keys 'data' and 'labels'; found ['labels']"),
        ({b"data": np.zeros((2, 3071), np.uint8), b"labels": [0, 1]}, "got (2, 3071) and (2,)"),
        ({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0]}, "got (2, 3072) and (1,)"),
        ({b"data": np.zeros(3072, np.uint8), b"labels": [0]}, "expected data (N, 3072) and N labels; got (3072,)"),
    ],
)
def test_a_malformed_cifar_batch_is_refused_naming_it(tmp_path: Path, batch: dict, message: str) -> None:
    base = _cifar(tmp_path, "cifar10")
    (base / "test_batch").write_bytes(pickle.dumps(batch, protocol=2))
    with pytest.raises(ValueError, match=f"^{re.escape(str(base / 'test_batch'))}: .*{re.escape(message)}"):
        load_cifar(tmp_path, "cifar10")


def _numpy1(data: bytes) -> bytes:
    """A pickle as numpy 1 wrote it (the published batches): ``numpy.core`` where numpy 2 writes ``numpy._core``."""
    return data.replace(b"cnumpy._core.multiarray\n", b"cnumpy.core.multiarray\n").replace(
        b"\x8c\x13numpy._core.numeric", b"\x8c\x12numpy.core.numeric"
    )


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize("protocol", [2, 5])
@pytest.mark.parametrize("old", [False, True])
def test_cifar_batches_of_either_numpy_and_protocol_load(tmp_path: Path, protocol: int, old: bool) -> None:
    base = _cifar(tmp_path, "cifar10")
    content = {b"data": np.full((2, 3072), 5, np.uint8), b"labels": np.array([3, 4])}
    buffer = io.BytesIO()
    pickler = pickle._Pickler(buffer, protocol)  # the Python pickler, without frames, so names can be replaced
    pickler.framer.start_framing = lambda: None  # type: ignore[method-assign]
    pickler.dump(content)
    data = buffer.getvalue()
    (base / "test_batch").write_bytes(_numpy1(data) if old else data)
    if old:
        assert b"numpy._core" not in (base / "test_batch").read_bytes()
    x_test, y_test = load_cifar(tmp_path, "cifar10")[2:]
    assert y_test.tolist() == [3, 4] and int(x_test.sum()) == 2 * 3072 * 5


def test_a_cifar_batch_that_would_run_code_is_refused(tmp_path: Path) -> None:
    base = _cifar(tmp_path, "cifar10")
    (base / "test_batch").write_bytes(pickle.dumps({b"data": print}, protocol=2))
    with pytest.raises(pickle.UnpicklingError, match=r"^refusing to load __builtin__\.print from a data file$"):
        load_cifar(tmp_path, "cifar10")


def test_cifar_pixels_and_labels_stored_as_other_integers_come_as_uint8_and_int64(tmp_path: Path) -> None:
    base = _cifar(tmp_path, "cifar10")
    content = {b"data": np.full((2, 3072), 200, dtype=np.int64), b"labels": np.array([1, 2], dtype=np.uint8)}
    (base / "test_batch").write_bytes(pickle.dumps(content, protocol=2))
    x_test, y_test = load_cifar(tmp_path, "cifar10")[2:]
    assert x_test.dtype == np.uint8 and int(x_test.min()) == 200
    assert y_test.dtype == np.int64 and y_test.tolist() == [1, 2]


class _Python2Pickler(pickle._Pickler):  # type: ignore[name-defined]
    """Writes bytes as Python 2 wrote its ``str``: (SHORT_)BINSTRING, as in the published CIFAR batches."""

    dispatch = pickle._Pickler.dispatch.copy()  # type: ignore[attr-defined]

    def save_py2_str(self, obj: bytes) -> None:
        if len(obj) < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([len(obj)]) + obj)
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", len(obj)) + obj)
        self.memoize(obj)

    dispatch[bytes] = save_py2_str


def test_a_batch_pickled_by_python_2_loads(tmp_path: Path) -> None:
    base = _cifar(tmp_path, "cifar10")
    buffer = io.BytesIO()
    data = (np.arange(2 * 3072) % 256).astype(np.uint8).reshape(2, 3072)
    _Python2Pickler(buffer, 2).dump({b"data": data, b"labels": [3, 9], b"batch_label": b"testing batch 1 of 1"})
    assert b"_codecs" not in buffer.getvalue()
    (base / "test_batch").write_bytes(buffer.getvalue())
    x_test, y_test = load_cifar(tmp_path, "cifar10")[2:]
    assert y_test.tolist() == [3, 9] and np.array_equal(x_test.reshape(2, 3072), data)
