"""FEMNIST from a local copy saved with ``datasets.save_to_disk``, in flwrlabs/femnist's schema."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

datasets = pytest.importorskip("datasets", reason="FEMNIST is read through Hugging Face's datasets")

from fedsketch.data import DataSpec, load_federated

WRITERS = ["f0003_10", "f0001_41", "f0007_22", "f0002_05", "f0005_33"]
PER_WRITER = 20


@pytest.fixture(scope="module")
def femnist_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Five writers of 20 images each; every pixel of writer w's images equals 40 * w."""
    rows: dict[str, list] = {"image": [], "writer_id": [], "character": []}
    for w, writer in enumerate(WRITERS):
        for i in range(PER_WRITER):
            rows["image"].append(Image.fromarray(np.full((28, 28), 40 * w, dtype=np.uint8), mode="L"))
            rows["writer_id"].append(writer)
            rows["character"].append((w * 7 + i) % 62)
    features = datasets.Features(
        {
            "image": datasets.Image(),
            "writer_id": datasets.Value("string"),
            "character": datasets.ClassLabel(num_classes=62),
        }
    )
    root = tmp_path_factory.mktemp("femnist") / "saved"
    datasets.Dataset.from_dict(rows, features=features).save_to_disk(str(root))
    return root


def _writer_of(x: torch.Tensor, data_mean_std: tuple[float, float]) -> np.ndarray:
    mean, std = data_mean_std
    pixel = (x[:, 0, 0, 0] * std + mean) * 255.0
    return np.rint(pixel.numpy() / 40.0).astype(int)


def _mean_std() -> tuple[float, float]:
    pixels = np.repeat(40.0 * np.arange(len(WRITERS)), PER_WRITER - 2) / 255.0  # 18 training images each
    return float(pixels.mean()), float(pixels.std(ddof=1))


def test_natural_partition_is_one_client_per_writer(femnist_root: Path) -> None:
    data = load_federated(DataSpec(dataset="femnist", root=str(femnist_root), num_clients=5))
    assert data.num_clients == 5 and data.num_classes == 62 and data.input_shape == (1, 28, 28)
    assert data.train_x.shape == (5 * 18, 1, 28, 28) and data.test_x.shape == (
        5 * 2,
        1,
        28,
        28,
    )  # LEAF's 90/10
    # Clients are numbered in sorted writer-id order, as flwr-datasets' NaturalIdPartitioner does.
    expected = [WRITERS.index(w) for w in sorted(WRITERS)]
    for cid in range(5):
        x, _ = data.client_data(cid)
        assert set(_writer_of(x, _mean_std()).tolist()) == {expected[cid]}
    assert abs(float(data.train_x.mean())) < 1e-5 and abs(float(data.train_x.std()) - 1) < 1e-4
    assert sorted(_writer_of(data.test_x, _mean_std()).tolist()) == sorted(list(range(5)) * 2)  # the training figures
    assert data.train_x.dtype == torch.float32 and data.train_y.dtype == torch.int64
    for cid in range(5):
        rows = np.flatnonzero(np.asarray(WRITERS) == sorted(WRITERS)[cid])[0] * PER_WRITER
        chars = {(rows // PER_WRITER * 7 + i) % 62 for i in range(PER_WRITER)}
        assert set(data.client_data(cid)[1].tolist()) <= chars and len(data.client_data(cid)[1]) == 18


def test_fewer_clients_keep_a_random_subset_of_writers(femnist_root: Path) -> None:
    data = load_federated(DataSpec(dataset="femnist", root=str(femnist_root), num_clients=2, seed=1))
    assert data.num_clients == 2 and data.train_x.shape[0] == 2 * 18 and data.test_x.shape[0] == 2 * 2
    train_writers = {round(float(v), 4) for v in data.train_x[:, 0, 0, 0]}  # one pixel value per writer
    test_writers = {round(float(v), 4) for v in data.test_x[:, 0, 0, 0]}
    assert len(train_writers) == 2 and test_writers == train_writers  # tests come from the kept writers


def test_other_partitions_repartition_all_writers(femnist_root: Path) -> None:
    data = load_federated(DataSpec(dataset="femnist", root=str(femnist_root), num_clients=9, partition="iid"))
    assert data.num_clients == 9 and data.train_x.shape[0] == 90
    assert sorted(np.concatenate(data.client_indices).tolist()) == list(range(90))


def test_a_folder_without_the_schema_is_rejected(tmp_path: Path) -> None:
    datasets.Dataset.from_dict({"image": [1], "writer": ["a"]}).save_to_disk(str(tmp_path / "other"))
    with pytest.raises(ValueError, match="character"):
        load_federated(DataSpec(dataset="femnist", root=str(tmp_path / "other"), num_clients=1))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_tenth_of_each_writers_rows_rounded_down_is_held_out_at_random(seed: int) -> None:
    from fedsketch.data import femnist

    writers = np.array(["b"] * 25 + ["a"] * 9 + ["c"] * 10 + ["b"] * 6)
    held = femnist.split_rows(writers, seed)
    assert held.dtype == bool and held.shape == writers.shape
    assert {w: int(held[writers == w].sum()) for w in "abc"} == {"a": 0, "b": 3, "c": 1}
    assert np.array_equal(femnist.split_rows(writers, seed), held)
    others = [np.flatnonzero(femnist.split_rows(writers, s)).tolist() for s in range(3) if s != seed]
    assert np.flatnonzero(held).tolist() not in others


def test_the_held_out_rows_are_a_uniform_draw() -> None:
    from fedsketch.data import femnist

    writers = np.repeat(np.array(["w1", "w0"]), 10)
    counts = sum(femnist.split_rows(writers, s).astype(int) for s in range(400))
    assert counts.min() > 15 and counts.max() < 65  # each row held out about 40 times in 400 draws


def test_columns_and_images_come_as_saved(femnist_root: Path) -> None:
    from fedsketch.data import femnist

    ds = femnist.open_femnist(str(femnist_root))
    writers, chars = femnist.columns(ds)
    assert writers.tolist() == [w for w in WRITERS for _ in range(PER_WRITER)] and chars.dtype == np.int64
    assert chars.tolist() == [(w * 7 + i) % 62 for w in range(len(WRITERS)) for i in range(PER_WRITER)]
    pixels = femnist.images(ds, np.array([45, 0]))
    assert pixels.dtype == torch.uint8 and tuple(pixels.shape) == (2, 1, 28, 28)
    assert pixels[0].unique().tolist() == [80] and pixels[1].unique().tolist() == [0]
    empty = femnist.images(ds, np.array([], dtype=np.int64))
    assert empty.dtype == torch.uint8 and tuple(empty.shape) == (0, 1, 28, 28)


@pytest.mark.parametrize(("size", "mode"), [((28, 27), "L"), ((28, 28), "RGB")])
def test_images_that_are_not_28_by_28_gray_are_refused(tmp_path: Path, size: tuple[int, int], mode: str) -> None:
    from fedsketch.data import femnist

    rows = {"image": [Image.new(mode, size)], "writer_id": ["w"], "character": [1]}
    datasets.Dataset.from_dict(rows).cast_column("image", datasets.Image()).save_to_disk(str(tmp_path / "odd"))
    ds = femnist.open_femnist(str(tmp_path / "odd"))
    shape = (1, size[1], size[0]) if mode == "L" else (1, 28, 28, 3)
    with pytest.raises(
        ValueError, match=rf"^femnist: expected 28x28 grayscale uint8 images; got uint8 {re.escape(str(shape))}$"
    ):
        femnist.images(ds, np.array([0]))


def test_a_folder_with_nothing_saved_says_how_to_save_it(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError) as err:
        load_federated(DataSpec(dataset="femnist", root=str(tmp_path), num_clients=1))
    assert str(err.value) == (
        f"femnist: no dataset saved with datasets' save_to_disk at {tmp_path} (expected {tmp_path / 'dataset_info.json'}). "
        'On a machine with internet run `python -c "from datasets import load_dataset; '
        f"load_dataset('flwrlabs/femnist', split='train').save_to_disk('{tmp_path}')\"` and copy the folder here"
    )


def test_a_saved_dataset_dict_gives_its_train_split(femnist_root: Path, tmp_path: Path) -> None:
    from fedsketch.data import femnist

    split = datasets.load_from_disk(str(femnist_root))
    datasets.DatasetDict({"train": split.select(range(3))}).save_to_disk(str(tmp_path / "dict"))
    assert len(femnist.open_femnist(str(tmp_path / "dict"))) == 3
    datasets.DatasetDict({"test": split.select(range(3))}).save_to_disk(str(tmp_path / "other"))
    with pytest.raises(
        ValueError, match=rf"^femnist: {tmp_path / 'other'} holds splits \['test'\]; expected a 'train' split$"
    ):
        femnist.open_femnist(str(tmp_path / "other"))


def test_a_missing_column_is_named(tmp_path: Path) -> None:
    datasets.Dataset.from_dict({"image": [1], "writer": ["a"]}).save_to_disk(str(tmp_path / "other"))
    message = f"femnist: {tmp_path / 'other'} lacks columns ['character', 'writer_id']; has ['image', 'writer']"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        load_federated(DataSpec(dataset="femnist", root=str(tmp_path / "other"), num_clients=1))


def test_offline_hub_access_says_how_to_save_a_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    import flwr_datasets

    class Offline:
        def __init__(self, **kwargs: object) -> None:
            raise ConnectionError("no network")

    monkeypatch.setattr(flwr_datasets, "FederatedDataset", Offline)
    with pytest.raises(FileNotFoundError) as err:
        load_federated(DataSpec(dataset="femnist", num_clients=1))
    assert str(err.value) == (
        "femnist: could not fetch flwrlabs/femnist from the Hugging Face hub (ConnectionError: no network). "
        'Set the data root to a saved copy instead. On a machine with internet run `python -c "from datasets import '
        "load_dataset; load_dataset('flwrlabs/femnist', split='train').save_to_disk('ROOT')\"` and copy the folder here"
    )
    assert isinstance(err.value.__cause__, ConnectionError)


def test_without_a_root_the_hub_copy_is_asked_for_by_writer(
    femnist_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the hub would serve is stood in for by the saved copy: no network here."""
    import flwr_datasets
    from flwr_datasets.partitioner import NaturalIdPartitioner

    from fedsketch.data import femnist

    asked: list[dict[str, object]] = []
    saved = datasets.load_from_disk(str(femnist_root))

    class Hub:
        def __init__(self, **kwargs: object) -> None:
            asked.append(kwargs)

        def load_split(self, split: str) -> object:
            return saved if split == "train" else None

    monkeypatch.setattr(flwr_datasets, "FederatedDataset", Hub)
    assert femnist.open_femnist("") is saved
    [kwargs] = asked
    assert sorted(kwargs) == ["dataset", "partitioners", "shuffle"]
    assert kwargs["dataset"] == "flwrlabs/femnist" and kwargs["shuffle"] is False
    partitioners = kwargs["partitioners"]
    assert isinstance(partitioners, dict) and list(partitioners) == ["train"]
    assert (
        isinstance(partitioners["train"], NaturalIdPartitioner) and partitioners["train"]._partition_by == "writer_id"
    )


def test_characters_stored_as_another_number_type_come_as_int64_labels(tmp_path: Path) -> None:
    rows = {
        "image": [Image.new("L", (28, 28))] * 20,
        "writer_id": ["w"] * 20,
        "character": [float(c) for c in range(20)],
    }
    features = datasets.Features(
        {"image": datasets.Image(), "writer_id": datasets.Value("string"), "character": datasets.Value("float32")}
    )
    datasets.Dataset.from_dict(rows, features=features).save_to_disk(str(tmp_path / "small"))
    data = load_federated(DataSpec(dataset="femnist", root=str(tmp_path / "small"), num_clients=1))
    assert data.train_y.dtype == torch.int64 and data.test_y.dtype == torch.int64
    assert sorted(data.train_y.tolist() + data.test_y.tolist()) == list(range(20))
