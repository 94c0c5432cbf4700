"""Every registered method trains in both client assignments: a cohort per node, and one client per node.

``cohort`` (simulation) sends each node a list of logical clients; ``node``
(deployment) sends each sampled node one message and the node trains as its
own ``partition-id``, which the server learns only from its reply. Each method
runs two rounds of three of four clients, through the real strategy and the
real ClientApp (:class:`experiments.running.inprocess_grid.InProcessGrid`, one ``Context``
per node): both rounds must have every sampled client contribute and must move
the model, as the models sent to the nodes show. Round 2 samples client 0 for
the first time, so in node mode a node the server has not heard from joins a
round that is not the first. A client computes the same wherever it runs: the
node run's model must equal the cohort run's, bit for bit.

Every method works in both modes today; a method that cannot must be refused
by the config check (``fedsketch/validate.py``) with its reason, and tested here.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import torch
from flwr.app import Message

from bridge.flower import task_identity
from fedsketch import wire
from fedsketch.config import RunConfig
from fedsketch.methods import NAMES
from strategies.server_app import build_strategy
from tests.federation import TestGrid

pytestmark = pytest.mark.slow  # 22 runs of two rounds: about 20 s on 2 cores

SETTINGS = {
    "num-clients": 4,
    "clients-per-round": 3,
    "num-rounds": 2,
    "eval-every": 1,
    "model-hidden": 16,
    "k": 40,
    "sketch-rows": 3,
    "sketch-cols": 400,
}
NODES = {"cohort": 2, "node": 4}  # cohort: two nodes, each a cohort per message; node: one node per client
SAMPLED = 3


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@cache
def run(name: str, mode: str, out: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[Message], Any]:
    """Metrics rows, rounds rows, every request sent, and the final weights of one run."""
    nodes = NODES[mode]
    settings = {**SETTINGS, "strategy": name, "client-assignment": mode, "min-nodes": nodes}
    cfg = RunConfig.from_mapping(settings)
    strat = build_strategy(cfg, out / f"{name}-{mode}")
    sent: list[Message] = []

    def watch(requests: list[Message], replies: list[Message]) -> list[Message]:
        sent.extend(requests)
        return replies

    with task_identity():
        strat.start(TestGrid(cfg.to_mapping(), num_nodes=nodes, tamper=watch))  # type: ignore[arg-type]
    folder = out / f"{name}-{mode}"
    return _lines(folder / "metrics.jsonl"), _lines(folder / "rounds.jsonl"), sent, strat.weights


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("modes")


def _models(sent: list[Message]) -> list[torch.Tensor]:
    """The model each round sent (one per round: every node of a round gets the same)."""
    by_round: dict[int, torch.Tensor] = {}
    for msg in sent:
        config = msg.content.config_records[wire.CONFIG_KEY]
        if wire.MODEL_KEY in msg.content.array_records:
            w = torch.from_numpy(msg.content.array_records[wire.MODEL_KEY][wire.WEIGHTS].numpy())
            by_round.setdefault(int(config[wire.ROUND]), w)  # type: ignore[arg-type]
    return [by_round[r] for r in sorted(by_round)]


@pytest.mark.parametrize("mode", list(NODES))
@pytest.mark.parametrize("name", NAMES)
def test_two_rounds_with_every_sampled_client_contributing(name: str, mode: str, out: Path) -> None:
    metrics, rounds, sent, final = run(name, mode, out)
    assert [(r["round"], r["sampled"], r["clients"], r["applied"]) for r in rounds] == [
        (1, SAMPLED, SAMPLED, True),
        (2, SAMPLED, SAMPLED, True),
    ], rounds
    assert all(r["client_errors"] + r["rejected"] + r["timeouts"] == 0 for r in rounds), rounds
    assert [(r["round"], r["clients"]) for r in metrics] == [(1, SAMPLED), (2, SAMPLED)]
    assert all(r["upload_bytes"] > 0 for r in metrics)
    w0, w1 = _models(sent)
    assert not torch.equal(w1, w0) and not torch.equal(final, w1), "a round left the model where it was"
    assert bool(torch.isfinite(final).all())


@pytest.mark.parametrize("name", NAMES)
def test_one_client_per_node_computes_what_a_cohort_computes(name: str, out: Path) -> None:
    """In node mode every message names no client (the node is its own); the model is the cohort run's."""
    _, _, sent, node_final = run(name, "node", out)
    _, _, _, cohort_final = run(name, "cohort", out)
    for msg in sent:
        assert msg.content.config_records[wire.CONFIG_KEY][wire.CIDS] == []
    assert torch.equal(node_final, cohort_final)
