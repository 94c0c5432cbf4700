"""Who takes part in a round, and where each logical client runs.

Flower's own strategies compute a sample size before all nodes have registered
(with thousands of nodes, round 1 once sampled 38 of 5,000). Here the server
first waits for the nodes it needs, then samples a fixed number of logical
clients from a generator seeded by the run seed, so the same config and seed
select the same clients whatever the nodes' timing. A client
that keeps state always goes to the same node (its home); with one client per
node (deployment) the server samples nodes and each names its own client.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from logging import INFO, WARNING, getLogger
from typing import Any

import numpy as np
from flwr.serverapp import Grid

from fedsketch import wire
from fedsketch.config import RunConfig
from fedsketch.server.books import Books

log = getLogger("flwr").log  # Flower's own logger: the lines go where Flower's go (flower.log)


@dataclass(frozen=True)
class RoundPlan:
    """One round's clients and config, from sampling until the round is applied or skipped."""

    server_round: int
    grid: Grid
    sent: dict[int, list[int]]  # node -> its logical clients ([]: the node's own client, deployment)
    config: dict[str, Any]  # what every message of the round carries besides the clients (lr included)
    echo: dict[str, Any]  # what every reply must repeat (the method's round settings)
    missing: int = 0  # the federation's nodes not connected when the round was sampled (:func:`missing_nodes`)

    def node_config(self, clients: list[int], applied: Mapping[int, int] | None) -> dict[str, Any]:
        """The config of a message to ``clients``; where clients keep state (``applied``: the last round each
        one's upload was applied), each one's settled round."""
        if applied is None:
            return self.config
        return {**self.config, wire.SETTLED: [applied.get(cid, -1) for cid in clients]}

    def sampled(self) -> int:
        """Logical clients asked this round."""
        return sum(max(1, len(cids)) for cids in self.sent.values())

    def targets(self, books: Books) -> dict[int, list[int]]:
        """Each node's clients as far as the server knows them.

        A deployed node's client is known once the node has replied; before that it is ``wire.NEW_CLIENT``, so
        the method's request for a client it has not heard from still reaches the node.
        """
        return {node: cids or [books.node_cid.get(node, wire.NEW_CLIENT)] for node, cids in self.sent.items()}


def assign(
    cfg: RunConfig,
    server_round: int,
    grid: Grid,
    homes: Mapping[int, int],
    stateful: bool,
    nodes: list[int] | None = None,
) -> tuple[dict[int, list[int]], Mapping[int, int]]:
    """Wait for the nodes (unless given the connected ``nodes``), sample this round's clients and assign them to
    nodes (node -> clients).

    Also returns where stateful clients' state is kept now (``homes`` as it was for other methods).
    """
    nodes = nodes if nodes is not None else wait_for_nodes(grid, cfg.min_nodes, cfg.round_timeout)
    if cfg.client_assignment == "node":  # one client per node, whose data is the node's own
        rng = np.random.default_rng([cfg.seed, server_round])
        # Sample positions, not ids: node ids are uint64 and a numpy array of
        # them may turn into float64 and lose digits.
        chosen = rng.choice(len(nodes), size=min(cfg.clients_per_round, len(nodes)), replace=False)
        return {nodes[int(i)]: [] for i in sorted(chosen)}, homes
    cids = sample_clients(cfg.seed, server_round, cfg.num_clients, cfg.clients_per_round)
    if not stateful:
        return assign_cohorts(cids, nodes), homes
    sent, new_homes, lost = assign_homes(cids, nodes, homes)
    if lost:
        log(WARNING, "round %d: clients %s lost their node and start without state", server_round, lost)
    return sent, new_homes


def missing_nodes(cfg: RunConfig, connected: int, server_round: int) -> int:
    """How many of a deployment's nodes are not connected (one client per node: ``num-clients`` nodes); 0 in
    simulation, whose nodes are not clients. A round goes on with ``min-nodes`` of them (a quorum, deployed);
    the missing are counted in ``rounds.jsonl`` and named in the log."""
    if cfg.client_assignment != "node" or connected >= cfg.num_clients:
        return 0
    missing = cfg.num_clients - connected
    log(
        WARNING,
        "round %d: %d of the %d nodes missing; going on with %d",
        server_round,
        missing,
        cfg.num_clients,
        connected,
    )
    return missing


def wait_for_nodes(grid: Grid, needed: int, timeout: float, poll_s: float = 0.5) -> list[int]:
    """Block until at least ``needed`` nodes are connected; return their sorted ids.

    Raises
    ------
    TimeoutError
        If fewer than ``needed`` nodes connect within ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        nodes = sorted(grid.get_node_ids())
        if len(nodes) >= needed:
            return nodes
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {len(nodes)} of the {needed} nodes needed connected within {timeout:.0f} s")
        log(INFO, "waiting for nodes: %d of %d connected", len(nodes), needed)
        time.sleep(poll_s)


def sample_clients(seed: int, server_round: int, num_clients: int, per_round: int) -> list[int]:
    """``per_round`` distinct logical client ids for ``server_round`` (sorted)."""
    rng = np.random.default_rng([seed, server_round])
    return sorted(int(c) for c in rng.choice(num_clients, size=per_round, replace=False))


def assign_cohorts(cids: list[int], nodes: list[int]) -> dict[int, list[int]]:
    """Spread logical clients over nodes, as evenly as possible, in id order.

    Which node computes a client never changes the client's result (each
    client's randomness is its own), so the assignment only balances load.
    """
    out: dict[int, list[int]] = {}
    for i, cid in enumerate(cids):
        out.setdefault(nodes[i % len(nodes)], []).append(cid)
    return out


def assign_homes(
    cids: list[int], nodes: list[int], homes: Mapping[int, int]
) -> tuple[dict[int, list[int]], dict[int, int], list[int]]:
    """Send each client to the node that keeps its state ("home"), for methods with client state.

    A client seen for the first time, or whose home node has gone, gets the
    node that is home to the fewest clients (ties: the smaller id).

    Returns
    -------
    The assignment (node -> cids), the updated homes (cid -> node), and the
    clients that lost their home node (their state is gone: they start afresh).
    """
    alive = set(nodes)
    homes = dict(homes)
    load = dict.fromkeys(nodes, 0)
    for node in homes.values():
        if node in alive:
            load[node] += 1
    out: dict[int, list[int]] = {}
    lost = []
    for cid in cids:
        home = homes.get(cid)
        if home is not None and home in alive:
            node = home
        else:
            if home is not None:
                lost.append(cid)
            node = min(nodes, key=lambda n: (load[n], n))
            homes[cid] = node
            load[node] += 1
        out.setdefault(node, []).append(cid)
    return out, homes, lost
