"""A slow loader runs once per command: the command loads, says so, and hands the arrays to Flower's processes.

The loader here counts its calls in a file (one line per call, with the pid that
made it), so calls made in any process count. ``fedsketch run`` is run as the
installed program, through a real Flower simulation process.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from experiments.cli import main
from experiments.running.preflight import check_runs
from fedsketch.config import ConfigError, RunConfig
from fedsketch.data import DataSpec, handoff, load_federated

ROOT = Path(__file__).resolve().parents[3]
LOADER = """
import os
import numpy as np
import torch
import time
from pathlib import Path

import numpy as np

CALLS = Path(__file__).with_name("calls.txt")


def _arrays():
    with CALLS.open("a") as f:
        f.write(f"{os.getpid()}\\n")
    time.sleep(0.1)  # a slow loader
    rng = np.random.default_rng(0)
    return {"x_train": rng.normal(size=(200, 6)).astype(np.float32), "y_train": np.arange(200) % 4,
            "x_test": rng.normal(size=(40, 6)).astype(np.float32), "y_test": np.arange(40) % 4,
            "client_ids": np.arange(200) % 8}


def load(root):
    return _arrays()


def load_seeded(root, seed):
    return _arrays()
"""
SETTINGS = {
    "dataset": "countlab:load",
    "num-clients": 8,
    "clients-per-round": 4,
    "num-rounds": 2,
    "eval-every": 1,
    "model-hidden": 16,
    "k": 10,
    "sketch-cols": 100,
}


@pytest.fixture
def lab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The counting loader importable as ``countlab``, with this test's own counter; PYTHONPATH restored after."""
    (tmp_path / "countlab.py").write_text(textwrap.dedent(LOADER), encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))  # the command exports the loader's folder
    monkeypatch.delitem(sys.modules, "countlab", raising=False)
    yield tmp_path
    sys.modules.pop("countlab", None)


def _calls(lab: Path) -> list[str]:
    path = lab / "calls.txt"
    return path.read_text(encoding="utf-8").split() if path.exists() else []


def _runs(lab: Path, **settings: object) -> list[RunConfig]:
    values = {**SETTINGS, "out-dir": str(lab / "runs"), **settings}
    return [RunConfig.from_mapping({**values, "seed": seed}) for seed in (0, 1)]


@pytest.mark.slow  # two Python processes that import torch: about 10 s
def test_a_process_the_command_starts_reads_what_it_loaded(lab: Path) -> None:
    """The child process gets the same arrays from the file; without the handover it would load again."""
    check_runs(_runs(lab)[:1])
    assert _calls(lab) == [str(os.getpid())]
    here = load_federated(DataSpec(dataset="countlab:load", num_clients=8))
    code = (
        "from fedsketch.data import DataSpec, load_federated; "
        "d = load_federated(DataSpec(dataset='countlab:load', num_clients=8)); "
        "print(repr(float(d.train_x.sum())), d.test_y.tolist() == list(range(4)) * 10, d.name)"
    )
    child = [sys.executable, "-c", code]
    env = {**os.environ, "PYTHONPATH": f"{lab}{os.pathsep}{ROOT}"}
    done = subprocess.run(child, capture_output=True, text=True, env=env, timeout=120, check=True)
    assert done.stdout.split() == [repr(float(here.train_x.sum())), "True", "countlab:load"]
    assert len(_calls(lab)) == 1  # read from the file, not loaded again
    subprocess.run(child, capture_output=True, env={**env, handoff.ENV: ""}, timeout=120, check=True)
    assert len(_calls(lab)) == 2  # a process the command did not start loads for itself


def test_the_command_itself_never_reads_a_file_it_handed_over(lab: Path) -> None:
    """After a command, this process loads afresh (a notebook that edits its loader gets the new data)."""
    check_runs(_runs(lab)[:1])
    handoff.forget()
    load_federated.cache_clear()
    load_federated(DataSpec(dataset="countlab:load", num_clients=8))
    assert _calls(lab) == [str(os.getpid())] * 2


def test_a_refused_command_writes_nothing(lab: Path) -> None:
    with pytest.raises(ConfigError, match="'k' \\(100000\\) exceeds the model's"):
        check_runs(_runs(lab, k=100_000, **{"sketch-cols": 100_000}))
    assert len(_calls(lab)) == 1 and not (lab / "runs").exists() and not os.environ[handoff.ENV]


def test_a_loader_is_called_once_per_distinct_set_of_arguments(lab: Path) -> None:
    check_runs(_runs(lab))  # two seeds; the loader takes no seed
    assert len(_calls(lab)) == 1
    check_runs(_runs(lab, dataset="countlab:load_seeded"))  # a new command; one load per seed
    assert len(_calls(lab)) == 3


def test_the_plan_says_what_is_loading_and_for_how_long(lab: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sets = [arg for key, value in SETTINGS.items() for arg in ("--set", f"{key}={value}")]
    assert main(["plan", *sets, "--strategies", "fetchsgd", "--out", str(lab / "runs")]) == 0
    out = capsys.readouterr().out
    assert "fedsketch: loading countlab:load(root='') ...\n" in out
    assert re.search(r"fedsketch: countlab:load: loaded in 0\.[1-9] s\n", out)
    assert len(_calls(lab)) == 1
    assert "Flower's processes" not in out and not (lab / "runs").exists()  # the plan runs nothing: no file


@pytest.mark.slow  # a real Flower run: about 15 s
def test_a_slow_loader_runs_once_per_command_through_flower(lab: Path, no_leftover_processes: None) -> None:
    sets = [arg for key, value in SETTINGS.items() for arg in ("--set", f"{key}={value}")]
    command = [sys.executable, "-m", "experiments.cli", "run", *sets, "--strategies", "fetchsgd", "--no-plot"]
    env = {**os.environ, "PYTHONPATH": f"{lab}{os.pathsep}{ROOT}"}
    out = ["--out", str(lab / "runs")]
    done = subprocess.run([*command, *out], cwd=lab, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "fedsketch: loading countlab:load(root='') ..." in done.stdout
    said = r"fedsketch: countlab:load: Flower's processes read it from .*/runs/_inputs/loaded-countlab_load-\w+\.npz"
    assert re.search(said, done.stdout), done.stdout
    assert "fetchsgd seed 0: finished" in done.stdout, done.stdout
    assert len(_calls(lab)) == 1, _calls(lab)  # the command's checks; not again in Flower's simulation process


QUICK = """
import numpy as np


def load(root, seed):
    rng = np.random.default_rng(seed)
    return {"x_train": rng.normal(size=(12, 3)), "y_train": np.arange(12) % 3, "x_test": rng.normal(size=(6, 3)),
            "y_test": np.arange(6) % 3, "client_ids": np.array(list("bbaacc") * 2, dtype=object)}


def plain():
    return np.ones((4, 2)), np.arange(4) % 2, np.zeros((2, 2)), np.arange(2)


def listed():
    return np.ones((4, 2)), np.arange(4) % 2, np.zeros((2, 2)), np.arange(2), [7, 5, 7, 5]


def float_train():
    return np.ones((4, 2)), np.ones(4), np.zeros((2, 2)), np.arange(2)


def float_test():
    return np.ones((4, 2)), np.arange(4) % 2, np.zeros((2, 2)), np.ones(2)
"""


@pytest.fixture
def quick(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fast loader importable as ``quicklab``: ``load(root, seed)`` and ``plain()``."""
    (tmp_path / "quicklab.py").write_text(textwrap.dedent(QUICK), encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "quicklab", raising=False)
    yield tmp_path
    sys.modules.pop("quicklab", None)


def _folder(root: Path, classes: tuple[str, ...] = ("cat", "dog")) -> Path:
    from PIL import Image

    for split, n in (("train", 3), ("test", 1)):
        for c, name in enumerate(classes):
            (root / split / name).mkdir(parents=True)
            for i in range(n):
                Image.new("L", (4, 4), color=40 * c + i).save(root / split / name / f"{i}.png")
    (root / "train" / classes[0] / "notes.txt").write_text("not an image", encoding="utf-8")
    return root


@pytest.mark.parametrize(
    ("dataset", "expected"),
    [("imagefolder", True), ("quicklab:load", True), ("saved.pkl", True), ("npz", False), ("mnist", False)],
)
def test_user_loaders_and_image_folders_are_the_data_handed_over(dataset: str, expected: bool) -> None:
    assert handoff.handed(DataSpec(dataset=dataset)) is expected


def test_a_load_depends_on_the_loader_and_the_arguments_it_declares(quick: Path, tmp_path: Path) -> None:
    seeded = DataSpec(dataset="quicklab:load", root="r", seed=4)
    assert handoff.source(seeded) == ("quicklab:load", ("root", "r"), ("seed", 4))
    assert handoff.source(DataSpec(dataset="quicklab:plain", root="r", seed=4)) == ("quicklab:plain",)
    images = DataSpec(dataset="imagefolder", root=str(tmp_path), num_classes=2)
    assert handoff.source(images) == ("imagefolder", str(tmp_path), 2)
    assert handoff.describe(seeded) == "quicklab:load(root='r', seed=4)"
    assert handoff.describe(DataSpec(dataset="quicklab:plain")) == "quicklab:plain()"
    assert handoff.describe(images) == f"imagefolder:{tmp_path} (decoding every image)"


def test_reading_a_loader_gives_training_tensors_and_its_client_ids(quick: Path) -> None:
    spec = DataSpec(dataset="quicklab:load", seed=3)
    got = handoff.read(spec)
    assert got.x_train.dtype == torch.float32 and got.y_train.dtype == torch.int64 and got.x_test.shape == (6, 3)
    assert got.y_test.tolist() == [0, 1, 2] * 2 and got.name == "quicklab:load" and got.num_classes is None
    assert isinstance(got.client_ids, np.ndarray) and got.client_ids.tolist() == list("bbaacc") * 2
    assert got.note == "" and 0 < got.seconds < 5
    assert not handoff.holds(spec)
    listed = handoff.read(DataSpec(dataset="quicklab:listed"))
    assert isinstance(listed.client_ids, np.ndarray) and listed.client_ids.tolist() == [7, 5, 7, 5]
    plain = handoff.read(DataSpec(dataset="quicklab:plain"))
    assert plain.client_ids is None and plain.x_train.dtype == torch.float32 and plain.y_train.tolist() == [0, 1] * 2


def test_reading_an_image_folder_gives_its_classes_and_what_it_skipped(tmp_path: Path) -> None:
    root = _folder(tmp_path / "pets")
    got = handoff.read(DataSpec(dataset="imagefolder", root=str(root)))
    assert got.name == f"imagefolder:{root}" and got.num_classes == 2 and got.client_ids is None
    assert got.x_train.shape == (6, 1, 4, 4) and got.x_train.dtype == torch.float32 and got.y_test.tolist() == [0, 1]
    assert "notes.txt" in got.note


@pytest.mark.parametrize("split", ["train", "test"])
def test_a_loaders_labels_that_are_not_integers_are_refused_naming_the_split_and_the_loader(
    quick: Path, split: str
) -> None:
    message = f"y_{split} of quicklab:float_{split} must hold integer labels; got torch.float64"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        handoff.read(DataSpec(dataset=f"quicklab:float_{split}"))


def test_an_image_folder_whose_class_count_differs_from_the_setting_is_refused(tmp_path: Path) -> None:
    from fedsketch.data.checks import DataError

    root = _folder(tmp_path / "pets")
    with pytest.raises(DataError, match="setting 'num-classes' is 3 but train/ holds 2 class folders"):
        handoff.read(DataSpec(dataset="imagefolder", root=str(root), num_classes=3))


def test_a_handed_over_file_holding_python_objects_is_refused_not_unpickled(quick: Path, tmp_path: Path) -> None:
    """Unpickling can run code: a file in the folder a process is told to read is read as plain arrays only."""
    spec = DataSpec(dataset="quicklab:plain")
    path = handoff._path(tmp_path, handoff.source(spec))
    np.savez(
        path,
        name=np.array("quicklab:plain"),
        classes=np.array(-1),
        x_train=np.ones((2, 2)),
        y_train=np.arange(2),
        x_test=np.ones((1, 2)),
        y_test=np.arange(1),
        client_ids=np.array([1, None]),
    )
    os.environ[handoff.ENV] = f"{os.getpid() + 1}:{tmp_path}"
    with pytest.raises(ValueError, match="allow_pickle=False"):
        handoff.load(spec)


def test_load_prefers_what_this_process_holds(quick: Path) -> None:
    spec = DataSpec(dataset="quicklab:load", seed=1)
    fresh = handoff.load(spec)
    assert handoff.load(spec) is not fresh  # nothing held: read again
    handoff.hold(spec, fresh)
    assert handoff.holds(spec) and handoff.load(spec) is fresh
    assert not handoff.holds(DataSpec(dataset="quicklab:load", seed=2))
    handoff.forget()
    assert not handoff.holds(spec)


def test_a_handed_over_file_is_what_a_started_process_reads(quick: Path, tmp_path: Path) -> None:
    spec = DataSpec(dataset="quicklab:load", seed=2)
    loaded = handoff.read(spec)
    handoff.hold(spec, loaded)
    written = handoff.hand_over(tmp_path / "out")
    folder = (tmp_path / "out").resolve() / "_inputs"
    [(name, path)] = written
    assert (
        name == "quicklab:load"
        and path.parent == folder
        and re.fullmatch(r"loaded-quicklab_load-[0-9a-f]{16}\.npz", path.name)
    )
    assert sorted(p.name for p in folder.iterdir()) == [path.name]  # no temporary file left
    assert os.environ[handoff.ENV] == f"{os.getpid()}:{folder}"
    assert handoff.load(spec) is loaded  # this process holds it
    handoff.forget()
    assert handoff._received(handoff.source(spec)) is None  # the command's own process never reads its file
    os.environ[handoff.ENV] = f"{os.getpid() + 1}:{folder}"  # as a process the command started sees it
    got = handoff.load(spec)
    for field in ("x_train", "y_train", "x_test", "y_test"):
        assert torch.equal(getattr(got, field), getattr(loaded, field))
    assert got.name == "quicklab:load" and got.num_classes is None and got.x_train.dtype == torch.float32
    assert got.client_ids is not None and got.client_ids.tolist() == [1, 1, 0, 0, 2, 2] * 2  # sorted ids, numbered
    assert handoff._received(handoff.source(DataSpec(dataset="quicklab:load", seed=3))) is None  # no such file
    os.environ[handoff.ENV] = ""
    handoff.hold(spec, loaded)
    assert handoff.hand_over(tmp_path / "out") == written  # the next command rewrites the same file
    os.environ[handoff.ENV] = f"{os.getpid() + 1}:"
    assert handoff._received(handoff.source(spec)) is None


def test_an_image_folders_classes_travel_with_its_file(tmp_path: Path) -> None:
    root = _folder(tmp_path / "pets", classes=("a", "b", "c"))
    spec = DataSpec(dataset="imagefolder", root=str(root))
    handoff.hold(spec, handoff.read(spec))
    [(_, path)] = handoff.hand_over(tmp_path / "out")
    assert path.name.startswith("loaded-imagefolder-")
    handoff.forget()
    os.environ[handoff.ENV] = f"1:{path.parent}"
    got = handoff.load(spec)
    assert got.num_classes == 3 and got.client_ids is None and got.name == f"imagefolder:{root}"


def test_nothing_held_writes_nothing(tmp_path: Path) -> None:
    assert handoff.hand_over(tmp_path / "out") == [] and not (tmp_path / "out").exists()
    assert os.environ[handoff.ENV] == ""


@pytest.mark.parametrize(
    ("key", "stem"),
    [
        (("pkg.mod:load",), "pkg.mod_load"),
        (("MyLab.Data:Load",), "MyLab.Data_Load"),
        (("/data/my set.pkl",), "my_set.pkl"),
        (("._:",), "data"),
        ((".a_",), "a"),
        (("Xlab:loadX",), "Xlab_loadX"),
    ],
)
def test_a_files_name_says_what_it_holds_and_differs_per_load(key: tuple[str, ...], stem: str) -> None:
    path = handoff._path(Path("f"), key)
    assert path.parent == Path("f") and path.name.startswith(f"loaded-{stem}-") and path.suffix == ".npz"
    assert handoff._path(Path("f"), (*key, ("seed", 1))) != path


def test_a_folder_whose_path_holds_a_colon_is_found(quick: Path, tmp_path: Path) -> None:
    spec = DataSpec(dataset="quicklab:listed")
    loaded = handoff.read(spec)
    handoff.hold(spec, loaded)
    [(_, path)] = handoff.hand_over(tmp_path / "run:2")
    handoff.forget()
    os.environ[handoff.ENV] = f"{os.getpid() + 1}:{path.parent}"
    assert torch.equal(handoff.load(spec).x_train, loaded.x_train) and ":" in str(path.parent)
    got = handoff.load(spec)
    assert got.seconds == 0.0 and got.client_ids is not None and got.client_ids.tolist() == [7, 5, 7, 5]


def test_a_process_no_command_started_loads_for_itself(quick: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(handoff.ENV)
    got = handoff.load(DataSpec(dataset="quicklab:plain"))
    assert got.y_test.tolist() == [0, 1] and got.seconds > 0


def test_a_loaders_data_keeps_its_name_and_natural_clients(quick: Path) -> None:
    data = load_federated(DataSpec(dataset="quicklab:load", num_clients=3, seed=6))
    assert data.name == "quicklab:load" and data.num_classes == 3 and data.input_shape == (3,)
    assert [p.tolist() for p in data.client_indices] == [[2, 3, 8, 9], [0, 1, 6, 7], [4, 5, 10, 11]]  # a, b, c
