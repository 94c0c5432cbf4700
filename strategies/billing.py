"""What each logical client is charged for what it receives.

Every byte is a serialized record's (:func:`bridge.messages.wire_bytes`). In
simulation a Flower node carries a cohort of logical clients in one message;
each client is charged what a message to it alone would carry: the model (or,
with ``download = "sparse"``, the smaller of the model and its catch-up payload,
:mod:`fedsketch.server.download`, from the initial model for a new client with
``download-from-init``), the round's config with its own id, and any arrays
sent to it alone. With one client per node (deployment) every message is one
client's, and it is charged the message itself: a device that kept its model
is sent, and charged, only its catch-up. A second exchange (Sketched-SGD's
query, PowerSGD's P) is charged the same way. Each function returns what it
charged (:data:`fedsketch.server.books.Counts`); the round adds it to the books.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, Message, MessageType, RecordDict

from bridge import messages
from fedsketch import wire
from fedsketch.compress import sparse
from fedsketch.compress.bits import packed_size
from fedsketch.config import RunConfig
from fedsketch.methods import ClientUpdate, Payload
from fedsketch.server import download
from fedsketch.server.books import Books, Counts
from strategies.plan import RoundPlan


def count_download(
    books: Books, cfg: RunConfig, plan: RoundPlan, model: ArrayRecord, weights: torch.Tensor, stateful: bool
) -> Counts:
    """What each sampled client is charged: the model (or its catch-up) and the round's config (with its settled
    round)."""
    config_bytes = messages.config_bytes_per_client({**plan.config, wire.SETTLED: [0]} if stateful else plan.config)
    dense = messages.wire_bytes(model)
    cids = [cid for cids in plan.sent.values() for cid in cids]
    if cfg.download != "sparse" or not cids:
        return Counter({"download": (dense + config_bytes) * plan.sampled()})
    charged: Counter[str] = Counter()
    counts, on_cpu = download.changed_since(books.ledger), weights.detach().cpu()
    by_base: dict[int | None, int | None] = {}  # clients that hold the same round's model get the same catch-up
    for cid in cids:
        base = download.base_round(books.ledger, cid, cfg.download_from_init)
        if base not in by_base:
            by_base[base] = catch_up_bytes(books.ledger, cid, plan.server_round, on_cpu, cfg.download_from_init, counts)
        sparse = by_base[base]
        sparse = dense + 1 if sparse is None else sparse
        charged["download"] += min(dense, sparse) + config_bytes
        charged["sparse_downloads"] += int(sparse < dense)
    return charged


def catch_up_bytes(
    ledger: download.DownloadLedger,
    cid: int,
    server_round: int,
    weights: torch.Tensor,
    from_init: bool,
    counts: np.ndarray,
) -> int | None:
    """The serialized size of :func:`download.catch_up`'s payload for ``cid`` (None: it needs the dense model),
    building only the parts whose content can change that size.

    Flower cuts an array's bytes into chunks of ``MAX_CHUNK`` and sends equal chunks
    once (:func:`messages.wire_bytes`), so a size depends on content only through
    equal chunks within one array. Sorted distinct indices never repeat a chunk, and
    an array of one chunk has none to repeat: those parts are stood in for by arrays
    of the same dtype and shape. The values, when they span several chunks, are the
    real ones; so is the whole payload where a mask spans several chunks or is one byte
    (where it could equal ``enc``). ``counts``: :func:`download.changed_since`.
    """
    n = download.catch_up_count(ledger, cid, from_init, counts)
    if n is None:
        return None
    d = ledger.changed_at.numel()
    enc = sparse.pick_encoding(n, d)
    if enc == sparse.ENC_INDICES:
        positions = {"idx": messages.npy_array(np.arange(n, dtype=np.int32))}
    else:
        positions = {"mask": messages.npy_array(np.zeros(packed_size(d, 1), dtype=np.uint8))}
    if "mask" in positions and (len(positions["mask"].data) > messages.MAX_CHUNK or packed_size(d, 1) <= 1):
        payload = download.catch_up(ledger, cid, server_round, weights, from_init)
        return messages.wire_bytes(messages.payload_to_record(payload or {}))
    values = messages.npy_array(np.zeros(n, dtype=np.float32))
    if len(values.data) > messages.MAX_CHUNK:
        values = messages.npy_array(download.catch_up_values(ledger, cid, weights, from_init))
    enc_array = messages.npy_array(np.array([enc], dtype=np.uint8))
    return messages.wire_bytes(ArrayRecord({"enc": enc_array, **positions, "val": values}))


def requests(records: Mapping[int, ArrayRecord]) -> Counts:
    """What the clients are charged for the arrays sent to each alone."""
    return Counter({"download": sum(messages.wire_bytes(record) for record in records.values())})


def node_request(
    books: Books,
    cfg: RunConfig,
    plan: RoundPlan,
    node: int,
    model: ArrayRecord,
    weights: torch.Tensor,
    config: dict[str, Any],
    extras: Mapping[int, ArrayRecord],
) -> tuple[RecordDict, Counts]:
    """One client per node: its message, the model or (a device that kept it) the smaller catch-up; what it is
    charged, the message as sent."""
    cid = books.node_cid.get(node)
    since = download.base_round(books.ledger, cid, cfg.download_from_init) if cfg.download == "sparse" else None
    content = messages.train_request(model, config, [], extras)
    sparse_downloads = 0
    if since is not None:
        payload = download.catch_up(books.ledger, cid, plan.server_round, weights, cfg.download_from_init)
        caught_up = messages.train_request(
            messages.payload_to_record(payload or {}),
            {**config, wire.BASE_ROUND: since},
            [],
            extras,
            key=wire.CATCH_UP_KEY,
        )
        if messages.wire_bytes(caught_up) < messages.wire_bytes(content):
            content, sparse_downloads = caught_up, 1
    return content, Counter({"download": messages.wire_bytes(content), "sparse_downloads": sparse_downloads})


def round_requests(
    books: Books,
    cfg: RunConfig,
    plan: RoundPlan,
    model: ArrayRecord,
    weights: torch.Tensor,
    targets: Mapping[int, list[int]],
    extras: Mapping[int, ArrayRecord],
    stateful: bool,
) -> tuple[dict[int, RecordDict], Counts]:
    """One message per node, and what every client is charged; ``targets``: each node's clients
    (:meth:`RoundPlan.targets`), ``extras``: arrays per client; ``stateful``: each config names
    every client's settled round (:meth:`RoundPlan.node_config`).

    One client per node: each message is billed as sent (:func:`node_request`).
    A cohort per message: each client what a message to it alone would carry.
    Either way ``download_sent`` counts what the messages serialize.
    """
    for_node = {node: {c: extras[c] for c in cids if c in extras} for node, cids in targets.items()}
    configs = {node: plan.node_config(cids, books.applied if stateful else None) for node, cids in targets.items()}
    charged: Counter[str] = Counter()
    contents: dict[int, RecordDict] = {}
    if cfg.client_assignment == "node":
        for node in plan.sent:
            contents[node], counts = node_request(books, cfg, plan, node, model, weights, configs[node], for_node[node])
            charged.update(counts)
    else:
        charged.update(count_download(books, cfg, plan, model, weights, stateful))
        charged.update(requests(extras))
        contents = {
            node: messages.train_request(model, configs[node], cids, for_node[node]) for node, cids in plan.sent.items()
        }
    charged["download_sent"] = sum(messages.wire_bytes(c) for c in contents.values())
    return contents, charged


def second_exchange(
    cfg: RunConfig, plan: RoundPlan, updates: list[ClientUpdate], query: Payload
) -> tuple[dict[int, list[int]], list[Message], Counts]:
    """The requests of a second exchange to the clients of ``updates``, and what they are charged: each client its
    query and config."""
    wanted = {u.cid for u in updates}
    if cfg.client_assignment == "cohort":
        sent = {node: [c for c in cids if c in wanted] for node, cids in plan.sent.items()}
        sent = {node: cids for node, cids in sent.items() if cids}
    else:  # one client per node: it names itself
        sent = {u.node: [] for u in updates}
    record = messages.payload_to_record(query)
    config: dict[str, Any] = {wire.ROUND: plan.server_round, wire.PHASE: 2}
    billed = (messages.wire_bytes(record) + messages.config_bytes_per_client(config)) * len(wanted)
    requests = [
        Message(content=messages.query_request(record, config, cids), message_type=MessageType.TRAIN, dst_node_id=node)
        for node, cids in sent.items()
    ]
    sent_bytes = sum(messages.wire_bytes(m.content) for m in requests)
    return sent, requests, Counter({"download": billed, "download_sent": sent_bytes})
