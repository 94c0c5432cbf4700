"""The ServerApp's handling of Flower's grids."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from flwr.app import Context, Message, RecordDict
from flwr.server.superlink.linkstate import LinkStateFactory
from flwr.supercore.constant import FLWR_IN_MEMORY_DB_NAME
from flwr.supercore.object_store import ObjectStoreFactory
from flwr.superlink.federation import NoOpFederationManager
from flwr.superlink.grid import InMemoryGrid

from bridge import flower
from bridge.flower import task_identity
from bridge.runtime import object_pulls
from clients.client_app import app as client_app
from experiments.cli import main
from experiments.running.inprocess_grid import InProcessGrid
from fedsketch.client.state import state_root
from fedsketch.config import RunConfig
from fedsketch.server import runlog
from fedsketch.settings.setting import ConfigError
from strategies import server_app
from strategies.server_app import poll_replies_sooner
from tests.bridge.runtime import pulls
from tests.federation import TestGrid


def test_simulation_grid_polls_for_replies_at_the_configured_interval() -> None:
    """Flower's in-memory grid (the one simulation hands the ServerApp) takes ``reply-poll-s``."""
    state = LinkStateFactory(FLWR_IN_MEMORY_DB_NAME, NoOpFederationManager(), ObjectStoreFactory())
    grid = InMemoryGrid(state_factory=state)
    assert grid.pull_interval == 0.1  # Flower's own; if this changes, the README's figures need a look
    poll_replies_sooner(grid, RunConfig().reply_poll_s)
    assert grid.pull_interval == 0.005


def test_other_grids_are_left_alone() -> None:
    grid = TestGrid(RunConfig().to_mapping(), num_nodes=1)
    before = vars(grid).copy()
    poll_replies_sooner(grid, 0.005)  # type: ignore[arg-type]
    assert vars(grid) == before


def test_fedsketch_run_refuses_a_gpu_share_without_a_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible here")
    assert main(["run", "--gpus-per-node", "0.5", "--set", "num-rounds=1"]) == 2
    assert "--gpus-per-node 0.5 asks for a GPU share, but no CUDA GPU is visible" in capsys.readouterr().err


def _settings(tmp_path: Path, **changes: object) -> dict[str, object]:
    tiny = {"experiment": "app", "dataset": "synthetic", "model": "mlp", "model-hidden": 16, "num-clients": 4}
    tiny |= {"clients-per-round": 2, "num-rounds": 2, "eval-every": 1, "local-batch-size": 8}
    tiny |= {"samples-per-client": 16, "out-dir": str(tmp_path), "k": 10, "reply-poll-s": 0.02}
    return RunConfig.from_mapping({**tiny, **{k.replace("_", "-"): v for k, v in changes.items()}}).to_mapping()


def _run_server_app(settings: dict[str, object], app: Callable[[Message, Context], Message] = client_app) -> Path:
    grid = InProcessGrid(settings, num_nodes=2, app=app)
    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=settings)
    try:
        with task_identity():
            server_app.main(grid, context)  # type: ignore[arg-type]  # the grid serves what the strategy uses
    finally:
        pulls.uninstall(object_pulls.GRID)  # it took this grid for a deployed one: Flower's own again
    return runlog.run_dir(RunConfig.from_mapping(settings))


def test_the_server_app_runs_every_round_and_marks_the_run_done(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="flwr")
    out = _run_server_app(_settings(tmp_path, strategy="fedavg"))
    assert [row["round"] for row in runlog.read_metrics(out)] == [1, 2]
    assert runlog.server_done(out) and runlog.broken(out) is None
    assert caplog.messages[-1] == runlog.SERVER_DONE_LOG


def test_a_run_whose_model_diverged_is_marked_broken(tmp_path: Path) -> None:
    out = _run_server_app(_settings(tmp_path, strategy="fedavg", lr=1e30))
    assert runlog.server_done(out)
    assert (runlog.broken(out) or "").startswith("the model is broken: its test loss is ")


def test_client_states_on_disk_are_cleared_before_and_after_the_run(tmp_path: Path) -> None:
    settings = _settings(tmp_path, strategy="local_topk", client_state="disk")
    root = state_root(RunConfig.from_mapping(settings))
    stale = root / "left-by-an-earlier-run"
    stale.parent.mkdir(parents=True)
    stale.write_text("old")
    seen: list[bool] = []

    def app(msg: Message, context: Context) -> Message:
        seen.append(stale.exists())
        return client_app(msg, context)

    _run_server_app(settings, app)
    assert len(seen) == 4 and not any(seen)  # cleared before the first client ran
    assert not root.exists()  # and after the last


def test_a_setting_the_model_cannot_take_stops_the_app_before_any_round(tmp_path: Path) -> None:
    settings = _settings(tmp_path, strategy="true_topk", k=100_000)
    with pytest.raises(ConfigError, match="k"):
        _run_server_app(settings)
    assert not runlog.run_dir(RunConfig.from_mapping(settings)).joinpath("metrics.jsonl").exists()


def test_deltas_are_bounded_by_the_largest_partition_and_gradients_are_not(tmp_path: Path) -> None:
    deltas = server_app.build_strategy(RunConfig.from_mapping(_settings(tmp_path, client_update="delta")), None)
    assert deltas.max_examples == 16
    gradients = server_app.build_strategy(RunConfig.from_mapping(_settings(tmp_path, client_update="gradient")), None)
    assert gradients.max_examples == 8  # the local batch


def test_a_deployed_grid_asks_again_for_a_replys_missing_parts_sooner(monkeypatch: pytest.MonkeyPatch) -> None:
    state = LinkStateFactory(FLWR_IN_MEMORY_DB_NAME, NoOpFederationManager(), ObjectStoreFactory())
    simulation, deployed = InMemoryGrid(state_factory=state), TestGrid(RunConfig().to_mapping(), num_nodes=1)
    try:
        for grid, first_s in ((deployed, 0.0), (simulation, 0.05)):  # told not to, or a lookup in this process
            server_app.retry_objects_sooner(grid, first_s)  # type: ignore[arg-type]
            assert pulls.first_retry_s(object_pulls.GRID) == pulls.FLOWER_FIRST_S
        monkeypatch.setenv(flower.SWITCH, "1")  # Flower's public API only: its own retries
        server_app.retry_objects_sooner(deployed, 0.05)  # type: ignore[arg-type]
        assert pulls.first_retry_s(object_pulls.GRID) == pulls.FLOWER_FIRST_S
        monkeypatch.delenv(flower.SWITCH)
        server_app.retry_objects_sooner(deployed, 0.05)  # type: ignore[arg-type]
        assert pulls.first_retry_s(object_pulls.GRID) == 0.05
    finally:
        pulls.uninstall(object_pulls.GRID)
