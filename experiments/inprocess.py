"""A federation in one process: the real strategy and the real ClientApp, without Flower's transport.

:class:`InProcessGrid` serves the part of ``flwr.serverapp.Grid`` the strategy
uses by calling the project's real ClientApp on each message, one ``Context``
per node so node state persists between rounds; each node receives a copy of
its message, as over the network, and every byte is still counted from the
serialized records. The payload table (:mod:`experiments.payload_bytes`) and the
tests drive rounds with it. ``Message(...)`` for an instruction needs the
identity of a running task (``TaskIdentity``); :func:`task_identity` provides one.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from flwr.app import Context, Message, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from clients.client_app import app as client_app
from clients.messages import delivered

Tamper = Callable[[list[Message], list[Message]], list[Message]]
"""Given the requests and the honest replies, the replies the server receives."""


@contextmanager
def task_identity(run_id: int = 1) -> Iterator[None]:
    """Let this process build instruction messages, as a ServerApp task could."""
    saved = (TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = run_id, 0, 0
    try:
        yield
    finally:
        TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = saved


class InProcessGrid:
    """The part of ``flwr.serverapp.Grid`` that the strategies use, served by the real ClientApp.

    Parameters
    ----------
    run_config
        The run config every node's context carries (kebab-case keys).
    num_nodes
        Node ids are ``101, 102, ...``.
    tamper
        Rewrites the replies of each exchange (drop, corrupt, add, reorder).
    deliver
        Rewrites each request as its node receives it (e.g. a client left out of the round).
    shuffle_seed
        If given, replies come back in a shuffled order (as over a network).
    app
        The ClientApp the nodes run (the project's own unless given).
    """

    def __init__(
        self, run_config: dict[str, Any], num_nodes: int = 2, tamper: Tamper | None = None,
        shuffle_seed: int | None = None, app: Callable[[Message, Context], Message] = client_app,
        deliver: Callable[[Message], Message] | None = None,
    ) -> None:  # fmt: skip
        self.contexts = {
            nid: Context(
                run_id=1,
                node_id=nid,
                node_config={"partition-id": i, "num-partitions": num_nodes},
                state=RecordDict(),
                run_config=dict(run_config),
            )
            for i, nid in enumerate(range(101, 101 + num_nodes))
        }
        self.tamper, self.deliver = tamper, deliver
        self.app = app
        self.rng = random.Random(shuffle_seed) if shuffle_seed is not None else None
        self.exchanges = 0

    def get_node_ids(self) -> list[int]:
        return list(self.contexts)

    def send_and_receive(self, messages: Iterable[Message], timeout: float | None = None) -> list[Message]:
        requests = list(messages)
        for i, msg in enumerate(requests):  # as Flower's grids do when they push a message: its id, set in place
            msg.metadata.__dict__["_message_id"] = f"{self.exchanges}.{i}"
        received = [delivered(msg) for msg in requests]
        if self.deliver is not None:
            received = [self.deliver(msg) for msg in received]
        replies = [self.app(msg, self.contexts[msg.metadata.dst_node_id]) for msg in received]
        self.exchanges += 1
        if self.tamper is not None:
            replies = self.tamper(requests, replies)
        if self.rng is not None:
            self.rng.shuffle(replies)
        return replies
