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

import pytest

from experiments.cli import main
from experiments.running.preflight import check_runs
from fedsketch.config import ConfigError, RunConfig
from fedsketch.data import DataSpec, handoff, load_federated

ROOT = Path(__file__).resolve().parents[3]
LOADER = """
import os
import time
from pathlib import Path

import numpy as np

CALLS = Path(__file__).with_name("calls.txt")


def _arrays():
    with CALLS.open("a") as f:
        f.write(f"{os.getpid()}\\n")
    time.sleep(0.5)  # a slow loader
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
    assert re.search(r"fedsketch: countlab:load: loaded in 0\.[5-9] s\n", out)
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
