"""Flower's simulation runtime called in this process (bridge/simulation.py): the app's components, the run's
overrides, and a real run of the app through the runtime here, as the simulation process makes it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bridge import flower, simulation
from bridge.runtime.simulation_backend import InProcessBackend, worker_count
from experiments.flower.app_files import INPROCESS_CLIENTAPP, clientapp_for, stage_app
from fedsketch.server import runlog
from tests.conftest import ROOT
from tests.tiny_runs import rounds, tiny_run


def test_the_run_config_file_is_read_as_flwr_run_reads_it(tmp_path: Path) -> None:
    path = tmp_path / "run_config.toml"
    path.write_text('strategy = "fedavg"\nnum-rounds = 3\nlr = 0.5\nflag = true\n', encoding="utf-8")
    assert simulation.overrides(path) == {"strategy": "fedavg", "num-rounds": 3, "lr": 0.5, "flag": True}


def test_each_backend_runs_the_components_the_app_names_and_the_clientapp_a_staged_app_names(
    tmp_path: Path,
) -> None:
    assert simulation.components(ROOT, clientapp_for("ray")) == ("strategies.server_app:app", "clients.client_app:app")
    assert simulation.components(ROOT, clientapp_for("inprocess")) == ("strategies.server_app:app", INPROCESS_CLIENTAPP)
    staged = stage_app(ROOT, tmp_path / "app", INPROCESS_CLIENTAPP)  # what --runtime superlink submits
    assert simulation.components(staged, clientapp_for("ray")) == simulation.components(
        ROOT, clientapp_for("inprocess")
    )


@pytest.mark.parametrize(("num_rounds", "cpus", "gpus"), [(1, 1, 0.0), (2, 2, 0.5)])
def test_a_run_through_the_runtime_here_follows_its_settings_file_with_the_resources_asked(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    num_rounds: int,
    cpus: int,
    gpus: float,
) -> None:
    """The run's settings (the file's, fused over the app's, on both sides) decide where its rows go, how many
    rounds it runs and what each client trains; the backend gets each node's CPUs and GPU share, and the CPUs
    decide how many clients train at once."""
    monkeypatch.setenv("FLWR_TELEMETRY_ENABLED", "0")
    monkeypatch.chdir(tmp_path)  # the app is found where it is, not in the folder the run started from
    built: list[dict[str, object]] = []
    build = InProcessBackend.__init__
    monkeypatch.setattr(InProcessBackend, "__init__", lambda self, config: built.append(config) or build(self, config))
    path = tiny_run(tmp_path / "runs", **{"num-rounds": num_rounds})
    simulation.simulate(ROOT, path / "run_config.toml", 2, cpus, gpus, clientapp_for("inprocess"))
    assert rounds(path) == list(range(1, num_rounds + 1)) and runlog.server_done(path)
    assert [config["client_resources"] for config in built] == [{"num_cpus": cpus, "num_gpus": gpus}]
    assert f"{worker_count(cpus)} at once" in caplog.text and "(no Ray)" in caplog.text


def test_the_clients_train_with_the_runs_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A setting only the clients read (their local steps) reaches them: the model after one round differs
    between one step and three."""
    monkeypatch.setenv("FLWR_TELEMETRY_ENABLED", "0")
    losses = []
    for steps in (1, 3):
        path = tiny_run(tmp_path / str(steps), **{"num-rounds": 1, "client-update": "delta", "local-steps": steps})
        simulation.simulate(ROOT, path / "run_config.toml", 2, 1, 0.0, clientapp_for("inprocess"))
        assert rounds(path) == [1]
        losses.append(json.loads((path / "metrics.jsonl").read_text())["test_loss"])
    assert losses[0] != losses[1]


def test_the_runtime_here_is_refused_in_one_line_on_flowers_public_api_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(flower.SWITCH, "1")
    refused = r"^Flower's simulation runtime in one process needs Flower internals, .* FEDSKETCH_PUBLIC_FLOWER is set$"
    with pytest.raises(RuntimeError, match=refused):
        simulation.components(ROOT)
    with pytest.raises(RuntimeError, match=refused):
        simulation.simulate(ROOT, tmp_path / "run_config.toml", 2, 1, 0.0, None)
