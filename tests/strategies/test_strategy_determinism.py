"""Same config and seed, same metrics: whatever the number of nodes and the order replies arrive in."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from bridge.flower import task_identity
from fedsketch.config import RunConfig
from strategies.server_app import build_strategy
from strategies.strategy import FedSketchStrategy
from tests.federation import TestGrid

SETTINGS = {
    "num-clients": 20,
    "clients-per-round": 6,
    "model-hidden": 16,
    "k": 30,
    "sketch-rows": 3,
    "sketch-cols": 400,
    "num-rounds": 3,
    "eval-every": 1,
    "lr-schedule": "cosine",
}
CLOCK = ("wall_s", "unix_time")
SENT = ("download_sent_bytes", "cum_download_sent_bytes")  # one model per message: depends on the node count


def run(cfg: RunConfig, out: Path, nodes: int, shuffle: int | None) -> tuple[FedSketchStrategy, list[dict[str, Any]]]:
    strat = build_strategy(cfg, out)
    with task_identity():
        strat.start(TestGrid(cfg.to_mapping(), num_nodes=nodes, shuffle_seed=shuffle))
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return strat, [{k: v for k, v in json.loads(line).items() if k not in CLOCK} for line in lines]


@pytest.mark.parametrize("name", ["fetchsgd", "fedavg", "true_topk", "qsgd", "terngrad"])
def test_same_config_and_seed_give_identical_metrics(tmp_path: Path, name: str) -> None:
    cfg = RunConfig.from_mapping({**SETTINGS, "strategy": name})
    first, rows = run(cfg, tmp_path / "a", nodes=2, shuffle=None)
    second, again = run(cfg, tmp_path / "b", nodes=3, shuffle=1)  # other cohorts, replies out of order
    assert torch.equal(first.weights, second.weights)
    assert [{k: v for k, v in r.items() if k not in SENT} for r in rows] == [
        {k: v for k, v in r.items() if k not in SENT} for r in again
    ] and len(rows) == 3
    assert rows[-1]["test_loss"] < rows[0]["test_loss"] or name in ("qsgd", "terngrad")


def test_another_seed_gives_other_metrics(tmp_path: Path) -> None:
    cfg = RunConfig.from_mapping(SETTINGS)
    _, rows = run(cfg, tmp_path / "a", nodes=2, shuffle=None)
    _, other = run(RunConfig.from_mapping({"seed": 1}, base=cfg), tmp_path / "b", nodes=2, shuffle=None)
    assert rows[-1]["test_loss"] != other[-1]["test_loss"]
