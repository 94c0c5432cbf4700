"""A federation in one process: the real strategy and the real ClientApp, without Flower's transport.

:class:`InProcessGrid` serves the part of ``flwr.serverapp.Grid`` the strategy
uses by calling the project's real ClientApp on each message, one ``Context``
per node so node state persists between rounds; each node receives a copy of
its message, as over the network, and every byte is still counted from the
serialized records. ``fedsketch plan`` runs its round through it. Its replies are computed
when a request is pushed and handed out by the next pull. ``Message(...)`` for an instruction
needs the identity of a running task: :func:`bridge.flower.task_identity` provides one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from flwr.app import Context, Message, RecordDict

from bridge.messages import delivered
from clients.client_app import app as client_app


class InProcessGrid:
    """The part of ``flwr.serverapp.Grid`` that the strategies use, served by the real ClientApp.

    Parameters
    ----------
    run_config
        The run config every node's context carries (kebab-case keys).
    num_nodes
        Node ids are ``101, 102, ...``.
    app
        The ClientApp the nodes run (the project's own unless given).
    """

    def __init__(
        self,
        run_config: dict[str, Any],
        num_nodes: int = 2,
        app: Callable[[Message, Context], Message] = client_app,
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
        self.app = app
        self.exchanges = 0
        self._pending: list[Message] = []  # the replies of the last push, until pulled

    def get_node_ids(self) -> list[int]:
        return list(self.contexts)

    def push_messages(self, messages: Iterable[Message]) -> list[str]:
        """Deliver a copy of each request to its node, run the ClientApp, keep the replies for the next pull;
        the requests' ids. Replies an earlier push left unpulled are dropped: nobody waits for them any more."""
        requests = list(messages)
        for i, msg in enumerate(requests):  # as Flower's grids do when they push a message: its id, set in place
            msg.metadata.__dict__["_message_id"] = f"{self.exchanges}.{i}"
        self._pending = self.replies(requests, [delivered(msg) for msg in requests])
        self.exchanges += 1
        return [msg.metadata.message_id for msg in requests]

    def replies(self, requests: list[Message], received: list[Message]) -> list[Message]:
        """Each node's reply to the copy of its request it received."""
        return [self.app(msg, self.contexts[msg.metadata.dst_node_id]) for msg in received]

    def pull_messages(self, message_ids: Iterable[str]) -> list[Message]:
        """The replies of the last push, each once."""
        due, self._pending = self._pending, []
        return due

    def send_and_receive(self, messages: Iterable[Message], timeout: float | None = None) -> list[Message]:
        """Push, then every reply at once (this federation answers within the push)."""
        self.push_messages(messages)
        return self.pull_messages([])
