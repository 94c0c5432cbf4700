"""A deployed round needs a quorum of the nodes, not all of them: a node gone for good is counted and the run goes on."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from bridge.flower import task_identity
from experiments.deployment.deploy_commands import node_settings, quorum
from experiments.running.inprocess_grid import InProcessGrid
from fedsketch.config import RunConfig
from strategies.server_app import build_strategy

SETTINGS = {
    **node_settings(4),
    "num-rounds": 5,
    "eval-every": 1,
    "model-hidden": 16,
    "k": 30,
    "sketch-rows": 3,
    "sketch-cols": 400,
    "round-timeout": 5.0,  # a round that waits for nodes (it must not) fails in seconds
}


class Losing(InProcessGrid):
    """Four nodes, one of which is gone from the third round's sampling on (its device lost for good)."""

    def __init__(self, run_config: dict[str, object]) -> None:
        super().__init__(run_config, num_nodes=4)
        self.looks = 0

    def get_node_ids(self) -> list[int]:
        self.looks += 1
        return list(self.contexts)[: 3 if self.looks >= 3 else 4]


def test_a_quorum_is_a_majority_of_the_nodes() -> None:
    assert [quorum(n) for n in (1, 2, 3, 4, 5, 16)] == [1, 2, 2, 3, 3, 9]
    assert node_settings(4) == {"client-assignment": "node", "num-clients": 4, "clients-per-round": 4, "min-nodes": 3}


def test_a_node_gone_for_good_is_counted_each_round_and_the_run_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = RunConfig.from_mapping(SETTINGS)
    strat = build_strategy(cfg, tmp_path)
    with caplog.at_level(logging.WARNING, logger="flwr"), task_identity():
        strat.start(Losing(cfg.to_mapping()))  # type: ignore[arg-type]
    rounds = [json.loads(line) for line in (tmp_path / "rounds.jsonl").read_text().splitlines()]
    assert [(r["round"], r["missing_nodes"], r["sampled"], r["clients"], r["applied"]) for r in rounds] == [
        (1, 0, 4, 4, True),
        (2, 0, 4, 4, True),
        (3, 1, 3, 3, True),
        (4, 1, 3, 3, True),
        (5, 1, 3, 3, True),
    ]
    assert "round 3: 1 of the 4 nodes missing; going on with 3" in caplog.text
    assert [json.loads(line)["round"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [
        1,
        2,
        3,
        4,
        5,
    ]


def test_simulated_nodes_are_never_missing(tmp_path: Path) -> None:
    """In simulation a node runs a cohort of clients: fewer nodes than clients is the normal case."""
    cfg = RunConfig.from_mapping({**SETTINGS, "client-assignment": "cohort", "num-clients": 8, "min-nodes": 1})
    strat = build_strategy(cfg, tmp_path)
    with task_identity():
        strat.start(InProcessGrid(cfg.to_mapping(), num_nodes=2))  # type: ignore[arg-type]
    rounds = [json.loads(line) for line in (tmp_path / "rounds.jsonl").read_text().splitlines()]
    assert [r["missing_nodes"] for r in rounds] == [0] * 5
