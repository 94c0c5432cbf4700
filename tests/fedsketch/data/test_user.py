"""Your own model and data by reference: entry points, loaders of every accepted shape, image folders."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import TensorDataset

from fedsketch.config import ConfigError, RunConfig
from fedsketch.data import DataSpec, load_federated, user
from fedsketch.data.checks import DataError
from fedsketch.model.models import build_model
from fedsketch.settings import entry

EXAMPLE = Path(__file__).resolve().parents[2] / "example"


@pytest.fixture
def lab(monkeypatch: pytest.MonkeyPatch) -> Path:
    """The example package (tests/example/mylab) importable, as from its own folder (a copy an earlier test
    imported from elsewhere is forgotten for the test)."""
    for name in [n for n in sys.modules if n == "mylab" or n.startswith("mylab.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.syspath_prepend(str(EXAMPLE))
    return EXAMPLE


def _module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, source: str) -> None:
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(source), encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))


def test_a_reference_names_a_function_and_its_folder(lab: Path) -> None:
    from mylab.model import build

    assert entry.load("model", "mylab.model:build") is build
    assert entry.code_root("model", "mylab.model:build") == lab
    assert entry.is_reference("mylab.model:build") and not entry.is_reference("mlp")


@pytest.mark.parametrize(
    ("value", "error", "says"),
    [
        ("mylab.model build", ValueError, "not a reference of the form 'package.module:function'"),
        ("no_such_lab.model:build", ValueError, "no module 'no_such_lab.model' on the Python path"),
        ("mylab.model:nothing", ValueError, "has no 'nothing'"),
        ("mylab.data:PER_WRITER", TypeError, "is a int, not a function"),
    ],
)
def test_a_bad_reference_is_one_line_naming_the_setting(lab: Path, value: str, error: type, says: str) -> None:
    with pytest.raises(error, match=says) as caught:
        entry.load("model", value)
    assert str(caught.value).startswith("setting 'model'") and "\n" not in str(caught.value)


def test_a_module_that_fails_to_import_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _module(tmp_path, monkeypatch, "brokenlab", "import not_installed_anywhere\n")
    with pytest.raises(ValueError, match="importing 'brokenlab' failed: No module named 'not_installed_anywhere'"):
        entry.load("dataset", "brokenlab:load")


def test_a_users_model_is_built_deterministically_in_the_seed(lab: Path) -> None:
    one, two, other = (build_model("mylab.model:build", (1, 8, 8), 10, seed=s) for s in (3, 3, 4))
    pairs = list(zip(one.parameters(), two.parameters(), other.parameters(), strict=True))
    assert all(torch.equal(a, b) for a, b, _ in pairs)
    assert not all(torch.equal(a, c) for a, _, c in pairs)
    assert one(torch.zeros(2, 1, 8, 8)).shape == (2, 10)


def test_the_config_takes_references_and_refuses_other_names() -> None:
    cfg = RunConfig.from_mapping({"model": "mylab.model:build", "dataset": "mylab.data:load", "num-classes": 10})
    assert (cfg.model, cfg.dataset, cfg.num_classes) == ("mylab.model:build", "mylab.data:load", 10)
    with pytest.raises(ConfigError, match="setting 'model' must be one of .* or 'package.module:function'"):
        RunConfig.from_mapping({"model": "my_model"})
    with pytest.raises(ConfigError, match="setting 'num-classes' is 11 but dataset 'synthetic' has 10 classes"):
        RunConfig.from_mapping({"num-classes": 11})


def _arrays(n: int = 60, test: int = 20) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "x_train": rng.normal(size=(n, 6)).astype(np.float32),
        "y_train": np.arange(n) % 3,
        "x_test": rng.normal(size=(test, 6)).astype(np.float32),
        "y_test": np.arange(test) % 3,
        "client_ids": np.arange(n) % 4,
    }


@pytest.mark.parametrize("shape", ["mapping", "tuple", "datasets"])
def test_a_loader_may_return_a_mapping_a_tuple_or_datasets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shape: str
) -> None:
    _module(
        tmp_path,
        monkeypatch,
        f"loader_{shape}",
        f"""
        import numpy as np
        import torch
        from torch.utils.data import TensorDataset

        def load(root, seed):
            rng = np.random.default_rng(0)
            a = {{"x_train": rng.normal(size=(60, 6)).astype(np.float32), "y_train": np.arange(60) % 3,
                 "x_test": rng.normal(size=(20, 6)).astype(np.float32), "y_test": np.arange(20) % 3}}
            assert root == "somewhere" and seed == 5
            if "{shape}" == "mapping":
                return a
            if "{shape}" == "tuple":
                return a["x_train"], a["y_train"], a["x_test"], a["y_test"]
            return (TensorDataset(torch.from_numpy(a["x_train"]), torch.from_numpy(a["y_train"])),
                    TensorDataset(torch.from_numpy(a["x_test"]), torch.from_numpy(a["y_test"])))
    """,
    )
    spec = DataSpec(dataset=f"loader_{shape}:load", root="somewhere", seed=5, num_clients=4, partition="iid")
    data = load_federated(spec)
    expected = _arrays()
    assert torch.equal(data.train_x, torch.from_numpy(expected["x_train"]))
    assert torch.equal(data.test_y, torch.from_numpy(expected["y_test"]))
    assert (data.num_classes, data.input_shape, data.num_clients) == (3, (6,), 4)


def test_a_loader_returning_something_else_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _module(tmp_path, monkeypatch, "oddlab", "def load():\n    return [1, 2, 3]\n")
    with pytest.raises(ValueError, match="oddlab:load returned a list; expected a mapping of x_train"):
        load_federated(DataSpec(dataset="oddlab:load", partition="iid"))


def _png(path: Path, value: int, size: tuple[int, int] = (6, 5), mode: str = "L") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new(mode, size, value if mode == "L" else (value, 0, 255 - value)).save(path)


def test_an_image_folder_gives_classes_in_sorted_order_normalized(tmp_path: Path) -> None:
    for split, count in (("train", 3), ("test", 1)):
        for c, name in enumerate(("cat", "dog")):
            for i in range(count):
                _png(tmp_path / split / name / f"{i}.png", 40 + 100 * c + i)
    data = load_federated(DataSpec(dataset="imagefolder", root=str(tmp_path), num_clients=2, partition="iid"))
    assert (data.num_classes, data.input_shape) == (2, (1, 5, 6))
    assert data.train_y.tolist() == [0, 0, 0, 1, 1, 1] and data.test_y.tolist() == [0, 1]
    assert abs(float(data.train_x.mean())) < 1e-5 and abs(float(data.train_x.std()) - 1.0) < 0.1


def test_an_image_folder_names_the_odd_file_and_class(tmp_path: Path) -> None:
    _png(tmp_path / "train" / "a" / "0.png", 10)
    _png(tmp_path / "train" / "a" / "1.png", 10, size=(7, 7))
    _png(tmp_path / "test" / "a" / "0.png", 10)
    with pytest.raises(DataError, match=r"train/a/1.png is 7x7; .*train/a/0.png is 6x5"):
        load_federated(DataSpec(dataset="imagefolder", root=str(tmp_path), num_clients=1, partition="iid"))
    (tmp_path / "train" / "a" / "1.png").unlink()
    _png(tmp_path / "test" / "zebra" / "0.png", 10)
    with pytest.raises(DataError, match=r"test/ has class folders that train/ lacks: \['zebra'\]"):
        load_federated(DataSpec(dataset="imagefolder", root=str(tmp_path), num_clients=1, partition="iid"))


def test_an_image_folder_without_its_splits_says_what_to_set(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="train/<class>/<image> and test/<class>/<image>"):
        load_federated(DataSpec(dataset="imagefolder", root=str(tmp_path)))


def test_inputs_the_api_stores_are_named_by_what_was_passed(tmp_path: Path) -> None:
    """A function pickled by value and arrays saved as npz: their files carry its name and ``data``."""
    from experiments.api import data_settings, reference

    def my_builder(shape: tuple[int, ...], classes: int, seed: int) -> torch.nn.Module:
        return torch.nn.Linear(shape[0], classes)

    path = Path(reference(my_builder, tmp_path))
    assert path.parent == tmp_path / "_inputs" and path.name.startswith("my_builder-") and path.suffix == ".pkl"
    assert Path(reference(lambda *a: None, tmp_path)).name.startswith("lambda-")
    assert reference(my_builder, tmp_path) == str(path)  # the same input, the same file
    x = np.zeros((4, 3), np.float32)
    settings = data_settings((x, np.arange(4), x, np.arange(4)), tmp_path)
    assert settings["dataset"] == "npz" and Path(settings["data-root"]).name.startswith("data-")


def test_a_loaders_result_unpacks_to_four_arrays_and_the_client_ids() -> None:
    a, b, c, d, ids = object(), object(), object(), object(), object()
    assert user.unpack({"x_train": a, "y_train": b, "x_test": c, "y_test": d}, "s") == (a, b, c, d, None)
    assert user.unpack({"x_train": a, "y_train": b, "x_test": c, "y_test": d, "client_ids": ids}, "s") == (
        a,
        b,
        c,
        d,
        ids,
    )
    assert user.unpack((a, b, c, d), "s") == (a, b, c, d, None)
    assert user.unpack([a, b, c, d, ids], "s") == (a, b, c, d, ids)
    train, test = TensorDataset(torch.zeros(2, 1)), TensorDataset(torch.ones(2, 1))
    assert user.unpack((train, test), "s") == (train, None, test, None, None)


@pytest.mark.parametrize(
    "result", [(1, 2), (TensorDataset(torch.zeros(1)), 2), (1, 2, 3), (1, 2, 3, 4, 5, 6), "xy", None]
)
def test_any_other_result_is_refused_with_the_shapes_a_loader_may_return(result: object) -> None:
    with pytest.raises(ValueError) as caught:
        user.unpack(result, "mine:load")
    assert str(caught.value) == (
        f"mine:load returned a {type(result).__name__}; expected a mapping of x_train, y_train, x_test, y_test "
        "(and client_ids), a tuple of those arrays, or a pair (train, test) of torch Datasets"
    )


def test_a_mapping_without_a_split_is_refused_naming_what_it_lacks_and_has() -> None:
    with pytest.raises(ValueError) as caught:
        user.unpack({"x_train": 1, "y_test": 2, "extra": 3}, "mine:load")
    assert (
        str(caught.value)
        == "mine:load returned a mapping without ['y_train', 'x_test']; it has ['extra', 'x_train', 'y_test']"
    )


def test_a_loader_gets_the_root_and_seed_it_declares_and_its_failures_name_the_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _module(
        tmp_path,
        monkeypatch,
        "argslab",
        """
        def nothing():
            return {}

        def seeded(seed, **other):
            return {"seed": seed}

        def both(root, seed):
            raise RuntimeError("no data today")
        """,
    )
    spec = DataSpec(dataset="argslab:both", root="here", seed=7, partition="iid")
    assert user.arguments(spec) == {"root": "here", "seed": 7}
    assert user.arguments(DataSpec(dataset="argslab:seeded", seed=7, partition="iid")) == {"seed": 7}
    assert user.arguments(DataSpec(dataset="argslab:nothing", partition="iid")) == {}
    with pytest.raises(ValueError) as caught:
        user.load(spec)
    assert str(caught.value) == (
        f"setting 'dataset': argslab:both raised RuntimeError: no data today (at {tmp_path / 'argslab.py'}:9)"
    )
    for function in (user.load, user.arguments):
        with pytest.raises(ValueError, match=r"^setting 'dataset': module 'argslab' \(.*\) has no 'gone'$"):
            function(DataSpec(dataset="argslab:gone", partition="iid"))
