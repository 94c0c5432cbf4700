"""The in-process federation as the tests drive it: replies tampered with, late or shuffled, on a virtual clock.

:class:`TestGrid` is :class:`experiments.running.inprocess_grid.InProcessGrid` (the real strategy and
ClientApp in one process) with what only tests need: ``tamper`` rewrites each exchange's replies (drop,
corrupt, add), ``deliver`` each request as its node receives it, ``shuffle_seed`` shuffles the replies
(as over a network), ``late`` holds a node's reply back for a number of pulls, and its waits pass at
once on its own :class:`VirtualTime` (``clock``, for :func:`strategies.waiting.send_and_receive`).
:class:`Recorder` keeps every exchange, and :func:`upload_of` / :func:`download_of` are the bytes a round's
replies and requests serialize to, counted here independently of the strategy's billing.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, Message, RecordDict

from bridge.messages import record_to_payload, wire_bytes
from experiments.running.inprocess_grid import InProcessGrid
from fedsketch import wire
from strategies.waiting import Clock

Tamper = Callable[[list[Message], list[Message]], list[Message]]
"""Given the requests and the honest replies, the replies the server receives."""


@dataclass
class VirtualTime:
    """The federation's time: a sleep passes at once, advances ``now`` and is recorded."""

    now_s: float = 0.0
    waits: list[float] = field(default_factory=list)

    def now(self) -> float:
        return self.now_s

    def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.now_s += seconds


class TestGrid(InProcessGrid):
    """An :class:`InProcessGrid` whose replies tests can tamper with, hold back or shuffle."""

    __test__ = False  # not a test class, though its name starts with Test

    def __init__(
        self,
        run_config: dict[str, Any],
        num_nodes: int = 2,
        tamper: Tamper | None = None,
        shuffle_seed: int | None = None,
        deliver: Callable[[Message], Message] | None = None,
        late: Mapping[int, int] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(run_config, num_nodes, **kwargs)
        self.tamper, self.deliver = tamper, deliver
        self.rng = random.Random(shuffle_seed) if shuffle_seed is not None else None
        self.late = dict(late or {})
        self.time = VirtualTime()
        self.clock = Clock(self.time.now, self.time.sleep)
        self.pulls = 0  # pull_messages calls, all exchanges together
        self._held: list[tuple[int, Message]] = []  # (the pull that hands it out, reply) of the last push
        self._pulled = 0  # pulls since the last push

    def replies(self, requests: list[Message], received: list[Message]) -> list[Message]:
        if self.deliver is not None:
            received = [self.deliver(msg) for msg in received]
        replies = super().replies(requests, received)
        if self.tamper is not None:
            replies = self.tamper(requests, replies)
        if self.rng is not None:
            self.rng.shuffle(replies)
        node_of = {msg.metadata.message_id: msg.metadata.dst_node_id for msg in requests}
        nodes = [node_of.get(r.metadata.reply_to_message_id, r.metadata.src_node_id) for r in replies]
        self._held = [(self.late.get(node, 1), reply) for node, reply in zip(nodes, replies, strict=True)]
        self._pulled = 0
        return replies

    def push_messages(self, messages: Iterable[Message]) -> list[str]:
        """As the in-process grid pushes, with the replies held only here (a reply handed out is not kept)."""
        ids = super().push_messages(messages)
        self._pending = []
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> list[Message]:
        """The replies of the last push that are due by this pull, each once."""
        self.pulls += 1
        self._pulled += 1
        self._pending = []  # InProcessGrid's own hold on the replies: this grid hands them out from _held
        due = [reply for at, reply in self._held if at <= self._pulled]
        self._held = [(at, reply) for at, reply in self._held if at > self._pulled]
        return due

    def send_and_receive(self, messages: Iterable[Message], timeout: float | None = None) -> list[Message]:
        """Push, then every reply at once, ``late`` or not."""
        self.push_messages(messages)
        replies = [reply for _, reply in self._held]
        self._held, self._pending = [], []
        return replies


SMALL_SKETCH_RUN = {
    "num-clients": 12,
    "clients-per-round": 4,
    "model-hidden": 16,
    "k": 40,
    "sketch-rows": 3,
    "sketch-cols": 400,
}
"""A small sketched run the round-level tests share: 4 of 12 clients a round, a 16-unit model, a 3 x 400 sketch, k = 40."""
ROUND_SETTINGS = {
    **SMALL_SKETCH_RUN,
    # two rounds, each client's batch all its examples
    "num-rounds": 2,
    "eval-every": 1,
    "lr": 0.3,
    "local-batch-size": 10_000,
}

Exchange = tuple[list[Message], list[RecordDict]]


class Recorder:
    """Grid tamper that keeps every exchange's requests and what its replies held, and changes nothing.

    The strategy takes each client's arrays out of a reply as it reads them: kept here are
    copies of the replies' record dicts, which share the records.
    """

    def __init__(self) -> None:
        self.exchanges: list[Exchange] = []

    def __call__(self, requests: list[Message], replies: list[Message]) -> list[Message]:
        self.exchanges.append((requests, [RecordDict(dict(m.content)) for m in replies]))
        return replies

    def rounds(self) -> dict[int, list[Exchange]]:
        """The exchanges of each round, in order."""
        out: dict[int, list[Exchange]] = {}
        for requests, replies in self.exchanges:
            rnd = int(requests[0].content.config_records[wire.CONFIG_KEY][wire.ROUND])  # type: ignore[arg-type]
            out.setdefault(rnd, []).append((requests, replies))
        return out


def sent(replies: list[RecordDict]) -> dict[int, tuple[dict[str, np.ndarray], int]]:
    """Per client id, in id order: the payload it uploaded and its number of examples."""
    out = {}
    for content in replies:
        for key, record in content.array_records.items():
            parsed = wire.parse_cid(key)
            if parsed is not None and parsed[0] == "update":
                metrics = content.metric_records[wire.metrics_key(parsed[1])]
                out[parsed[1]] = (record_to_payload(record), int(metrics[wire.NUM_EXAMPLES]))  # type: ignore[arg-type]
    return dict(sorted(out.items()))


def upload_of(replies: list[RecordDict]) -> int:
    """Each client's update and metrics records, as serialized."""
    total = 0
    for content in replies:
        for cid in (parsed[1] for parsed in map(wire.parse_cid, content.array_records) if parsed):
            total += wire_bytes(content.array_records[wire.update_key(cid)])
            total += wire_bytes(content.metric_records[wire.metrics_key(cid)])
    return total


def download_of(requests: list[Message]) -> int:
    """What each logical client is sent: its node's message as if addressed to it alone.

    A client's config lists its own id and (clients with state) its own settled round, each
    billed as one small integer (``[0]``), whatever its value.
    """
    total = 0
    for msg in requests:
        config: dict[str, Any] = dict(msg.content.config_records[wire.CONFIG_KEY])
        own = {wire.CIDS: [0], **({wire.SETTLED: [0]} if wire.SETTLED in config else {})}
        for cid in config[wire.CIDS]:
            total += wire_bytes(ConfigRecord({**config, **own}))
            for key, record in msg.content.items():
                shared = key != wire.CONFIG_KEY and not key.startswith("request.")  # request.<cid>: one client's own
                if shared or key == wire.request_key(cid):
                    total += wire_bytes(record)
    return total
