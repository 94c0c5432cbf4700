"""Who takes part in a round.

Flower's own strategies compute a sample size before all nodes have registered
(with thousands of nodes, round 1 once sampled 38 of 5,000). Here the server
first waits for the nodes it needs, then samples a *fixed* number of logical
clients per round from a generator seeded by the run seed, so the same config
and seed select the same clients whatever the nodes' timing.
"""

from __future__ import annotations

import time
from logging import INFO

import numpy as np
from flwr.common.logger import log
from flwr.serverapp import Grid


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
    cids: list[int], nodes: list[int], homes: dict[int, int]
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
