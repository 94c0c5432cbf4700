"""``dataset = "huggingface"``: data sets written with ``save_to_disk`` here, read back offline, split by
fedsketch's partitioners and by flwr-datasets' (``flwr-*``), and refused in one line where they cannot be used."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pytest
from PIL import Image

from fedsketch.config import ConfigError, RunConfig
from fedsketch.data import DataSpec, load_federated
from fedsketch.data.checks import DataError

CLASSES = 4


def _images(rng: np.random.Generator, labels: np.ndarray, mode: str = "L", size: int = 8) -> list[Image.Image]:
    shape = (size, size) if mode == "L" else (size, size, 3)
    return [Image.fromarray((rng.random(shape) * 60 + 40 * y).astype(np.uint8), mode=mode) for y in labels]


def save_digits(root: Path, train: int = 400, test: int = 100, writers: int = 10, mode: str = "L") -> Path:
    """Small 8x8 images of 4 classes, with a ``writer`` column, as ``save_to_disk`` writes a hub data set."""
    rng = np.random.default_rng(7)
    features = datasets.Features(
        {
            "image": datasets.Image(),
            "label": datasets.ClassLabel(num_classes=CLASSES),
            "writer": datasets.Value("int64"),
        }
    )

    def split(n: int) -> datasets.Dataset:
        y = rng.integers(0, CLASSES, n)
        columns = {"image": _images(rng, y, mode), "label": y.tolist(), "writer": rng.integers(0, writers, n).tolist()}
        return datasets.Dataset.from_dict(columns, features=features)

    datasets.DatasetDict({"train": split(train), "test": split(test)}).save_to_disk(str(root))
    return root


def save_table(root: Path, rows: int = 300, one_split: bool = False) -> Path:
    """A tabular set: float, int, bool and fixed-length list features, string labels, a text column."""
    rng = np.random.default_rng(3)
    kinds = np.array(["benign", "malignant", "unknown"])
    y = rng.integers(0, 3, rows)
    table = datasets.Dataset.from_dict(
        {
            "radius": (rng.normal(size=rows) * 100 + 50 * y).tolist(),
            "count": rng.integers(0, 5, rows).tolist(),
            "flag": (y == 1).tolist(),
            "pair": rng.normal(size=(rows, 2)).tolist(),
            "note": ["text"] * rows,
            "diagnosis": kinds[y].tolist(),
        }
    )
    if one_split:
        table.save_to_disk(str(root))
    else:
        cut = rows * 4 // 5
        datasets.DatasetDict({"train": table.select(range(cut)), "test": table.select(range(cut, rows))}).save_to_disk(
            str(root)
        )
    return root


@pytest.fixture(scope="module")
def digits(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_digits(tmp_path_factory.mktemp("hf") / "digits")


def _load(root: Path, **settings: Any) -> Any:
    return load_federated(DataSpec(dataset="huggingface", root=str(root), **{"num_clients": 10, **settings}))


def test_saved_images_load_as_standardized_gray_tensors(digits: Path) -> None:
    data = _load(digits, partition="iid")
    assert data.name == f"huggingface:{digits}"
    assert data.input_shape == (1, 8, 8) and data.num_classes == CLASSES  # the ClassLabel fixes the classes
    assert tuple(data.train_x.shape) == (400, 1, 8, 8) and tuple(data.test_x.shape) == (100, 1, 8, 8)
    assert abs(float(data.train_x.mean())) < 1e-4 and abs(float(data.train_x.std()) - 1.0) < 1e-2
    saved = datasets.load_from_disk(str(digits))
    assert data.train_y.tolist() == saved["train"]["label"]  # rows in the saved order
    first = np.asarray(saved["train"][0]["image"], dtype=np.float32) / 255.0
    raw = first.reshape(-1)
    again = data.train_x[0].reshape(-1).numpy()
    assert np.corrcoef(raw, again)[0, 1] > 0.999  # the same pixels, standardized


def test_rgb_images_keep_three_channels(tmp_path: Path) -> None:
    data = _load(save_digits(tmp_path / "rgb", train=60, test=20, mode="RGB"), partition="iid", num_clients=3)
    assert data.input_shape == (3, 8, 8)


@pytest.mark.parametrize("partition", ["flwr-iid", "flwr-dirichlet", "flwr-pathological", "flwr-shard"])
def test_flwr_partitioners_split_every_sample_once_and_follow_the_seed(digits: Path, partition: str) -> None:
    parts = _load(digits, partition=partition).client_indices
    assert len(parts) == 10 and all(p.size for p in parts)
    joined = np.concatenate(parts)
    assert np.unique(joined).size == joined.size  # no sample twice
    assert [p.tolist() for p in _load(digits, partition=partition, seed=0).client_indices] == [
        p.tolist() for p in parts
    ]
    assert [p.tolist() for p in _load(digits, partition=partition, seed=1).client_indices] != [
        p.tolist() for p in parts
    ]


def test_flwr_dirichlet_is_the_split_a_flower_app_gets_with_the_run_seed(digits: Path) -> None:
    """What a Flower app gets from ``FederatedDataset(..., seed=s)`` with ``DirichletPartitioner(..., seed=s)``:
    the split shuffled with the seed, then partitioned with it."""
    from flwr_datasets.partitioner import DirichletPartitioner

    seed = 3
    data = _load(digits, partition="flwr-dirichlet", alpha=0.7, seed=seed)
    train = datasets.load_from_disk(str(digits))["train"]
    partitioner = DirichletPartitioner(num_partitions=10, partition_by="label", alpha=0.7, seed=seed)
    partitioner.dataset = train.add_column("row", list(range(len(train)))).shuffle(seed=seed)
    flower = [sorted(partitioner.load_partition(i)["row"]) for i in range(10)]
    assert [p.tolist() for p in data.client_indices] == flower


def test_flwr_iid_sizes_and_pathological_classes(digits: Path) -> None:
    sizes = [p.size for p in _load(digits, partition="flwr-iid").client_indices]
    assert sizes == [40] * 10
    data = _load(digits, partition="flwr-pathological", classes_per_client=2)
    held = [np.unique(data.train_y[p].numpy()).size for p in (np.asarray(i) for i in data.client_indices)]
    assert max(held) <= 2 and min(held) >= 1


def test_flwr_natural_id_gives_each_writer_its_rows(digits: Path) -> None:
    data = _load(digits, partition="flwr-natural-id", hf_client_id="writer")
    writers = np.asarray(datasets.load_from_disk(str(digits))["train"]["writer"])
    # NaturalIdPartitioner numbers the ids in sorted order, as fedsketch's own `natural` does
    assert [p.tolist() for p in data.client_indices] == [np.flatnonzero(writers == w).tolist() for w in range(10)]
    assert [p.tolist() for p in _load(digits, partition="natural", hf_client_id="writer").client_indices] == [
        p.tolist() for p in data.client_indices
    ]


def test_flwr_partitioner_applies_to_other_data() -> None:
    data = load_federated(DataSpec(partition="flwr-dirichlet", num_clients=20, synthetic_devices=30))
    assert data.num_clients == 20 and all(p.size for p in data.client_indices)


def test_tables_read_numbers_and_sort_string_labels(tmp_path: Path) -> None:
    root = save_table(tmp_path / "table")
    data = _load(root, partition="iid", num_clients=4, hf_label="diagnosis", hf_features="radius,count,flag,pair")
    assert data.input_shape == (5,) and data.num_classes == 3  # radius, count, flag, the pair's two values
    saved = datasets.load_from_disk(str(root))["train"]
    assert data.train_y.tolist() == [["benign", "malignant", "unknown"].index(v) for v in saved["diagnosis"]]
    x = data.train_x.numpy()
    assert np.allclose(x.mean(axis=0), 0.0, atol=1e-5) and np.allclose(x.std(axis=0), 1.0, atol=1e-3)
    assert np.corrcoef(x[:, 0], np.asarray(saved["radius"]))[0, 1] > 0.9999


def test_one_saved_split_with_a_held_out_fraction(tmp_path: Path) -> None:
    root = save_table(tmp_path / "one", one_split=True)
    settings = {"partition": "iid", "num_clients": 4, "hf_label": "diagnosis", "hf_features": "radius,count"}
    data = _load(root, hf_test_fraction=0.25, **settings)
    assert (data.train_y.shape[0], data.test_y.shape[0]) == (225, 75)
    with pytest.raises(ValueError, match="holds one split .* set 'hf-test-fraction'"):
        _load(root, **settings)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"hf_label": "lbl"}, r"the training split has no column 'lbl' \(setting 'hf-label'\); it has \['image'"),
        (
            {"hf_test_split": "validation"},
            r"no split 'validation' \(setting 'hf-test-split'\); it has \['train', 'test'\]",
        ),
        ({"hf_train_split": "all"}, r"no split 'all' \(setting 'hf-train-split'\)"),
        ({"hf_features": "image,writer"}, r"image column 'image' must be the only feature column"),
        ({"num_classes": 5}, r"setting 'num-classes' is 5 but column 'label' has 4"),
        ({"partition": "flwr-natural-id"}, r"'flwr-natural-id' needs the data's own client ids"),
        (
            {"partition": "flwr-natural-id", "hf_client_id": "writer", "num_clients": 4},
            r"setting 'num-clients' is 4 but the data has 10 distinct client ids",
        ),
        ({"partition": "natural"}, r"has no natural clients"),
    ],
)
def test_refusals_name_the_setting(digits: Path, settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _load(digits, **{"partition": "iid", **settings})


def test_text_features_and_float_labels_are_refused(tmp_path: Path) -> None:
    root = save_table(tmp_path / "table")
    with pytest.raises(DataError, match=r"column 'note' holds <U4; features are one image column or numbers"):
        _load(root, partition="iid", num_clients=4, hf_label="diagnosis")
    with pytest.raises(DataError, match=r"column 'radius' \(setting 'hf-label'\) holds float64"):
        _load(root, partition="iid", num_clients=4, hf_label="radius", hf_features="count")


def test_images_of_two_sizes_are_refused(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    pictures = _images(rng, np.zeros(3, dtype=int)) + _images(rng, np.zeros(1, dtype=int), size=9)
    split = datasets.Dataset.from_dict({"image": pictures, "label": [0, 1, 0, 1]}).cast_column(
        "image", datasets.Image()
    )
    datasets.DatasetDict({"train": split, "test": split}).save_to_disk(str(tmp_path / "mixed"))
    with pytest.raises(
        DataError, match=r"train images of column 'image': row 3 has shape \(9, 9\); row 0 has \(8, 8\)"
    ):
        _load(tmp_path / "mixed", partition="iid", num_clients=2)


def test_a_missing_folder_says_how_to_save_one() -> None:
    with pytest.raises(FileNotFoundError, match=r"huggingface: no folder /nowhere/digits; on a machine with internet"):
        _load(Path("/nowhere/digits"), partition="iid")


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"dataset": "npz", "hf-label": "y"}, r"setting 'hf-label' \('y'\) is read only by dataset 'huggingface'"),
        ({"dataset": "huggingface", "hf-test-fraction": 1.0}, r"'hf-test-fraction' must be in \[0, 1\)"),
        (
            {"dataset": "huggingface", "hf-test-fraction": 0.2, "hf-test-split": "valid"},
            "'hf-test-fraction' .* and 'hf-test-split' .* both name the test set",
        ),
        (
            {"partition": "flwr-iid", "partition-alpha": 0.3},
            r"read only by partition 'dirichlet'; partition is 'flwr-iid', .* \('flwr-dirichlet' reads it too\)",
        ),
        ({"partition": "flwr-random"}, "setting 'partition' must be one of .*flwr-natural-id"),
    ],
)
def test_settings_are_checked_with_the_config(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        RunConfig.from_mapping(settings)


def test_flwr_partitions_take_their_partitioner_settings() -> None:
    assert RunConfig.from_mapping({"partition": "flwr-dirichlet", "partition-alpha": 0.3}).partition_alpha == 0.3
    assert RunConfig.from_mapping({"partition": "flwr-shard", "shards-per-client": 3}).shards_per_client == 3


@pytest.mark.slow
def test_a_saved_data_set_runs_through_fedsketch_run_the_same_twice(
    digits: Path, tmp_path: Path, no_leftover_processes: None
) -> None:
    """Offline: the saved folder, split by flwr-datasets' Dirichlet partitioner, trained with FetchSGD through
    real Flower twice with the same seed: the same rows to the last digit."""
    from experiments.cli import main as fedsketch_main

    settings = {
        "dataset": "huggingface",
        "data-root": str(digits),
        "partition": "flwr-dirichlet",
        "partition-alpha": 1.0,
        "num-clients": 10,
        "clients-per-round": 5,
        "num-rounds": 2,
        "eval-every": 1,
        "model-hidden": 32,
        "sketch-rows": 3,
        "sketch-cols": 2000,
        "k": 200,
    }
    overrides = [a for key, value in settings.items() for a in ("--set", f"{key}={json.dumps(value)}")]
    rows = []
    for attempt in ("first", "second"):
        args = ["run", "--strategies", "fetchsgd", "--no-plot", "--out", str(tmp_path / attempt), *overrides]
        assert fedsketch_main(args) == 0
        found = (tmp_path / attempt / "default" / "fetchsgd" / "metrics.jsonl").read_text().splitlines()
        rows.append([{k: v for k, v in json.loads(line).items() if k not in ("wall_s", "unix_time")} for line in found])
    assert [r["round"] for r in rows[0]] == [1, 2] and rows[0][-1]["clients"] == 5
    assert 0.0 < rows[0][-1]["test_accuracy"] <= 1.0
    assert rows[0] == rows[1]


def test_the_command_refuses_bad_hugging_face_data_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same checks as every data set, before anything starts: a NaN feature names the array and the sample."""
    from experiments.cli import main as fedsketch_main

    rows = datasets.Dataset.from_dict({"x": [0.5, 1.0, float("nan"), 2.0] * 5, "label": [0, 1] * 10})
    datasets.DatasetDict({"train": rows, "test": rows}).save_to_disk(str(tmp_path / "nan"))
    capsys.readouterr()  # datasets' progress bars while saving
    out = tmp_path / "runs"
    args = ["plan", "--out", str(out), "--set", "dataset=huggingface", "--set", f'data-root="{tmp_path / "nan"}"']
    assert (
        fedsketch_main([*args, "--set", "partition=flwr-iid", "--set", "num-clients=4", "--set", "clients-per-round=2"])
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert err == (
        f"fedsketch: error: data: x_train of huggingface:{tmp_path / 'nan'}: sample 2 holds NaN (5 of 20 samples are not "
        "finite as float32); clean or drop them before training"
    )
    assert not out.exists()
