"""The message layout as Flower records, defined once for the ClientApp and the strategies.

The keys are :mod:`fedsketch.wire`'s (which knows no Flower). A request to a
node carries the model (or, in a second exchange, a query), the round's config
with the logical clients to run, and arrays for single clients; a reply carries
one update and metrics record (or one failure record) per logical client.

Bytes are counted here and only here (:func:`wire_bytes`): the length of
Flower's ``deflate()`` of a record and, recursively, of its children (arrays
and their chunks), which is what goes on the wire. Flower sends an object once
per id, so identical arrays in one record, or identical chunks of one array,
are sent and counted once (only arrays over Flower's 5 MB chunk size can have
identical chunks). An array's and a chunk's length are worked out from their
sizes, without the SHA-256 that naming them costs (docs/changelog.md).
"""

from __future__ import annotations

import copy
import io
import json
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.app.message import make_message  # Message with given metadata (its typed signatures do not take it)
from flwr.common.constant import FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE as MAX_CHUNK
from flwr.supercore.constant import HEAD_BODY_DIVIDER, HEAD_VALUE_DIVIDER

from fedsketch import wire

Payload = dict[str, np.ndarray]


def wire_bytes(obj: Any) -> int:
    """Serialized size of a record (or RecordDict) and everything it references."""
    if isinstance(obj, RecordDict):
        return sum(wire_bytes(rec) for rec in obj.values())
    if isinstance(obj, ArrayRecord):
        return _array_record_bytes(obj)
    children = obj.children or {}
    return len(obj.deflate()) + sum(wire_bytes(child) for child in children.values())


_ID_LEN = 64
"""An object id: the hex SHA-256 of the object's deflated bytes."""


def _object_bytes(kind: str, num_children: int, body: int) -> int:
    """``len(add_header_to_object_body(...))``: ``KIND ID,ID,... BODYLEN`` + divider + body."""
    ids = num_children * _ID_LEN + max(num_children - 1, 0)
    return len(kind) + len(HEAD_VALUE_DIVIDER) * 2 + ids + len(str(body)) + len(HEAD_BODY_DIVIDER) + body


def _distinct(items: list[Any], key: Any, same: Any) -> tuple[list[int], list[Any]]:
    """Each item's index among the distinct ones, and the distinct ones in first-seen order.

    ``same`` (a full comparison) runs only between items of equal ``key`` (their sizes).
    """
    firsts: list[Any] = []
    index: list[int] = []
    for item in items:
        match = next((i for i, f in enumerate(firsts) if key(f) == key(item) and same(f, item)), None)
        if match is None:
            firsts.append(item)
            match = len(firsts) - 1
        index.append(match)
    return index, firsts


@dataclass(frozen=True)
class _Blob:
    """An Array's metadata and serialized bytes, held as a header and a body that are never joined."""

    dtype: str
    shape: tuple[int, ...]
    stype: str
    head: bytes
    body: memoryview

    @property
    def size(self) -> tuple[str, tuple[int, ...], str, int]:
        return self.dtype, self.shape, self.stype, len(self.head) + len(self.body)

    def chunks(self) -> list[tuple[bytes, memoryview]]:
        """Each ``MAX_CHUNK`` of the bytes as (its part of the header, its part of the body)."""
        h, total = len(self.head), len(self.head) + len(self.body)
        return [
            (self.head[i : i + MAX_CHUNK], self.body[max(i - h, 0) : max(i + MAX_CHUNK - h, 0)])
            for i in range(0, total, MAX_CHUNK)
        ]


def _same_bytes(a: tuple[bytes, memoryview], b: tuple[bytes, memoryview]) -> bool:
    """Whether two chunks hold the same bytes (the same length is known); joined only where a header differs."""
    if len(a[0]) == len(b[0]):
        return a[0] == b[0] and a[1] == b[1]
    return bytes(a[0]) + bytes(a[1]) == bytes(b[0]) + bytes(b[1])


def _blob(array: Array) -> _Blob:
    return _Blob(array.dtype, tuple(array.shape), array.stype, b"", memoryview(array.data))


def _record_bytes(names: list[str], blobs: list[_Blob]) -> int:
    """``ArrayRecord.deflate()`` (names -> ids) plus each distinct Array once."""
    _, arrays = _distinct(blobs, lambda b: b.size, lambda a, b: a.head + a.body == b.head + b.body)
    body = len(json.dumps(dict.fromkeys(names, "0" * _ID_LEN)).encode())
    return _object_bytes("ArrayRecord", len(arrays), body) + sum(map(_array_bytes, arrays))


def _array_record_bytes(record: ArrayRecord) -> int:
    return _record_bytes(list(record.keys()), [_blob(a) for a in record.values()])


def _array_bytes(blob: _Blob) -> int:
    """``Array.deflate()`` (its metadata and chunk list) plus each distinct chunk once."""
    pieces = blob.chunks()
    index, chunks = _distinct(pieces, lambda c: len(c[0]) + len(c[1]), _same_bytes)
    meta = {"dtype": blob.dtype, "shape": list(blob.shape), "stype": blob.stype, "arraychunk_ids": index}
    body = len(json.dumps(meta).encode())
    sizes = (len(h) + len(b) for h, b in chunks)
    return _object_bytes("Array", len(chunks), body) + sum(_object_bytes("ArrayChunk", 0, n) for n in sizes)


def payload_bytes(payload: Mapping[str, np.ndarray]) -> int:
    """``wire_bytes(payload_to_record(payload))``, without copying the arrays into records: what a client
    whose upload a node merged would have sent (docs/simulation.md, "Merged uploads")."""
    blobs = []
    for arr in payload.values():
        arr = np.asarray(arr, order="C")
        head = _npy_header(arr)
        if head is None:  # Flower's own encoding: build it
            blobs.append(_blob(Array(arr)))
            continue
        body = memoryview(arr.reshape(-1).view(np.uint8))
        blobs.append(_Blob(str(arr.dtype), tuple(arr.shape), "numpy.ndarray", head, body))
    return _record_bytes(list(payload), blobs)


def _npy_header(arr: np.ndarray) -> bytes | None:
    """``np.save``'s format 1.0 header of ``arr``; ``None`` where it needs another format or holds objects."""
    if arr.dtype.hasobject:
        return None
    header = io.BytesIO()
    try:
        np.lib.format.write_array_header_1_0(header, np.lib.format.header_data_from_array_1_0(arr))
    except ValueError:  # the header needs format 2.0
        return None
    return header.getvalue()


def payload_to_record(payload: Mapping[str, np.ndarray]) -> ArrayRecord:
    """A payload of plain numpy arrays as an ArrayRecord (exact round trip)."""
    return ArrayRecord({name: npy_array(arr) for name, arr in payload.items()})


def npy_array(arr: np.ndarray) -> Array:
    """``Array(arr)``, the same bytes (``np.save``'s), with the array's data copied once.

    Flower's ``Array.from_numpy_ndarray`` saves into a growing ``BytesIO`` and
    takes its value: two or three copies of the data, each in fresh memory
    when the array is a client's new update (docs/simulation.md). Here the
    header is written on its own and joined to the data in one copy. An array
    whose header does not fit format 1.0 (or with Python objects) goes
    through Flower's own path.
    """
    arr = np.asarray(arr, order="C")  # a 0-d array stays 0-d (``np.ascontiguousarray`` makes it 1-d)
    header = _npy_header(arr)
    if header is None:  # objects (np.save's to refuse), or a header that needs format 2.0
        return Array(arr)
    data = b"".join((header, arr.reshape(-1).view(np.uint8).data))
    return Array(str(arr.dtype), tuple(arr.shape), "numpy.ndarray", data)


def copy_content(content: RecordDict) -> RecordDict:
    """A deep copy of a message's records (arrays keep their serialized bytes, as on the wire)."""
    out = RecordDict()
    for key, record in content.items():
        if isinstance(record, ArrayRecord):
            out[key] = ArrayRecord(
                {n: Array(a.dtype, tuple(a.shape), a.stype, bytes(a.data)) for n, a in record.items()}
            )
        elif isinstance(record, MetricRecord):
            out[key] = MetricRecord(copy.deepcopy(dict(record)))
        else:
            out[key] = ConfigRecord(copy.deepcopy(dict(record)))
    return out


def delivered(msg: Message) -> Message:
    """The message as its receiver gets it: a copy (a receiver that changes it must not change the sender's)."""
    return make_message(copy.deepcopy(msg.metadata), copy_content(msg.content))


def record_to_payload(record: ArrayRecord) -> Payload:
    """The inverse of :func:`payload_to_record`."""
    return {name: arr.numpy() for name, arr in record.items()}


def model_record(weights: np.ndarray) -> ArrayRecord:
    """The global model as sent to clients."""
    return ArrayRecord({wire.WEIGHTS: npy_array(np.ascontiguousarray(weights, dtype=np.float32))})


def model_crc(weights: np.ndarray) -> int:
    """CRC-32 of a model's float32 bytes: a device that caught up echoes it, the server checks it."""
    return zlib.crc32(np.ascontiguousarray(weights, dtype=np.float32).tobytes())


def config_bytes_per_client(config: Mapping[str, Any]) -> int:
    """What the round's config costs a message to one logical client alone (its own id in the list)."""
    return wire_bytes(ConfigRecord({**config, wire.CIDS: [0]}))


# ------------------------------------------------------------------------------------------- requests
def train_request(
    model: ArrayRecord,
    config: Mapping[str, Any],
    cids: list[int],
    extras: Mapping[int, ArrayRecord],
    key: str = wire.MODEL_KEY,
) -> RecordDict:
    """A training request: the model (or, under ``wire.CATCH_UP_KEY``, its catch-up), the round's config
    naming ``cids``, and arrays for single clients."""
    content = RecordDict({key: model, wire.CONFIG_KEY: ConfigRecord({**config, wire.CIDS: cids})})
    for cid, record in extras.items():
        content[wire.request_key(cid)] = record
    return content


def query_request(query: ArrayRecord, config: Mapping[str, Any], cids: list[int]) -> RecordDict:
    """A second exchange's request: one query shared by the node's clients."""
    return RecordDict({wire.QUERY_KEY: query, wire.CONFIG_KEY: ConfigRecord({**config, wire.CIDS: cids})})


@dataclass(frozen=True)
class Request:
    """What a node is asked to do, read from a request."""

    server_round: int
    cids: list[int]  # empty: the node is one client, its own partition (deployment)
    config: Mapping[str, object]
    phase: int = 1
    weights: np.ndarray | None = None  # phase 1: the global model
    query: Payload | None = None  # phase 2: the query
    extras: dict[int, Payload] = field(default_factory=dict)  # arrays for single clients
    catch_up: Payload | None = None  # phase 1, instead of the model: what changed since base_round
    base_round: int = 0


R = TypeVar("R", ArrayRecord, MetricRecord, ConfigRecord)


@dataclass(frozen=True)
class Records:
    """A :class:`RecordDict`'s records by kind, in plain dicts.

    Flower's typed views (``RecordDict.array_records``, ``metric_records``,
    ``config_records``) build a new dict of every record at each access, and
    each view holds its RecordDict and a bound method of itself: a reference
    cycle, so a message read through a view lives, arrays and all, until
    Python's cyclic collector next runs. Reading a reply per client through them
    was quadratic in the node's clients; reading it once through them let a
    round's replies outlive the round (the simulation process 1.5-1.8 GB
    instead of 1.0 GB on the peer job, docs/changelog.md). These dicts hold no cycle.
    """

    arrays: dict[str, ArrayRecord]
    metrics: dict[str, MetricRecord]
    configs: dict[str, ConfigRecord]


def records_of(content: RecordDict) -> Records:
    """Every record of ``content`` by kind, read in one pass."""
    found = Records({}, {}, {})
    for key, record in content.items():
        if isinstance(record, ArrayRecord):
            found.arrays[key] = record
        elif isinstance(record, MetricRecord):
            found.metrics[key] = record
        elif isinstance(record, ConfigRecord):
            found.configs[key] = record
    return found


def typed_record(content: RecordDict, key: str, kind: type[R]) -> R | None:
    """The record of type ``kind`` that ``content`` holds under ``key`` (``None`` if none): one lookup, no view
    (:class:`Records`)."""
    record = content.get(key)
    return record if isinstance(record, kind) else None


def read_request(content: RecordDict) -> Request:
    """The request's parts; the model or query is decoded only for the phase that carries it.

    Raises
    ------
    ValueError
        If the request has no config, a config value the request needs is missing or of the wrong type, or its
        phase's model or query is missing.
    """
    found = records_of(content)
    if wire.CONFIG_KEY not in found.configs:
        raise ValueError(f"request has no '{wire.CONFIG_KEY}' record")
    config = dict(found.configs[wire.CONFIG_KEY])
    server_round, cids = wire.config_int(config, wire.ROUND), wire.config_ints(config, wire.CIDS)
    phase = wire.config_int(config, wire.PHASE, 1)
    records = found.arrays
    extras = {cid: record_to_payload(records[key]) for key in records if (cid := wire.request_cid(key)) is not None}
    if phase == 2:
        if wire.QUERY_KEY not in records:
            raise ValueError(f"second-exchange request has no '{wire.QUERY_KEY}' record")
        query = record_to_payload(records[wire.QUERY_KEY])
        return Request(server_round, cids, config, phase, query=query, extras=extras)
    if wire.CATCH_UP_KEY in records:
        catch_up = record_to_payload(records[wire.CATCH_UP_KEY])
        base = wire.config_int(config, wire.BASE_ROUND, 0)
        return Request(server_round, cids, config, phase, extras=extras, catch_up=catch_up, base_round=base)
    if wire.MODEL_KEY not in records or wire.WEIGHTS not in records[wire.MODEL_KEY]:
        raise ValueError(f"request has no '{wire.MODEL_KEY}' record with array '{wire.WEIGHTS}'")
    weights = records[wire.MODEL_KEY][wire.WEIGHTS].numpy()
    return Request(server_round, cids, config, phase, weights=weights, extras=extras)


# -------------------------------------------------------------------------------------------- replies
def client_metrics(
    num_examples: int, loss: float, compute_s: float, echo: Mapping[str, int] | None = None
) -> MetricRecord:
    """One logical client's metrics record; ``echo`` repeats the round's method settings (its round config)."""
    values = {wire.NUM_EXAMPLES: int(num_examples), wire.LOSS: float(loss), wire.COMPUTE_S: float(compute_s)}
    return MetricRecord({**values, **(echo or {})})


def failure_record(reason: str) -> ConfigRecord:
    """One logical client's failure record."""
    return ConfigRecord({wire.REASON: reason[:1000]})


def add_update(
    content: RecordDict, cid: int, payload: Payload, metrics: MetricRecord, diagnostic: Payload | None = None
) -> None:
    """One logical client's reply entries: its payload, metrics and (``diagnose-sketch``) diagnostic arrays."""
    content[wire.update_key(cid)] = payload_to_record(payload)
    content[wire.metrics_key(cid)] = metrics
    if diagnostic is not None:  # a separate record, never counted as upload
        content[wire.diagnostic_key(cid)] = payload_to_record(diagnostic)


def add_failure(content: RecordDict, cid: int, reason: str | None) -> None:
    """One logical client's failure entry instead of an update (a reason it did not give: "unknown error")."""
    content[wire.failure_key(cid)] = failure_record(reason or "unknown error")


def add_rejection(content: RecordDict, cid: int, reason: str, billed: int, kind: str = "rejected") -> None:
    """In a merged reply: why the node refused logical client ``cid``'s upload (``kind``: ``rejected`` by the
    checks, ``bounded`` by the norm bound), and what it sent."""
    record = {wire.REASON: reason[:1000], wire.UPLOAD_BYTES: billed, wire.KIND: kind}
    content[wire.rejected_key(cid)] = ConfigRecord(record)
