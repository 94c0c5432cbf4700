"""``dataset = "huggingface"``: data sets written with ``save_to_disk`` here, read back offline, split by
fedsketch's partitioners and by flwr-datasets' (``flwr-*``), and refused in one line where they cannot be used."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pytest
import torch
from PIL import Image

from fedsketch.config import ConfigError, RunConfig
from fedsketch.data import DataSpec, huggingface, load_federated
from fedsketch.data.checks import DataError
from fedsketch.data.huggingface import _SAVE_HINT

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


def _split(**columns: list) -> datasets.Dataset:
    return datasets.Dataset.from_dict(columns)


def _save(root: Path, train: datasets.Dataset, test: datasets.Dataset) -> Path:
    datasets.DatasetDict({"train": train, "test": test}).save_to_disk(str(root))
    return root


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
    message = r"^huggingface:.*/one holds one split \(a Dataset, not a DatasetDict\): set 'hf-test-fraction' to hold out a test set$"
    with pytest.raises(ValueError, match=message):
        _load(root, **settings)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"hf_label": "lbl"}, r"the training split has no column 'lbl' \(setting 'hf-label'\); it has \['image'"),
        (
            {"hf_test_split": "validation"},
            (
                r"no split 'validation' \(setting 'hf-test-split'\); it has \['train', 'test'\] "
                r"\(or hold out part of the training split: 'hf-test-fraction'\)$"
            ),
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
    with pytest.raises(
        DataError,
        match=r"^huggingface:.*: column 'note' holds <U4; features are one image column or numbers "
        r"\(setting 'hf-features' names them\)$",
    ):
        _load(root, partition="iid", num_clients=4, hf_label="diagnosis")
    message = (
        r"column 'radius' \(setting 'hf-label'\) holds float64; expected class labels of one kind "
        r"\(a ClassLabel, integers or strings\)$"
    )
    with pytest.raises(DataError, match=message):
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


def test_string_labels_are_one_mapping_for_train_and_test(tmp_path: Path) -> None:
    train = _split(x=[0.0, 1.0, 2.0, 3.0, 4.0, 5.0], label=["pear", "apple", "fig", "pear", "apple", "fig"])
    test = _split(x=[1.0, 2.0, 3.0], label=["pear", "pear", "fig"])  # no 'apple': the index must not shift
    data = _load(_save(tmp_path / "fruit", train, test), partition="iid", num_clients=2)
    assert data.num_classes == 3
    assert data.train_y.tolist() == [2, 0, 1, 2, 0, 1] and data.test_y.tolist() == [2, 2, 1]


def test_integer_labels_keep_their_values_and_classes_come_from_both_splits(tmp_path: Path) -> None:
    train = _split(x=[0.0, 1.0, 2.0, 3.0], label=[3, 0, 3, 0])
    test = _split(x=[1.0, 2.0], label=[5, 0])
    data = _load(_save(tmp_path / "ints", train, test), partition="iid", num_clients=2)
    assert data.train_y.tolist() == [3, 0, 3, 0] and data.test_y.tolist() == [5, 0] and data.num_classes == 6
    assert data.train_y.dtype == torch.int64


def test_a_test_label_unseen_in_training_is_refused(tmp_path: Path) -> None:
    root = _save(tmp_path / "unseen", _split(x=[0.0, 1.0], label=["a", "b"]), _split(x=[0.0, 1.0], label=["b", "c"]))
    with pytest.raises(DataError, match=rf"^huggingface:{root}: test label 'c' at index 1 is not a training label$"):
        _load(root, partition="iid", num_clients=1)


def test_numbers_are_standardized_with_the_training_splits_figures(tmp_path: Path) -> None:
    train = _split(a=[1.0, 3.0, 5.0, 7.0], b=[2, 2, 2, 2], c=[True, False, True, False], label=[0, 1, 0, 1])
    test = _split(a=[4.0, 9.0], b=[2, 4], c=[True, True], label=[0, 1])
    data = _load(_save(tmp_path / "t", train, test), partition="iid", num_clients=1)
    std_a = float(np.std([1.0, 3.0, 5.0, 7.0]))
    assert data.input_shape == (3,) and data.train_x.dtype == data.test_x.dtype == torch.float32
    assert np.allclose(data.train_x[:, 0].numpy(), (np.array([1, 3, 5, 7]) - 4) / std_a)
    assert np.allclose(data.test_x[:, 0].numpy(), (np.array([4, 9]) - 4) / std_a)  # the training mean and std
    assert data.train_x[:, 1].tolist() == [0.0] * 4  # a constant column is 0, not NaN
    assert data.test_x[1, 1] == pytest.approx(2 / 1e-8, rel=1e-4)
    assert np.allclose(data.train_x[:, 2].numpy(), [1, -1, 1, -1]) and np.allclose(data.test_x[:, 2].numpy(), [1, 1])


def test_large_numbers_keep_their_differences(tmp_path: Path) -> None:
    """Standardized before they become float32: timestamps a few units apart stay apart."""
    stamps = [1_700_000_000_001, 1_700_000_000_003, 1_700_000_000_001, 1_700_000_000_003]
    root = _save(tmp_path / "stamps", _split(t=stamps, label=[0, 1, 0, 1]), _split(t=stamps[:2], label=[0, 1]))
    data = _load(root, partition="iid", num_clients=1)
    assert data.train_x[:, 0].tolist() == [-1.0, 1.0, -1.0, 1.0] and data.test_x[:, 0].tolist() == [-1.0, 1.0]


def test_the_client_ids_are_read_from_the_training_split_only(tmp_path: Path) -> None:
    train = _split(x=[1.0, 2.0, 3.0, 4.0], label=[0, 1, 0, 1], who=["q", "p", "q", "p"])
    root = _save(tmp_path / "ids", train, _split(x=[1.0], label=[0]))
    data = _load(root, partition="natural", num_clients=2, hf_client_id="who", num_classes=3)
    assert [p.tolist() for p in data.client_indices] == [[1, 3], [0, 2]] and data.num_classes == 3  # integer labels


def test_a_held_out_fraction_of_a_training_split_follows_the_seed(tmp_path: Path) -> None:
    root = _save(
        tmp_path / "frac",
        _split(x=[float(i) for i in range(40)], label=[i % 2 for i in range(40)]),
        _split(x=[0.0], label=[0]),
    )
    held = [
        np.sort(_load(root, partition="iid", num_clients=1, hf_test_fraction=0.25, seed=s).test_x[:, 0].numpy())
        for s in (0, 0, 1)
    ]
    assert held[0].shape == (10,) and np.array_equal(held[0], held[1]) and not np.array_equal(held[0], held[2])


def test_the_statistics_skip_a_nan_so_the_checks_name_that_sample(tmp_path: Path) -> None:
    train = _split(a=[1.0, float("nan"), 3.0], label=[0, 1, 0])
    root = _save(tmp_path / "nan", train, _split(a=[2.0], label=[1]))
    from fedsketch.data import huggingface

    got = huggingface.load(DataSpec(dataset="huggingface", root=str(root)))
    assert np.isnan(got.x_train[1, 0]) and got.x_train[[0, 2], 0].tolist() == [-1.0, 1.0] and got.x_test[0, 0] == 0.0
    assert got.x_train.dtype == np.float32 and got.client_ids is None and got.num_classes is None


def test_without_hf_features_every_column_but_the_label_and_client_id_is_a_feature(tmp_path: Path) -> None:
    train = _split(z=[1.0, 2.0, 3.0, 4.0], label=[0, 1, 0, 1], who=[0, 0, 1, 1], a=[[1, 2], [3, 4], [5, 6], [7, 9]])
    root = _save(tmp_path / "cols", train, train)
    data = _load(root, partition="natural", num_clients=2, hf_client_id="who")
    assert data.input_shape == (3,)  # z, then a's two values
    assert np.allclose(data.train_x[:, 0].numpy() * np.std([1, 2, 3, 4]) + 2.5, [1, 2, 3, 4])
    assert np.allclose(data.train_x[:, 2].numpy() * np.std([2, 4, 6, 9]) + 5.25, [2, 4, 6, 9])
    assert [p.tolist() for p in data.client_indices] == [[0, 1], [2, 3]]
    spaced = _load(root, partition="iid", num_clients=2, hf_features=" a , z ,")
    assert spaced.input_shape == (3,) and np.allclose(spaced.train_x[:, 2].numpy(), data.train_x[:, 0].numpy())


def test_a_label_alone_is_no_data(tmp_path: Path) -> None:
    root = _save(tmp_path / "bare", _split(label=[0, 1]), _split(label=[0, 1]))
    with pytest.raises(
        ValueError, match=rf"^huggingface:{root}: no feature column beside the label \(setting 'hf-features'\)$"
    ):
        _load(root, partition="iid", num_clients=1)


def test_a_test_split_without_a_feature_is_refused_naming_it(tmp_path: Path) -> None:
    root = _save(tmp_path / "lack", _split(a=[1.0, 2.0], b=[1.0, 2.0], label=[0, 1]), _split(a=[1.0], label=[0]))
    with pytest.raises(
        ValueError, match=r"the test split has no column 'b' \(setting 'hf-features'\); it has \['a', 'label'\]$"
    ):
        _load(root, partition="iid", num_clients=1, hf_features="a,b")


def test_numbers_of_different_lengths_are_refused(tmp_path: Path) -> None:
    root = _save(tmp_path / "ragged", _split(a=[[1.0, 2.0], [1.0]], label=[0, 1]), _split(a=[[1.0, 2.0]], label=[0]))
    with pytest.raises(DataError, match=r"column 'a': row 1 has shape \(1,\); row 0 has \(2,\)$"):
        _load(root, partition="iid", num_clients=1)


def test_test_images_of_another_size_are_refused(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    features = datasets.Features({"image": datasets.Image(), "label": datasets.Value("int64")})
    train = datasets.Dataset.from_dict({"image": _images(rng, np.array([0, 1])), "label": [0, 1]}, features=features)
    test = datasets.Dataset.from_dict({"image": _images(rng, np.array([0]), size=6), "label": [0]}, features=features)
    root = _save(tmp_path / "sizes", train, test)
    message = rf"^huggingface:{root}: test images are \(1, 6, 6\) \(C, H, W\); training images are \(1, 8, 8\)$"
    with pytest.raises(DataError, match=message):
        _load(root, partition="iid", num_clients=1)


@pytest.mark.parametrize(
    ("mode", "channels"), [("L", 1), ("RGB", 3), ("1", 1), ("I", 1), ("I;16", 1), ("F", 1), ("RGBA", 3), ("P", 3)]
)
def test_the_first_image_decides_gray_or_rgb(tmp_path: Path, mode: str, channels: int) -> None:
    pictures = [Image.new(mode, (3, 2), color=1) for _ in range(2)]
    features = datasets.Features({"image": datasets.Image(), "label": datasets.Value("int64")})
    split = datasets.Dataset.from_dict({"image": pictures, "label": [0, 1]}, features=features)
    data = _load(_save(tmp_path / "m", split, split), partition="iid", num_clients=1)
    assert data.input_shape == (channels, 2, 3) and data.train_x.dtype == torch.float32


def test_the_mode_of_the_first_training_image_holds_for_all(tmp_path: Path) -> None:
    pictures = [Image.new("L", (3, 2), color=9), Image.new("RGB", (3, 2), color=(1, 2, 3))]
    features = datasets.Features({"image": datasets.Image(), "label": datasets.Value("int64")})
    split = datasets.Dataset.from_dict({"image": pictures, "label": [0, 1]}, features=features)
    assert _load(_save(tmp_path / "mixed", split, split), partition="iid", num_clients=1).input_shape == (1, 2, 3)


def test_test_images_of_two_sizes_are_refused_naming_the_test_split(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    features = datasets.Features({"image": datasets.Image(), "label": datasets.Value("int64")})
    train = datasets.Dataset.from_dict({"image": _images(rng, np.array([0, 1])), "label": [0, 1]}, features=features)
    pictures = _images(rng, np.array([0])) + _images(rng, np.array([1]), size=5)
    test = datasets.Dataset.from_dict({"image": pictures, "label": [0, 1]}, features=features)
    message = r": test images of column 'image': row 1 has shape \(5, 5\); row 0 has \(8, 8\)$"
    with pytest.raises(DataError, match=message):
        _load(_save(tmp_path / "sizes", train, test), partition="iid", num_clients=1)


def test_pixels_are_scaled_and_standardized_per_channel(tmp_path: Path) -> None:
    colors = [(0, 51, 255), (255, 51, 0), (0, 102, 255), (255, 102, 0)]
    features = datasets.Features({"image": datasets.Image(), "label": datasets.Value("int64")})
    split = datasets.Dataset.from_dict(
        {"image": [Image.new("RGB", (2, 2), color=c) for c in colors], "label": [0, 1, 0, 1]}, features=features
    )
    data = _load(_save(tmp_path / "rgb", split, split), partition="iid", num_clients=1)
    assert np.allclose(data.train_x[:, 0, 0, 0].numpy(), [-1, 1, -1, 1], atol=1e-5)
    assert np.allclose(data.train_x[:, 1, 1, 1].numpy(), [-1, -1, 1, 1], atol=1e-5)
    assert np.allclose(data.train_x[:, 2, 0, 1].numpy(), [1, -1, 1, -1], atol=1e-5)


def test_an_empty_data_root_says_what_to_set() -> None:
    with pytest.raises(
        FileNotFoundError,
        match="^huggingface: the data root is empty: set it to a folder written by save_to_disk, or a hub name$",
    ):
        load_federated(DataSpec(dataset="huggingface", root="", partition="iid"))


def test_files_datasets_cannot_read_are_refused_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "rows.json").write_text("{not json\n" * 3, encoding="utf-8")
    with pytest.raises(FileNotFoundError) as err:
        _load(tmp_path / "bad", partition="iid")
    with pytest.raises(Exception) as raised:  # what datasets itself says, told in one line
        datasets.load_dataset(str(tmp_path / "bad"))
    why = huggingface._why(raised.value)
    assert (
        str(err.value)
        == f"huggingface: datasets could not open '{tmp_path / 'bad'}' ({why}); to work offline, " + _SAVE_HINT
    )
    assert err.value.__suppress_context__


def test_a_missing_value_is_refused_naming_its_sample(tmp_path: Path) -> None:
    root = _save(tmp_path / "gap", _split(a=[1.0, None, 3.0], label=[0, 1, 0]), _split(a=[2.0], label=[1]))
    with pytest.raises(DataError, match=rf"^x_train of huggingface:{root}: sample 1 holds NaN"):
        _load(root, partition="iid", num_clients=1)


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


@pytest.mark.parametrize("empty", ["train", "test"])
def test_a_saved_folder_datasets_cannot_read_back_is_refused_in_one_line(tmp_path: Path, empty: str) -> None:
    """A split saved without rows: datasets writes it, and fails with an IndexError deep inside when reading it."""
    table = datasets.load_from_disk(str(save_table(tmp_path / "full", rows=20)))
    none = {
        name: datasets.Dataset.from_dict({key: [] for key in s.column_names}, s.features) for name, s in table.items()
    }
    splits = {name: none[name] if name == empty else split for name, split in table.items()}
    datasets.DatasetDict(splits).save_to_disk(str(tmp_path / "cut"))
    root = tmp_path / "cut"
    with pytest.raises(
        DataError, match=rf"^huggingface: datasets could not read the saved folder {root} \(IndexError: "
    ):
        _load(root, hf_label="diagnosis", hf_features="radius,pair")


@pytest.mark.parametrize(
    ("train", "test", "held"),
    [([0, 1], ["a", "b"], "int64 in training, <U1 in test"), (["a", "b"], [0, 1], "<U1 in training, int64 in test")],
)
def test_labels_of_two_kinds_are_refused_naming_both(tmp_path: Path, train: list, test: list, held: str) -> None:
    root = _save(tmp_path / "kinds", _split(x=[0.0, 1.0], label=train), _split(x=[0.0, 1.0], label=test))
    message = (
        f"huggingface:{root}: column 'label' (setting 'hf-label') holds {held}; expected class labels of one kind "
        "(a ClassLabel, integers or strings)"
    )
    with pytest.raises(DataError) as caught:
        _load(root, partition="iid", num_clients=1)
    assert str(caught.value) == message


@pytest.mark.parametrize("split", ["training", "test"])
@pytest.mark.parametrize("kind", [[1, 0], ["cat", "dog"]])  # integers, or strings: not a class named "None"
def test_a_missing_label_is_refused_naming_its_row_and_split(tmp_path: Path, split: str, kind: list[Any]) -> None:
    a, b = kind
    gap, full = (
        _split(x=[0.0, 1.0, 2.0, 3.0], label=[b, None, a, None]),
        _split(x=[0.0, 1.0, 2.0, 3.0], label=[b, a, a, b]),
    )
    root = _save(tmp_path / "gap", *((gap, full) if split == "training" else (full, gap)))
    with pytest.raises(DataError) as caught:
        _load(root, partition="iid", num_clients=1)
    assert (
        str(caught.value)
        == f"huggingface:{root}: column 'label' (setting 'hf-label') has no label at row 1 of the {split} split"
    )


def test_a_feature_column_without_a_finite_value_is_refused_as_nan(tmp_path: Path) -> None:
    root = _save(
        tmp_path / "nan", _split(a=[float("nan")] * 2, b=[1.0, 2.0], label=[0, 1]), _split(a=[1.0], b=[1.0], label=[0])
    )
    with pytest.raises(DataError, match=rf"^x_train of huggingface:{root}: sample 0 holds NaN"):
        _load(root, partition="iid", num_clients=1)


def test_an_error_of_datasets_is_told_in_one_line_of_at_most_300_characters() -> None:
    told = huggingface._why(ValueError("first line\n   second\tline " + "x" * 400))
    assert told == "ValueError: first line second line " + "x" * (300 - len("first line second line "))


def test_a_folder_of_csv_files_is_read_by_datasets_own_builder(tmp_path: Path) -> None:
    folder = tmp_path / "csvs"
    folder.mkdir()
    (folder / "train.csv").write_text("x,label\n" + "".join(f"{i}.5,{i % 2}\n" for i in range(6)), encoding="utf-8")
    (folder / "test.csv").write_text("x,label\n1.0,0\n2.0,1\n", encoding="utf-8")
    data = _load(folder, partition="iid", num_clients=2)
    assert (data.train_y.tolist(), data.test_y.tolist()) == ([0, 1, 0, 1, 0, 1], [0, 1])


@pytest.mark.parametrize("root", ["./no-such-folder", "~/no-such-folder-of-fedsketch"])
def test_a_relative_or_home_folder_that_does_not_exist_is_named(root: str) -> None:
    with pytest.raises(FileNotFoundError) as caught:
        load_federated(DataSpec(dataset="huggingface", root=root, num_clients=1))
    assert str(caught.value) == f"huggingface: no folder {Path(root).expanduser()}; " + _SAVE_HINT


def test_a_client_id_column_missing_from_training_is_refused_naming_its_setting(tmp_path: Path) -> None:
    root = _save(tmp_path / "ids", _split(x=[0.0, 1.0], label=[0, 1]), _split(x=[0.0], label=[0]))
    with pytest.raises(ValueError) as caught:
        _load(root, partition="natural", num_clients=1, hf_client_id="who")
    assert str(caught.value) == (
        f"huggingface:{root}: the training split has no column 'who' (setting 'hf-client-id'); it has ['x', 'label']"
    )


def test_a_class_label_fixes_the_classes_even_those_no_sample_has(tmp_path: Path) -> None:
    features = datasets.Features({"x": datasets.Value("float64"), "label": datasets.ClassLabel(num_classes=5)})
    split = datasets.Dataset.from_dict({"x": [0.0, 1.0, 2.0, 3.0], "label": [0, 1, 0, 1]}, features=features)
    assert _load(_save(tmp_path / "five", split, split), partition="iid", num_clients=1).num_classes == 5


@pytest.mark.parametrize("seed", [0, 3])
def test_the_held_out_rows_are_datasets_own_split_with_the_fraction_and_the_run_seed(tmp_path: Path, seed: int) -> None:
    table = _split(x=[float(i) for i in range(20)], label=list(range(20)))  # each row its own label: the rows show
    table.save_to_disk(str(tmp_path / "one"))
    data = _load(tmp_path / "one", partition="iid", num_clients=1, hf_test_fraction=0.2, seed=seed)
    assert sorted(data.test_y.tolist()) == sorted(table.train_test_split(test_size=0.2, seed=seed)["test"]["label"])
