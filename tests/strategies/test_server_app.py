"""The ServerApp's handling of Flower's grids."""

from __future__ import annotations

import pytest
import torch
from flwr.server.superlink.linkstate import LinkStateFactory
from flwr.supercore.constant import FLWR_IN_MEMORY_DB_NAME
from flwr.supercore.object_store import ObjectStoreFactory
from flwr.superlink.federation import NoOpFederationManager
from flwr.superlink.grid import InMemoryGrid

from experiments.cli import main
from experiments.flower.federation import Federation, cpus_per_node, gpus_per_node
from experiments.flower.superlink_run import connection_toml
from fedsketch.config import RunConfig
from strategies.server_app import poll_replies_sooner
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


def test_simulated_nodes_share_the_visible_gpus() -> None:
    """Ray hides GPUs from workers that ask for none: on a GPU machine the nodes must ask for a share."""
    assert gpus_per_node(4, None, visible_gpus=0) == 0.0
    assert gpus_per_node(4, None, visible_gpus=1) == 0.25
    assert gpus_per_node(2, None, visible_gpus=8) == 1.0
    assert gpus_per_node(4, 0.5, visible_gpus=1) == 0.5
    assert "num-gpus = 0.25" in connection_toml(Federation(num_supernodes=4, gpus_per_client=0.25), "127.0.0.1:1")
    with pytest.raises(ValueError, match="no CUDA GPU is visible"):
        gpus_per_node(2, 0.5, visible_gpus=0)
    with pytest.raises(ValueError, match="must be >= 0"):
        gpus_per_node(2, -1.0, visible_gpus=1)


def test_simulated_nodes_split_the_cores_so_each_has_one_worker_and_none_idles() -> None:
    """Flower starts a ClientApp worker per ``num-cpus`` the machine holds, whatever the number of nodes."""
    assert cpus_per_node(1, cores=2) == 2  # one worker, not one busy and one idle
    assert cpus_per_node(2, cores=2) == 1
    assert cpus_per_node(4, cores=2) == 1  # more nodes than cores: one CPU each, nodes wait for a worker
    assert cpus_per_node(4, cores=16) == 4
    assert "num-cpus = 2" in connection_toml(Federation(num_supernodes=1, cpus_per_client=2), "127.0.0.1:1")


def test_fedsketch_run_refuses_a_gpu_share_without_a_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible here")
    assert main(["run", "--gpus-per-node", "0.5", "--set", "num-rounds=1"]) == 2
    assert "--gpus-per-node 0.5 asks for a GPU share, but no CUDA GPU is visible" in capsys.readouterr().err
