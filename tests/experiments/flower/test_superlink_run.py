"""A run through a private SuperLink and ``flwr run`` (experiments/flower/superlink_run.py): real SuperLinks on
loopback ports, and a real run submitted to one."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from experiments.flower import procs, superlink_run
from experiments.flower.federation import Federation
from fedsketch.server import runlog
from tests.conftest import ROOT
from tests.tiny_runs import rounds, tiny_federation, tiny_run


def test_the_connection_names_the_private_superlink_and_the_federation_it_simulates() -> None:
    fed = Federation(num_supernodes=3, cpus_per_client=2, gpus_per_client=0.25)
    assert tomllib.loads(superlink_run.connection_toml(fed, "127.0.0.1:9093")) == {
        "superlink": {
            "default": "fedsketch-sim",
            "fedsketch-sim": {
                "address": "127.0.0.1:9093",
                "insecure": True,
                "options": {"num-supernodes": 3, "backend": {"client-resources": {"num-cpus": 2, "num-gpus": 0.25}}},
            },
        }
    }


def _superlink(tmp_path: Path, finished: bool, homes: list[Path]) -> tuple[str, str]:
    """A private SuperLink started, waited for and left: its connection while it ran, and its log."""
    home, log = tmp_path / "home", tmp_path / "flower.log"
    homes.append(home)
    with superlink_run.simulation_superlink(home, Federation(), log, lambda: finished) as (env, healthy):
        healthy()
        assert env["FLWR_HOME"] == str(home) and procs.processes_with_env("FLWR_HOME", str(home))
        connection = tomllib.loads((home / "config.toml").read_text())["superlink"]["fedsketch-sim"]
        host, port = connection["address"].split(":")
        assert host == "127.0.0.1" and f"Uvicorn running on http://127.0.0.1:{port}" in log.read_text()
    assert not procs.processes_with_env("FLWR_HOME", str(home))
    return connection["address"], log.read_text()


@pytest.mark.slow  # Flower's processes on loopback
def test_a_private_superlink_answers_on_its_loopback_port_and_is_stopped_with_everything_it_started(
    tmp_path: Path, homes: list[Path]
) -> None:
    """Asked to stop, it shuts down in its own way; once the run kept all it needs, it is killed at once."""
    address, log = _superlink(tmp_path / "unfinished", False, homes)
    assert "Application shutdown complete" in log
    other, log = _superlink(tmp_path / "finished", True, homes)
    assert "Application shutdown complete" not in log and other != address


@pytest.mark.slow  # Flower's processes on loopback
def test_flwr_run_submits_the_staged_app_to_the_private_superlink_and_streams_its_logs(
    tmp_path: Path, homes: list[Path]
) -> None:
    path = tiny_run(tmp_path / "runs")
    homes.append(path / "flwr-home")
    polls: list[None] = []
    fed = tiny_federation()
    assert superlink_run.flwr_run(ROOT, path / "run_config.toml", fed, path, lambda: polls.append(None)) == 0
    log = (path / "flower.log").read_text()
    assert rounds(path) == [1, 2] and polls and runlog.server_done(path)
    assert "round 2: accuracy" in log and "(no Ray)" in log and "Uvicorn running on http://127.0.0.1:" in log
    assert "Application shutdown complete" not in log  # the run kept all it needs: the SuperLink is killed at once
    assert (path / "flwr-home" / "config.toml").exists()
    assert not procs.processes_with_env("FLWR_HOME", str(path / "flwr-home"))
