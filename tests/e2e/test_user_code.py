"""The example package (tests/example) through every runtime: the CLI on both backends, the Python API, deployment.

docs/data.md's "Your own model and data" is executed as written: its command
and its script (`run_lab.py`, shown verbatim in the docs) run in a copy of
tests/example and give the same metrics to the last digit.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from experiments.api import run
from experiments.cli import main as fedsketch_main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "tests" / "example"
DOCS = ROOT / "docs" / "data.md"
pytestmark = pytest.mark.slow
SHORT = {"num-rounds": 2, "eval-every": 1}
TIMING = {"wall_s", "unix_time"}


def _rows(folder: Path) -> list[dict[str, Any]]:
    lines = (folder / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return [{k: v for k, v in json.loads(line).items() if k not in TIMING} for line in lines]


def _untimed(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in row.items() if k not in TIMING} for row in rows]


@pytest.fixture
def lab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the example folder as the working directory; PYTHONPATH restored afterwards."""
    folder = tmp_path / "example"
    shutil.copytree(EXAMPLE, folder, ignore=shutil.ignore_patterns("__pycache__", "runs*"))
    monkeypatch.chdir(folder)
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    return folder


def _cli(folder: Path, *extra: str) -> int:
    args = ["run", "lab.toml", "--strategies", "fetchsgd", "--no-plot", "--out", str(folder / "runs"), *extra]
    return fedsketch_main([*args, *(a for key, v in SHORT.items() for a in ("--set", f"{key}={v}"))])


def test_cli_on_both_backends_and_the_api_give_the_same_run(lab: Path, no_leftover_processes: None) -> None:
    assert _cli(lab / "inprocess", "--backend", "inprocess") == 0
    assert _cli(lab / "ray", "--backend", "ray") == 0
    inprocess, ray = (_rows(lab / b / "runs" / "lab" / "fetchsgd") for b in ("inprocess", "ray"))
    assert [r["round"] for r in inprocess] == [1, 2] and inprocess[-1]["clients"] == 10
    assert inprocess == ray

    sys.path.insert(0, str(lab))
    try:
        from mylab.data import load
        from mylab.model import build
    finally:
        sys.path.remove(str(lab))

    def builder(shape: tuple[int, ...], classes: int, seed: int) -> Any:  # a local function: pickled by value
        return build(shape, classes, seed)

    rows = run("lab.toml", model=builder, data=load(), strategies=["fetchsgd"], out=lab / "api", **_short())
    assert _untimed(rows) == inprocess  # the same run: data objects by npz, the builder by pickle
    assert len(list((lab / "api" / "_inputs").glob("data-*.npz"))) == 1  # named by what was passed, for errors
    assert len(list((lab / "api" / "_inputs").glob("builder-*.pkl"))) == 1


def _short() -> dict[str, Any]:
    return {key.replace("-", "_"): value for key, value in SHORT.items()}


def test_the_example_deploys_on_two_supernodes(lab: Path, no_leftover_processes: None) -> None:
    args = ["deploy", "lab.toml", "--supernodes", "2", "--strategies", "fetchsgd", "--no-plot", "--out", "runs"]
    assert fedsketch_main([*args, *(a for key, v in SHORT.items() for a in ("--set", f"{key}={v}"))]) == 0
    rows = _rows(lab / "runs" / "lab" / "fetchsgd")
    assert [r["round"] for r in rows] == [1, 2]
    assert all(r["clients"] == 2 and r["failures"] == 0 for r in rows)


def _block(marker: str) -> str:
    text = DOCS.read_text(encoding="utf-8")
    found = re.search(rf"<!-- {marker} -->\n```\w*\n(.*?)```\n<!-- /{marker} -->", text, re.DOTALL)
    assert found, f"docs/data.md has no {marker} block"
    return found.group(1)


def test_the_docs_example_runs_as_written(lab: Path, no_leftover_processes: None) -> None:
    assert _block("example-script") == (EXAMPLE / "run_lab.py").read_text(encoding="utf-8")
    env = {**os.environ, "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
    for line in _block("example-commands").splitlines():
        if line.startswith("cd "):
            continue  # the copy is already the working directory
        done = subprocess.run(
            line, check=False, shell=True, cwd=lab, env=env, capture_output=True, text=True, timeout=900
        )
        assert done.returncode == 0, f"{line}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    for strategy in ("fetchsgd", "local_topk", "fedavg"):
        cli, api = (_rows(lab / out / "lab" / strategy) for out in ("runs", "runs-api"))
        assert cli == api and cli[-1]["round"] == 30
    assert _rows(lab / "runs" / "lab" / "fedavg")[-1]["test_accuracy"] > 0.9
