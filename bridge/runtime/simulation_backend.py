"""Flower's simulation runtime with the ClientApp run in the simulation process itself, instead of Ray actors.

Flower's simulation engine (1.41 and 1.42; ``flwr/server/superlink/fleet/vce/vce_api.py``)
routes every message through its link state to worker threads, each of which
hands a message and its node's ``Context`` to a :class:`Backend`
(``backend.py``: ``build``, ``num_workers``, ``process_message``,
``terminate``). The only backend it ships is Ray's, and ``start_vce`` imports it
by name (``from .backend.raybackend import RayBackend``). On one machine Ray
costs more than it gives: its services and one worker process per node that
each import torch and the data (their memory and start-up are measured in
docs/simulation.md, "One process or Ray").

:class:`InProcessBackend` runs the ClientApp in the process that already holds
the ServerApp (and so already imported torch and the data), on ``num_workers``
of Flower's own worker threads. Everything else is Flower's: the SuperLink,
``flwr run``, the simulation process, its link state and message routing, the
per-node ``Context`` and the error replies. Each node gets a copy of its
message, as it would over Ray or the network; bytes are still counted from
the serialized records.

:func:`install` puts it where ``start_vce`` looks. One module calls it,
:mod:`clients.inprocess_app`, which ``fedsketch run --backend
inprocess`` names as the run's ClientApp; Flower imports the ClientApp in
``start_vce`` before it builds the backend. Importing the ClientApp itself
(:mod:`clients.client_app`: Ray, a multi-machine run, a deployed SuperNode,
``flwr run .``) changes nothing.

With it, :func:`pick_up_sooner` also shortens the wait of the engine's loop
that moves messages from the link state to the workers: Flower's waits 0.1 s
between looks, on average 0.05 s of every round (docs/simulation.md, "Where a round goes").
"""

from __future__ import annotations

import inspect
import os
import sys
import threading
import types
from collections.abc import Callable, Mapping
from logging import INFO, WARNING
from queue import Queue
from typing import Any

from flwr.app import Context, Message
from flwr.clientapp.client_app import ClientApp, ClientAppException, LoadClientAppError
from flwr.common.logger import log
from flwr.server.superlink.fleet.vce.backend import Backend, BackendConfig

from bridge.messages import delivered
from fedsketch import wire

RAY_MODULE = "flwr.server.superlink.fleet.vce.backend.raybackend"
"""Where Flower's ``start_vce`` (1.41, 1.42) imports its backend from."""
PICKUP_S_PER_NODE = 0.005
"""The pick-up loop's wait per node: each look asks the link state once per node (2 nodes: a look every 10 ms)."""
FLOWER_PICKUP_S = 0.1
"""Flower's wait in ``add_messages_to_queue`` (1.41, 1.42), never exceeded."""
PICKUP_PARAMETERS = ["state", "queue", "nodes_mapping", "f_stop"]


def worker_count(num_cpus: float, cores: int | None = None) -> int:
    """How many messages run at once: the machine's cores over each node's CPUs, as Ray's actor pool sizes itself."""
    cores = cores if cores is not None else len(os.sched_getaffinity(0))
    return max(1, int(cores // max(1.0, num_cpus)))


class InProcessBackend(Backend):
    """Runs each message's ClientApp call on the calling worker thread of Flower's simulation engine.

    Parameters
    ----------
    backend_config
        Flower's backend config; ``client_resources.num_cpus`` (each node's CPUs,
        set by the launcher to the cores over the nodes) gives the number of
        workers, and torch's threads are the cores over the workers.
    """

    def __init__(self, backend_config: BackendConfig) -> None:
        super().__init__(backend_config)
        self.workers = worker_count(wire.config_float(backend_config.get("client_resources", {}), "num_cpus", 1.0))
        self.app: ClientApp | None = None
        self.threads = max(1, len(os.sched_getaffinity(0)) // self.workers)

    @property
    def num_workers(self) -> int:
        """Messages processed at once (one per worker thread)."""
        return self.workers

    def build(self, app_fn: Callable[[], ClientApp]) -> None:
        """Load the ClientApp once."""
        self.app = app_fn()
        log(
            INFO,
            "fedsketch: ClientApp calls run in the simulation process, %d at once, %d torch threads each (no Ray)",
            self.workers,
            self.threads,
        )

    def is_worker_idle(self) -> bool:
        """Flower's engine gives a message to a free worker thread; the backend itself never queues."""
        return True

    def process_message(self, message: Message, context: Context) -> tuple[Message, Context]:
        """The ClientApp's reply to a copy of ``message``, and the node's updated ``Context``.

        Messages run at once from the first: the ServerApp, in this process,
        has loaded the data before it sent any (and each thread builds its own
        scratch model), so there is no cache for the first message to warm.
        """
        if self.app is None:
            raise ValueError("InProcessBackend.process_message called before build()")
        # torch's thread count is per thread once set (setting it again costs 0.06 us): the workers share the
        # cores, while the ServerApp's thread keeps them all for its evaluation, when the workers are idle.
        import torch  # here, not at the top: the launcher reads this module's names without torch

        torch.set_num_threads(self.threads)
        try:
            return self.app(message=delivered(message), context=context), context
        except LoadClientAppError:
            raise
        except Exception as exc:  # Flower's engine turns this into an error reply, as for Ray
            raise ClientAppException(str(exc)) from exc

    def terminate(self) -> None:
        """Nothing to stop: the workers are Flower's threads."""


def pickup_wait(nodes: int) -> float:
    """Seconds between the pick-up loop's looks: 5 ms a node (each look costs a link-state query a node), at most Flower's 0.1 s."""
    return min(FLOWER_PICKUP_S, PICKUP_S_PER_NODE * max(1, nodes))


def add_messages_to_queue(
    state: Any, queue: Queue[Any], nodes_mapping: Mapping[int, int], f_stop: threading.Event
) -> None:
    """Flower's ``vce_api.add_messages_to_queue`` (1.41, 1.42), looking every :func:`pickup_wait` seconds instead of 0.1 s.

    Each look takes at most one undelivered message per node from the link
    state and queues it for the workers, as Flower's loop does; it stops when
    ``f_stop`` is set.
    """
    wait = pickup_wait(len(nodes_mapping))
    while not f_stop.is_set():
        for node_id in nodes_mapping:
            for message in state.get_message_ins(node_id=node_id, limit=1):
                queue.put(message)
        f_stop.wait(wait)


def pick_up_sooner(vce_api: types.ModuleType) -> bool:
    """Put :func:`add_messages_to_queue` in place of the engine's own, if the engine's has the signature it replaces.

    ``run_api`` looks the loop up by name when it starts its threads, after the
    ClientApp (and so :func:`install`) is loaded. A Flower whose loop takes
    other arguments keeps its own, with a warning: slower, never wrong.
    """
    engine_loop = getattr(vce_api, "add_messages_to_queue", None)
    if engine_loop is add_messages_to_queue:
        return True
    if engine_loop is None or list(inspect.signature(engine_loop).parameters) != PICKUP_PARAMETERS:
        log(WARNING, "fedsketch: Flower's simulation engine changed; its message pick-up keeps its own 0.1 s wait")
        return False
    vce_api.add_messages_to_queue = add_messages_to_queue  # type: ignore[attr-defined]  # ModuleType declares none
    return True


def install() -> None:
    """Make Flower's simulation engine build an :class:`InProcessBackend` (only
    :mod:`clients.inprocess_app` calls this).

    Flower's real Ray backend module, if imported already, gets the class
    swapped; otherwise a stand-in module answers the engine's import, and Ray is
    never imported. The engine's message pick-up looks sooner (:func:`pick_up_sooner`).
    """
    module = sys.modules.get(RAY_MODULE)
    if module is None:
        module = types.ModuleType(
            RAY_MODULE, "fedsketch's in-process backend in place of Ray's (see bridge/runtime/simulation_backend.py)"
        )
        sys.modules[RAY_MODULE] = module
    module.RayBackend = InProcessBackend  # type: ignore[attr-defined]  # ModuleType declares none
    from flwr.server.superlink.fleet.vce import vce_api

    pick_up_sooner(vce_api)
