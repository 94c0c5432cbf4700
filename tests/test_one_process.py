"""The one-process runtime's pieces that need no Flower run (the runs themselves: tests/test_simulation_backend.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from experiments.flower import one_process


def test_the_run_config_file_is_read_as_flwr_run_reads_it(tmp_path: Path) -> None:
    path = tmp_path / "run_config.toml"
    path.write_text('strategy = "fedavg"\nnum-rounds = 3\nlr = 0.5\nflag = true\n', encoding="utf-8")
    assert one_process.overrides(path) == {"strategy": "fedavg", "num-rounds": 3, "lr": 0.5, "flag": True}


def test_the_process_gets_the_app_first_on_its_path_and_two_malloc_arenas_unless_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    env = one_process.process_env(tmp_path / "app", tmp_path / "home")
    assert env["PYTHONPATH"].split(os.pathsep) == [str(tmp_path / "app"), "/elsewhere"]
    assert env["MALLOC_ARENA_MAX"] == one_process.MALLOC_ARENAS == "2"
    assert env["FLWR_HOME"] == str(tmp_path / "home") and env["FLWR_TELEMETRY_ENABLED"] == "0"
    monkeypatch.setenv("MALLOC_ARENA_MAX", "8")  # the user's own setting is kept
    assert one_process.process_env(tmp_path / "app", tmp_path / "home")["MALLOC_ARENA_MAX"] == "8"


def test_each_backend_runs_the_components_the_app_names_and_the_clientapp_a_staged_app_names(
    tmp_path: Path,
) -> None:
    from experiments.flower.app_files import INPROCESS_CLIENTAPP, stage_app

    root = Path(__file__).resolve().parent.parent
    assert one_process.components(root, "ray") == ("strategies.server_app:app", "clients.client_app:app")
    assert one_process.components(root, "inprocess") == ("strategies.server_app:app", INPROCESS_CLIENTAPP)
    staged = stage_app(root, tmp_path / "app", INPROCESS_CLIENTAPP)  # what --runtime superlink submits
    assert one_process.components(staged, "ray") == one_process.components(root, "inprocess")
