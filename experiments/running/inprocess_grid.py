"""A federation in one process: the real strategy and the real ClientApp, without Flower's transport.

:class:`InProcessGrid` serves the part of ``flwr.serverapp.Grid`` the strategy
uses by calling the project's real ClientApp on each message, one ``Context``
per node so node state persists between rounds; each node receives a copy of
its message, as over the network, and every byte is still counted from the
serialized records. The payload table (:mod:`experiments.bench.payload_bytes`) and the
tests drive rounds with it. Its replies are computed when a request is pushed and
handed out by the pulls that follow (``late`` holds a node's back for a number of
pulls); waits between pulls pass at once on its own clock (:class:`VirtualTime`),
so a reply that never comes times out without the real seconds. ``Message(...)`` for an instruction needs the
identity of a running task (``TaskIdentity``); :func:`task_identity` provides one.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from flwr.app import Context, Message, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from bridge.messages import delivered
from clients.client_app import app as client_app
from strategies.waiting import Clock

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


@dataclass
class VirtualTime:
    """The in-process federation's time: a sleep passes at once, advances ``now`` and is recorded."""

    now_s: float = 0.0
    waits: list[float] = field(default_factory=list)

    def now(self) -> float:
        return self.now_s

    def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.now_s += seconds


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
    late
        Node id -> the pull after a push (1 for the first) from which that node's reply is handed
        out; 1 for nodes not named.
    """

    def __init__(
        self,
        run_config: dict[str, Any],
        num_nodes: int = 2,
        tamper: Tamper | None = None,
        shuffle_seed: int | None = None,
        app: Callable[[Message, Context], Message] = client_app,
        deliver: Callable[[Message], Message] | None = None,
        late: Mapping[int, int] | None = None,
    ) -> None:
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
        self.late = dict(late or {})
        self.time = VirtualTime()
        self.clock = Clock(self.time.now, self.time.sleep)
        self.pulls = 0  # pull_messages calls, all exchanges together
        self._pending: list[tuple[int, Message]] = []  # (the pull that hands it out, reply) of the last push
        self._pulled = 0  # pulls since the last push

    def get_node_ids(self) -> list[int]:
        return list(self.contexts)

    def push_messages(self, messages: Iterable[Message]) -> list[str]:
        """Deliver each request to its node, run the ClientApp, keep the replies for the pulls; the ids.

        Replies an earlier push left unpulled are dropped: nobody waits for them any more.
        """
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
        node_of = {msg.metadata.message_id: msg.metadata.dst_node_id for msg in requests}
        nodes = [node_of.get(r.metadata.reply_to_message_id, r.metadata.src_node_id) for r in replies]
        self._pending = [(self.late.get(node, 1), reply) for node, reply in zip(nodes, replies)]
        self._pulled = 0
        return [msg.metadata.message_id for msg in requests]

    def pull_messages(self, message_ids: Iterable[str]) -> list[Message]:
        """The replies of the last push that are due by this pull, each once (all of them, as the tamper left them)."""
        self.pulls += 1
        self._pulled += 1
        due = [reply for at, reply in self._pending if at <= self._pulled]
        self._pending = [(at, reply) for at, reply in self._pending if at > self._pulled]
        return due

    def send_and_receive(self, messages: Iterable[Message], timeout: float | None = None) -> list[Message]:
        """Push, then every reply at once, ``late`` or not (this federation answers within the push)."""
        self.push_messages(messages)
        replies = [reply for _, reply in self._pending]
        self._pending = []
        return replies
