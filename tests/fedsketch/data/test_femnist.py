"""FEMNIST from a local copy saved with ``datasets.save_to_disk``, in flwrlabs/femnist's schema."""

from __future__ import annotations

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


def test_offline_hub_access_says_how_to_save_a_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    import flwr_datasets

    class Offline:
        def __init__(self, **kwargs: object) -> None:
            raise ConnectionError("no network")

    monkeypatch.setattr(flwr_datasets, "FederatedDataset", Offline)
    with pytest.raises(FileNotFoundError, match="save_to_disk"):
        load_federated(DataSpec(dataset="femnist", num_clients=1))
