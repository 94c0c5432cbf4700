"""Turn reply messages into validated per-client updates, counting their bytes.

A malformed reply is rejected with a logged reason and the round goes on
without it: a bad client can cost its own contribution, never the round. What
is checked, in order: the reply answers a request that was sent, once; each
asked client has an update and metrics (or a failure record); ``num-examples``
is an int in ``1..max_examples``; the round's echoed settings match (the
sketch's seed and shape); the payload's size and array count are bounded
before decoding, every array is a well-formed native numeric ``.npy`` whose
header agrees with its declared dtype and shape (:mod:`strategies.limits`);
floats are finite and below ``MAX_ABS``; and the arrays match the method's layout exactly (or its
decoder accepts them). Where the run asks for diagnostic arrays (``diagnose-sketch``), they are
checked the same way against their own layout, and a client without valid ones is rejected too;
their bytes are counted apart (``diagnostic_bytes``), never as upload.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from logging import WARNING, getLogger

import numpy as np
from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid

from bridge.messages import Records, records_of, wire_bytes
from fedsketch import wire
from fedsketch.client.uploads import check_layout, check_values
from fedsketch.methods import ClientUpdate, PayloadCheck, PayloadSpec
from strategies import waiting
from strategies.limits import ReplyLimits, checked_payload, decode_all, spec_bytes

log = getLogger("flwr").log  # Flower's own logger: the lines go where Flower's go (flower.log)

COUNTED_AS = {
    "timeouts": "timed out",
    "errors": "counted as a client error",
    "rejected": "rejected",
    "bounded": "set aside by the norm bound",
}
"""How ``flower.log`` names each kind of failure: as the round's counts do (``timeouts``, ``client_errors``,
``rejected``, ``bounded``)."""


@dataclass
class RoundReplies:
    """Everything a round's replies delivered.

    Each logical client that was asked and did not contribute counts once, in
    one of three kinds: ``timeouts`` (its node did not answer in time),
    ``errors`` (its node or its own code raised) and ``rejected`` (it answered
    with an invalid reply). ``failures`` gives the reason per client id where
    the id is known (a silent node in one-client-per-node mode has none).
    """

    updates: list[ClientUpdate] = field(default_factory=list)
    merged: list[ClientUpdate] = field(default_factory=list)  # nodes' merged uploads (``merge-uploads``)
    members: list[ClientUpdate] = field(default_factory=list)  # their clients, each counted (no payload)
    clipped: int = 0  # uploads the nodes that merged them scaled down to ``clip-norm``
    failures: dict[int, str] = field(default_factory=dict)
    kinds: dict[int, str] = field(default_factory=dict)  # the kind each client of ``failures`` counts as
    upload_bytes: int = 0
    diagnostic_bytes: int = 0  # not communication: what clients handed over for diagnostics only
    timeouts: int = 0
    errors: int = 0
    rejected: int = 0
    bounded: int = 0  # uploads set aside for a norm beyond norm-bound x the round's median (strategies/guard.py)

    def contributors(self) -> list[ClientUpdate]:
        """Every client whose upload counts this round, by client id: unmerged ones and merged ones' members."""
        return sorted([*self.updates, *self.members], key=lambda u: u.cid)

    @property
    def failed(self) -> int:
        """Clients that were asked and did not contribute."""
        return self.timeouts + self.errors + self.rejected + self.bounded

    def fail(self, cid: int | None, kind: str, reason: str) -> None:
        """Record one client's failure of ``kind`` (``timeouts``, ``errors``, ``rejected`` or ``bounded``)."""
        setattr(self, kind, getattr(self, kind) + 1)
        if cid is not None:
            self.failures[cid], self.kinds[cid] = reason[:300], kind


def exchange(grid: Grid, requests: list[Message], timeout: float) -> tuple[list[Message], dict[str, int]]:
    """Send ``requests`` and wait for the replies; also which node each request went to, by its message id.

    The grid gives every request its message id as it pushes it; the replies are pulled on
    :mod:`strategies.waiting`'s schedule, not Flower's 3 s sleep.
    """
    replies = waiting.send_and_receive(grid, requests, timeout)
    return replies, {m.metadata.message_id: m.metadata.dst_node_id for m in requests if m.metadata.message_id}


def replying_node(msg: Message, requested: Mapping[str, int]) -> int:
    """The node a reply stands for: the one its request went to, found by the id of the message it replies to.

    An error the SuperLink writes itself, for a node that left or a reply that
    expired, names the SuperLink as its source (node id 1 in Flower 1.41), not
    the node; only its ``reply_to_message_id`` tells which request it answers.
    A node's own reply has the node as its source (the SuperLink checks it).
    """
    return requested.get(msg.metadata.reply_to_message_id, msg.metadata.src_node_id)


def collect(
    replies: Iterable[Message],
    sent: dict[int, list[int]],
    spec: PayloadSpec | PayloadCheck,
    limits: ReplyLimits,
    diagnostic: PayloadSpec | None = None,
    requested: Mapping[str, int] | None = None,
) -> RoundReplies:
    """Parse and validate replies; ``sent`` maps node id -> the cids it was asked for.

    ``spec`` is either the exact layout or a function that decodes a payload
    (its result is kept as ``ClientUpdate.decoded``) and raises for a bad one.
    ``diagnostic``, if given, is the exact layout of the diagnostic arrays every
    client must add (kept as ``ClientUpdate.diagnostic``). ``requested`` maps
    each request's message id to its node (:func:`exchange`); without it a
    reply stands for its source node.
    Nothing a reply holds can raise out of here. Updates come back sorted by
    client id, whatever order the replies arrived in, so that sums over them
    are the same in every run.
    """
    out = RoundReplies()
    answered: set[int] = set()
    for msg in replies:
        node = replying_node(msg, requested or {})
        if node not in sent or node in answered:
            log(WARNING, "reply from node %d ignored: %s", node, "not asked" if node not in sent else "a second reply")
            continue
        answered.add(node)
        asked = sent[node]
        if msg.has_error():
            reason = f"node {node} error: {msg.error.reason}"
            log(WARNING, "%s", reason[:300])
            for cid in _each_client(asked):
                out.fail(cid, "errors", reason)
            continue
        found = records_of(msg.content)  # once per reply: a node's reply carries its whole cohort
        if not asked:  # one-client-per-node mode: the node names its own client
            asked = _cids_in(found)
            bad = len(asked) != 1 or (limits.num_clients is not None and not 0 <= asked[0] < limits.num_clients)
            if bad or asked[0] in {u.cid for u in out.updates}:
                out.fail(None, "rejected", f"node {node} named clients {asked[:5]}; expected one new valid id")
                log(WARNING, "node %d rejected: named clients %s", node, asked[:5])
                continue
        _collect_content(found, node, asked, spec, limits, out, diagnostic, msg.content)
        _release_arrays(msg.content, found)
    for node, cids in sent.items():
        if node not in answered:
            for cid in _each_client(cids):
                out.fail(cid, "timeouts", f"node {node} did not reply in time")
    for cid, reason in out.failures.items():
        log(WARNING, "client %d %s: %s", cid, COUNTED_AS[out.kinds[cid]], reason)
    out.updates.sort(key=lambda u: u.cid)
    out.merged.sort(key=lambda u: u.cid)
    return out


def _take(content: RecordDict, found: Records, key: str) -> ArrayRecord | None:
    """A client's arrays, taken out of its reply: what was accepted is decoded into views of their bytes,
    which then live as long as the update, not as long as the reply, which the round's caller keeps until
    the round ends (a dense round holds every client's bytes: docs/simulation.md, "Memory")."""
    content.pop(key, None)
    return found.arrays.pop(key, None)


def _release_arrays(content: RecordDict, found: Records) -> None:
    """Drop whatever arrays a read reply still holds (records of clients it was not asked for)."""
    for key in found.arrays:
        content.pop(key, None)
    found.arrays.clear()


def _each_client(cids: list[int]) -> list[int | None]:
    """The clients a node was asked for; one unnamed (``None``) for a node that is one client, not named yet."""
    return [*cids] or [None]


def _cids_in(found: Records) -> list[int]:
    keys = [*found.arrays, *found.metrics, *found.configs]
    return sorted({parsed[1] for parsed in map(wire.parse_cid, keys) if parsed is not None})


def _collect_content(
    found: Records,
    node: int,
    asked: list[int],
    spec: PayloadSpec | PayloadCheck,
    limits: ReplyLimits,
    out: RoundReplies,
    diagnostic_spec: PayloadSpec | None,
    content: RecordDict,
) -> None:
    configs, metric_records = found.configs, found.metrics
    merged = wire.MERGED_METRICS in metric_records or wire.MERGED_KEY in found.arrays
    if merged or any(wire.rejected_key(cid) in configs for cid in asked):  # a node that refused every upload
        _collect_merged(found, node, asked, spec, limits, out, content)
        return
    for cid in asked:
        if wire.failure_key(cid) in configs:
            reason = str(configs[wire.failure_key(cid)].get(wire.REASON, "unknown"))
            out.fail(cid, "errors", reason)
            continue
        arrays = _take(content, found, wire.update_key(cid))
        metrics = metric_records.get(wire.metrics_key(cid))
        if arrays is None or metrics is None:
            out.fail(cid, "rejected", "reply has no update or metrics for this client")
            continue
        nbytes = wire_bytes(arrays) + wire_bytes(metrics)
        out.upload_bytes += nbytes
        extra = _take(content, found, wire.diagnostic_key(cid)) if diagnostic_spec is not None else None
        out.diagnostic_bytes += wire_bytes(extra) if extra is not None else 0
        try:
            num_examples, loss = _validated_metrics(metrics, limits)
            payload, decoded = _validated_payload(arrays, spec, limits)
            diagnostic = _validated_diagnostic(extra, diagnostic_spec, limits)
        except ValueError as exc:
            out.fail(cid, "rejected", str(exc))
            continue
        out.updates.append(ClientUpdate(cid, payload, num_examples, loss, nbytes, node, decoded, diagnostic))


def _collect_merged(
    found: Records,
    node: int,
    asked: list[int],
    spec: PayloadSpec | PayloadCheck,
    limits: ReplyLimits,
    out: RoundReplies,
    content: RecordDict,
) -> None:
    """A node's merged reply (:mod:`clients.merged`): each asked client billed its own upload's bytes and judged
    by its metrics; the mean is accepted if it has the layout and the accepted clients' total examples."""
    members = []
    for cid in asked:
        if wire.failure_key(cid) in found.configs:
            out.fail(cid, "errors", str(found.configs[wire.failure_key(cid)].get(wire.REASON, "unknown")))
            continue
        refused = found.configs.get(wire.rejected_key(cid))
        if refused is not None and limits.merged:  # the node's checks refused the upload it sent
            out.upload_bytes += _billed(refused.get(wire.UPLOAD_BYTES), 4 * limits.max_bytes) or 0
            kind = "bounded" if refused.get(wire.KIND) == "bounded" else "rejected"
            out.fail(cid, kind, str(refused.get(wire.REASON, "unknown")))
            continue
        metrics = found.metrics.get(wire.metrics_key(cid))
        if metrics is None or not limits.merged:
            out.fail(
                cid, "rejected", "reply has no metrics for this client" if limits.merged else "merged reply refused"
            )
            continue
        own = MetricRecord({k: v for k, v in metrics.items() if k != wire.UPLOAD_BYTES})
        billed = _billed(metrics.get(wire.UPLOAD_BYTES), 2 * limits.max_bytes)
        try:
            if billed is None:
                raise ValueError(f"upload-bytes {str(metrics.get(wire.UPLOAD_BYTES))[:40]} is not a size it can be")
            nbytes = billed + wire_bytes(own)
            out.upload_bytes += nbytes
            num_examples, loss = _validated_metrics(own, limits)
        except ValueError as exc:
            out.fail(cid, "rejected", str(exc))
            continue
        members.append(ClientUpdate(cid, {}, num_examples, loss, nbytes, node))
    arrays, totals = _take(content, found, wire.MERGED_KEY), found.metrics.get(wire.MERGED_METRICS)
    if not members:
        return
    try:
        payload, clipped = _validated_merge(
            arrays, totals, len(members), sum(m.num_examples for m in members), spec, limits
        )
    except ValueError as exc:
        for m in members:
            out.fail(m.cid, "rejected", f"merged upload: {exc}")
        return
    losses = [m.loss for m in members if m.loss == m.loss]
    loss = sum(losses) / len(losses) if losses else float("nan")
    out.members += members
    out.merged.append(ClientUpdate(members[0].cid, payload, sum(m.num_examples for m in members), loss, 0, node))
    out.clipped += clipped


def _billed(value: object, most: int) -> int | None:
    """A merged reply's ``upload-bytes``: an int in ``1..most``, else ``None``."""
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= most else None


def _validated_merge(
    arrays: ArrayRecord | None,
    totals: MetricRecord | None,
    uploads: int,
    examples: int,
    spec: PayloadSpec | PayloadCheck,
    limits: ReplyLimits,
) -> tuple[dict[str, np.ndarray], int]:
    """A merged mean: present, of the method's exact layout, and of exactly the accepted clients' examples; with
    how many of its ``uploads`` the node clipped (a count from 0 to ``uploads``)."""
    if arrays is None or totals is None or callable(spec):
        raise ValueError("no merged arrays and totals of a fixed layout")
    total, clipped = totals.get(wire.NUM_EXAMPLES), totals.get(wire.CLIPPED, 0)
    if total != examples:
        raise ValueError(f"num-examples {str(total)[:40]} != the accepted clients' {examples}")
    if not isinstance(clipped, int) or not 0 <= clipped <= uploads:
        raise ValueError(f"clipped {str(clipped)[:40]} is not a count of its {uploads} uploads")
    payload, _ = _validated_payload(arrays, spec, limits)
    return payload, clipped


def _validated_diagnostic(
    record: ArrayRecord | None, spec: PayloadSpec | None, limits: ReplyLimits
) -> dict[str, np.ndarray] | None:
    """The diagnostic arrays, checked like a payload against their exact layout; ``None`` if none are asked for."""
    if spec is None:
        return None
    if record is None:
        raise ValueError("reply has no diagnostic arrays for this client (diagnose-sketch)")
    bounds = dataclasses.replace(limits, max_bytes=spec_bytes(list(spec.values())), max_arrays=len(spec))
    try:
        payload, _ = _validated_payload(record, spec, bounds)
    except ValueError as exc:
        raise ValueError(f"diagnostic: {exc}") from None
    return payload


def _validated_payload(
    arrays: ArrayRecord, spec: PayloadSpec | PayloadCheck, limits: ReplyLimits
) -> tuple[dict[str, np.ndarray], object]:
    payload = checked_payload(arrays, limits.max_bytes, limits.max_arrays)
    for name, arr in payload.items():
        check_values(name, arr, limits.max_abs)
    if callable(spec):
        try:
            return payload, decode_all(spec, payload)
        except Exception as exc:  # noqa: BLE001 -- a decoder fed hostile arrays may fail in many ways: reject
            raise ValueError(f"payload does not decode: {type(exc).__name__}: {str(exc)[:200]}") from None
    check_layout(payload, spec)
    return payload, None


def _validated_metrics(metrics: MetricRecord, limits: ReplyLimits) -> tuple[int, float]:
    num = metrics.get(wire.NUM_EXAMPLES)
    loss = metrics.get(wire.LOSS, float("nan"))
    if not isinstance(num, int) or isinstance(num, bool) or not 0 < num <= limits.max_examples:
        raise ValueError(f"num-examples {str(num)[:40]} is not an int in 1..{limits.max_examples}")
    if not isinstance(loss, (int, float)) or isinstance(loss, bool):
        raise ValueError(f"loss {str(loss)[:40]} is not a number")  # noqa: TRY004
    for key, want in limits.echo.items():
        got = metrics.get(key)
        if type(got) is not type(want) or got != want:
            raise ValueError(f"'{key}' is {str(got)[:40]}; this round's is {want!r}")
    return num, float(loss) if math.isfinite(loss) else float("nan")
