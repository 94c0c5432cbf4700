"""SecAgg+ for the methods whose uploads add up: the server learns only their sum.

Bell, Bonawitz, Gascon, Lepoint and Raykova, "Secure Single-Server Aggregation
with (Poly)Logarithmic Overhead", CCS 2020, as Flower 1.41 and 1.42 implement it:
``SecAggPlusWorkflow`` on the server, ``secaggplus_mod`` on the clients.
FetchSGD composes with it because a Count Sketch is linear: the sum of the
clients' tables is the table of the sum of their updates, and momentum, error
feedback and top-k on the server need nothing else.

Flower 1.41 and 1.42 offer SecAgg+ to their legacy strategies only: the workflow asks a
``flwr.server.strategy.Strategy`` for one ``FitIns`` per node through a
``LegacyContext``, runs the four stages (keys, shares, masked uploads, unmask)
and hands the unmasked weighted mean to the strategy's ``aggregate_fit``.
:class:`Bridge` is that legacy strategy: it sends the round's model and config
(as :mod:`fedsketch.wire` lays them out) and catches the mean. The client side
is ``clients/secure.py``.

What changes with it (see docs/trust.md):

- Each node uploads ``n * x / max_weight`` clipped to ``[-clip, clip]`` and
  stochastically rounded to ``2**22`` levels, masked. The sum's error is below
  one level per node, divided by the total weight.
- The server cannot validate, clip or weigh single clients: it sees each node's
  example count and the unmasked mean only; the mean's shape and finiteness are
  checked. Clipping (``clip-norm``) is done by the nodes, for their own clients.
- A node sums its cohort before masking; with one client per node (deployment)
  the server learns sums over clients, in simulation sums over nodes.
- Flower's rounding draws from numpy's global generator: secure runs are not
  bit-reproducible.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.serverapp import Grid

from bridge.legacy import (
    MAIN_CONFIGS_RECORD,
    MAIN_PARAMS_RECORD,
    ClientManager,
    ClientProxy,
    FitIns,
    FitRes,
    GridClientProxy,
    LegacyContext,
    LegacyStrategy,
    Parameters,
    SecAggPlusWorkflow,
    WorkflowKey,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from bridge.messages import wire_bytes
from fedsketch import wire
from fedsketch.methods import ClientUpdate
from fedsketch.methods.method import Layout
from fedsketch.server.books import Counts
from strategies import waiting
from strategies.plan import RoundPlan
from strategies.replies import RoundReplies

CLIPPING_RANGE = 8.0  # Flower's default: a node's weighted values must lie in [-8, 8]
QUANTIZATION_RANGE = 2**22


class CountingGrid:
    """A grid that counts the serialized bytes of every message it sends and receives.

    ``send_and_receive`` is all the workflow and its client proxies call of a grid (Flower 1.42); it waits
    on :mod:`strategies.waiting`'s schedule.
    """

    def __init__(self, grid: Grid) -> None:
        self.grid, self.sent, self.received = grid, 0, 0

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        messages = list(messages)
        self.sent += sum(wire_bytes(m.content) for m in messages)
        replies = waiting.send_and_receive(self.grid, messages, timeout)
        self.received += sum(wire_bytes(m.content) for m in replies if not m.has_error())
        return replies


class Bridge(LegacyStrategy):
    """The legacy strategy the workflow drives: our per-node requests out, the unmasked mean back."""

    def __init__(self, requests: dict[int, FitIns], grid: Grid) -> None:
        self.requests, self.grid = requests, grid
        self.mean: list[np.ndarray] | None = None
        self.results: dict[int, FitRes] = {}

    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        return [(GridClientProxy(node, self.grid, 0), fitins) for node, fitins in self.requests.items()]

    def aggregate_fit(
        self, server_round: int, results: list[tuple[ClientProxy, FitRes]], failures: list[Any]
    ) -> tuple[Parameters | None, dict[str, Any]]:
        """Every FitRes carries the same unmasked mean; keep it (and each node's metrics)."""
        self.results = {int(proxy.node_id): res for proxy, res in results}
        if results:
            self.mean = parameters_to_ndarrays(results[0][1].parameters)
        return None, {}

    def initialize_parameters(self, client_manager: ClientManager) -> Parameters | None:
        return None

    def configure_evaluate(self, *args: Any, **kwargs: Any) -> list[Any]:
        return []

    def aggregate_evaluate(self, *args: Any, **kwargs: Any) -> tuple[None, dict[str, Any]]:
        return None, {}

    def evaluate(self, *args: Any, **kwargs: Any) -> None:
        return None


def secure_mean(
    grid: Grid,
    sent: dict[int, list[int]],
    weights: np.ndarray,
    config: dict[str, Any],
    max_weight: float,
    timeout: float,
) -> tuple[Bridge, CountingGrid]:
    """Run one SecAgg+ round over the nodes of ``sent``; the bridge holds the mean (``None`` if it halted).

    ``max_weight`` bounds a node's example count (Flower warns, and may
    overflow, above it); ``config`` is the round's config without the cids.
    """
    model = ndarrays_to_parameters([np.ascontiguousarray(weights, dtype=np.float32)])
    # The legacy type says scalars; the ConfigRecord it becomes on the wire holds the list of cids as well.
    requests = {
        node: FitIns(model, {**config, wire.CIDS: cids})  # type: ignore[dict-item]  # legacy Config: scalars only
        for node, cids in sent.items()
    }
    counting = CountingGrid(grid)
    bridge = Bridge(requests, cast(Grid, counting))
    context = LegacyContext(
        Context(run_id=0, node_id=0, node_config={}, state=RecordDict(), run_config={}), strategy=bridge
    )
    context.state.config_records[MAIN_CONFIGS_RECORD] = ConfigRecord({WorkflowKey.CURRENT_ROUND: config[wire.ROUND]})
    context.state.array_records[MAIN_PARAMS_RECORD] = ArrayRecord()
    workflow = SecAggPlusWorkflow(
        num_shares=1.0,
        reconstruction_threshold=0.5,
        max_weight=max_weight,
        clipping_range=CLIPPING_RANGE,
        quantization_range=QUANTIZATION_RANGE,
        timeout=timeout,
    )
    workflow(cast(Grid, counting), context)
    return bridge, counting


def quantization_error(nodes: int, total_weight: float) -> float:
    """The largest error of one entry of the securely aggregated mean: one level per node, over the weight."""
    return nodes * (2 * CLIPPING_RANGE / QUANTIZATION_RANGE) / total_weight


@dataclass(frozen=True)
class SecureRound:
    """What one SecAgg+ round gave the strategy: at most one update, the sum."""

    replies: RoundReplies  # the sum as one update (none if the protocol gave no usable sum), and who failed
    contributors: int  # the clients whose updates are in the sum
    refused: str  # why there is no usable sum ("" when there is one)
    counts: Counts  # the bytes both ways, and the clients and dense bytes the sum stands for


def secure_round(
    p: RoundPlan,
    weights: np.ndarray,
    layout: Layout,
    dense_bytes: int,
    max_examples: int,
    timeout: float,
) -> SecureRound:
    """One round through SecAgg+ instead of plain uploads: only the sum reaches the method's step.

    The nodes clip their own clients (``clients/secure.py``), so the strategy
    applies the sum as it is; the bytes both ways are what the protocol's four
    stages serialized, returned in its counts.
    """
    per_node = max(max(1, len(cids)) for cids in p.sent.values())
    bridge, counting = secure_mean(p.grid, p.sent, weights, p.config, float(max_examples * per_node), timeout)
    billed = {"download": counting.sent, "download_sent": counting.sent, "upload": counting.received}
    got, answered = RoundReplies(upload_bytes=counting.received), bridge.results
    got.timeouts = sum(max(1, len(c)) for node, c in p.sent.items() if node not in answered)
    got.errors = sum(int(res.metrics.get("failed", 0)) for res in answered.values())
    contributors = sum(int(res.metrics.get("clients", 0)) for res in answered.values())
    payload, why = checked_mean(bridge.mean, layout)
    if payload is None:
        got.rejected = contributors
        return SecureRound(got, contributors, why, billed)
    losses = [float(res.metrics["loss"]) for res in answered.values() if "loss" in res.metrics]
    loss = float(np.mean(losses)) if losses else float("nan")
    got.updates = [ClientUpdate(-1, payload, 1, loss, counting.received)]
    return SecureRound(got, contributors, "", {**billed, "clients": contributors, "dense": dense_bytes * contributors})


def checked_mean(mean: list[np.ndarray] | None, spec: Layout) -> tuple[dict[str, np.ndarray] | None, str]:
    """The unmasked mean as the method's payload, if it has the method's exact layout and is finite."""
    if mean is None:
        return None, "the protocol halted (too few nodes answered)"
    if not isinstance(spec, dict):  # a decoder checks one client's encoding, not a sum of them
        return None, "the method's layout is a decoder, not exact shapes: a sum cannot be checked against it"
    names = sorted(spec)
    if len(mean) != len(names) or any(arr.shape != spec[n][0] for n, arr in zip(names, mean)):
        return None, f"arrays of shapes {[a.shape for a in mean]}; expected {[spec[n][0] for n in names]}"
    if not all(np.isfinite(arr).all() for arr in mean):
        return None, "NaN or Inf in the sum"
    return {n: arr.astype(spec[n][1]) for n, arr in zip(names, mean)}, ""
