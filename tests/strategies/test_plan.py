"""Who takes part in a round and where it runs (``strategies/plan.py``), by properties the sampling tests leave open.

A stateless round spreads its sorted clients over the sorted nodes in turn; a
client that keeps state stays on its home node while that node is connected,
and a new or homeless client goes to the node that is home to the fewest
clients (ties: the smaller id). The server waits for the nodes it needs,
polling every half second, and names what it waited for when it gives up.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import replace
from types import SimpleNamespace
from typing import cast

import pytest
from flwr.serverapp import Grid

from fedsketch import wire
from fedsketch.config import RunConfig
from fedsketch.server.books import Books
from strategies import plan
from tests.federation import TestGrid

NODES = [101, 102, 103]


def grid_of(cfg: RunConfig, nodes: int) -> Grid:
    return cast(Grid, TestGrid(cfg.to_mapping(), num_nodes=nodes))


class Connecting(TestGrid):
    """A federation whose nodes connect one per look: the first look sees one node, the next two, and so on."""

    def __init__(self, run_config: dict[str, object], num_nodes: int) -> None:
        super().__init__(run_config, num_nodes=num_nodes)
        self.looks = 0

    def get_node_ids(self) -> list[int]:
        self.looks += 1
        return list(self.contexts)[: self.looks]


def test_a_stateless_round_spreads_its_sorted_clients_over_the_sorted_nodes_in_turn() -> None:
    cfg = RunConfig.from_mapping({"num-clients": 30, "clients-per-round": 8, "seed": 4})
    homes = {4: 102}  # a stateless round leaves the homes it is given as they are, and uses none of them
    for rnd in range(1, 6):
        sent, kept = plan.assign(cfg, rnd, grid_of(cfg, 3), homes, stateful=False)
        cids = plan.sample_clients(cfg.seed, rnd, cfg.num_clients, cfg.clients_per_round)
        assert sent == {node: cids[i::3] for i, node in enumerate(NODES)}, rnd
        assert kept is homes


def test_a_stateful_client_stays_on_its_home_node_and_homes_stay_balanced() -> None:
    cfg = RunConfig.from_mapping({"num-clients": 12, "clients-per-round": 5, "seed": 2})
    homes: Mapping[int, int] = {}
    first_home: dict[int, int] = {}
    for rnd in range(1, 30):
        sent, homes = plan.assign(cfg, rnd, grid_of(cfg, 3), homes, stateful=True)
        placed = {cid: node for node, cids in sent.items() for cid in cids}
        assert sorted(placed) == plan.sample_clients(cfg.seed, rnd, cfg.num_clients, cfg.clients_per_round)
        for cid, node in placed.items():
            assert first_home.setdefault(cid, node) == node, (rnd, cid)
        assert homes == first_home
    homes_per_node = [list(first_home.values()).count(n) for n in NODES]
    assert sum(homes_per_node) == 12 and max(homes_per_node) - min(homes_per_node) <= 1


def test_new_clients_go_to_the_node_home_to_fewest_clients_ties_to_the_smaller_id() -> None:
    homes = {0: 101, 1: 101, 2: 102, 3: 999}  # 999 is gone: its client counts for no node
    sent, new_homes, lost = plan.assign_homes([0, 5, 6, 7, 8], NODES, homes)
    # loads 101: 2, 102: 1, 103: 0 -> 5 to 103; 102 and 103 tie at 1 -> 6 to 102; 7 to 103; all at 2 -> 8 to 101
    assert sent == {101: [0, 8], 103: [5, 7], 102: [6]}
    assert list(sent) == [101, 103, 102]  # in the order the clients were placed
    assert new_homes == {0: 101, 1: 101, 2: 102, 3: 999, 5: 103, 6: 102, 7: 103, 8: 101}
    assert lost == [] and homes == {0: 101, 1: 101, 2: 102, 3: 999}  # the caller's map is not changed


def test_a_client_whose_home_node_is_gone_is_rehomed_and_reported_lost() -> None:
    sent, new_homes, lost = plan.assign_homes([4, 9, 11], [101, 102], {4: 999, 9: 102, 11: 998})
    assert lost == [4, 11]
    # loads 101: 0, 102: 1 -> 4 to 101; 9 stays home on 102; then both at 1 -> 11 to 101
    assert sent == {101: [4, 11], 102: [9]}
    assert new_homes == {4: 101, 9: 102, 11: 101}


def test_the_round_warns_which_clients_lost_their_node(caplog: pytest.LogCaptureFixture) -> None:
    cfg = RunConfig.from_mapping({"num-clients": 10, "clients-per-round": 4, "seed": 1})
    cids = plan.sample_clients(cfg.seed, 7, cfg.num_clients, cfg.clients_per_round)
    homes = {cids[0]: 999, cids[2]: 102}
    with caplog.at_level(logging.WARNING, logger="flwr"):
        sent, new_homes = plan.assign(cfg, 7, grid_of(cfg, 2), homes, stateful=True)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert [r.getMessage() for r in warnings] == [
        f"round 7: clients [{cids[0]}] lost their node and start without state"
    ]
    assert new_homes[cids[0]] in (101, 102) and new_homes[cids[2]] == 102
    assert homes == {cids[0]: 999, cids[2]: 102}  # the caller's map is not changed
    assert cids[2] in sent[102]


def test_waiting_polls_every_half_second_until_exactly_enough_nodes_connect(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    grid = Connecting({}, num_nodes=4)
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        time.sleep(seconds)

    monkeypatch.setattr(plan, "time", SimpleNamespace(monotonic=time.monotonic, sleep=sleep))
    with caplog.at_level(logging.INFO, logger="flwr"):
        nodes = plan.wait_for_nodes(cast(Grid, grid), needed=2, timeout=60.0)
    assert nodes == [101, 102] and grid.looks == 2  # returns at the first look that sees enough
    assert slept == [0.5]  # one poll of 0.5 s
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.INFO] == [
        "waiting for nodes: 1 of 2 connected"
    ]


def test_waiting_gives_up_after_the_timeout_naming_what_it_waited_for() -> None:
    cfg = RunConfig.from_mapping({})
    with pytest.raises(TimeoutError) as err:
        plan.wait_for_nodes(grid_of(cfg, 1), needed=3, timeout=0.0)
    assert str(err.value) == "only 1 of the 3 nodes needed connected within 0 s"


def test_a_request_tells_each_stateful_client_its_last_applied_round_or_none() -> None:
    config = {"lr": 0.5}
    rp = plan.RoundPlan(4, grid_of(RunConfig.from_mapping({}), 2), {101: [1, 2, 3]}, config, {})
    assert rp.node_config([1, 2, 3], None) == config  # clients without state are told nothing
    told = rp.node_config([1, 2, 3], {2: 3, 7: 1})
    assert told == {"lr": 0.5, wire.SETTLED: [-1, 3, -1]}  # wire.SETTLED: -1 is "none applied"
    assert config == {"lr": 0.5}


def test_a_plan_counts_and_names_its_logical_clients() -> None:
    books = replace(Books.start(1, False), node_cid={102: 7})
    rp = plan.RoundPlan(2, grid_of(RunConfig.from_mapping({}), 3), {101: [1, 4], 102: [], 103: []}, {}, {})
    assert rp.sampled() == 4  # two logical clients on 101, and each deployed node its own
    assert rp.targets(books) == {101: [1, 4], 102: [7], 103: [wire.NEW_CLIENT]}
    assert plan.RoundPlan(2, rp.grid, {101: [3]}, {}, {}).sampled() == 1


def test_missing_nodes_are_counted_and_named_only_when_some_are(caplog: pytest.LogCaptureFixture) -> None:
    """One client per node: ``num-clients`` nodes; those not connected are counted and named, none otherwise."""
    cfg = RunConfig.from_mapping({"client-assignment": "node", "num-clients": 5, "clients-per-round": 3})
    with caplog.at_level(logging.WARNING, logger="flwr"):
        counts = [plan.missing_nodes(cfg, connected, 3) for connected in (5, 6, 3)]
    assert counts == [0, 0, 2]
    assert caplog.messages == ["round 3: 2 of the 5 nodes missing; going on with 3"]
    assert plan.missing_nodes(replace(cfg, client_assignment="cohort"), 1, 3) == 0
