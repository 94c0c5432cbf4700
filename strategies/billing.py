"""What each logical client is sent and charged: the model or its catch-up, configs, a second exchange's query.

Every byte is a serialized record's (:func:`bridge.messages.wire_bytes`). In
simulation a Flower node carries a cohort of logical clients in one message;
each client is charged what a message to it alone would carry: the model (or,
with ``download = "sparse"``, the smaller of the model and its catch-up
payload), the round's config with its own id, and any arrays sent to it alone.
With one client per node (deployment) every message is one client's, and it is
charged the message itself: a device that kept its model is sent, and charged,
only its catch-up. A second exchange (Sketched-SGD's query, PowerSGD's P) is
charged the same way. Each function returns what it charged
(:data:`fedsketch.server.books.Counts`); the round adds it to the books.

The catch-up: FetchSGD's server applies a k-sparse update each round (Rothchild
et al., ICML 2020, Sec. 4), so a client that kept the model it last received
needs only the coordinates changed since then; the paper's download figures
count exactly that (Sec. 6). The same holds for every method here: a client is
sent the changed coordinates' *new values* (overwriting, so the result is
bit-exact; the client's side: :func:`clients.kept_model.apply_catch_up`) in the
smallest sparse encoding of :mod:`fedsketch.compress.sparse`, or the dense model
when that is smaller or the client has never taken part. With
``download-from-init`` a client that has never taken part rebuilds the initial
model from the run's seed, so it counts as synced to round 1 and is sent only the
coordinates changed since: where clients rarely return, this is most of what a
sparse update saves on the download. What each client has seen is the ledger of
:mod:`fedsketch.server.ledger`.
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
from fedsketch.compress.sparse import encode_sparse
from fedsketch.config import RunConfig
from fedsketch.methods import ClientUpdate, Payload
from fedsketch.server.books import Books, Counts
from fedsketch.server.ledger import FORGOTTEN, INITIAL, DownloadLedger
from strategies.plan import RoundPlan


def base_round(ledger: DownloadLedger, cid: int | None, from_init: bool) -> int | None:
    """The round whose model client ``cid`` holds; ``None`` if it holds none (it needs the dense model).

    A client never synced holds the initial model when ``from_init`` (it rebuilds
    it from the seed). A client that failed holds nothing to rely on (:func:`fedsketch.server.ledger.forget`).
    """
    since = ledger.synced.get(cid) if cid is not None else None
    if since is None:
        return INITIAL if from_init else None
    return None if since == FORGOTTEN else since


def catch_up(
    ledger: DownloadLedger, cid: int | None, server_round: int, weights: torch.Tensor, from_init: bool = False
) -> Payload | None:
    """The sparse payload that brings client ``cid`` to the weights sent in ``server_round``.

    ``None`` when the client holds no model (:func:`base_round`): it needs the
    dense one. Coordinates changed in rounds ``base_round`` to
    ``server_round - 1`` are sent with their current values.
    """
    since = base_round(ledger, cid, from_init)
    if since is None:
        return None
    idx = torch.nonzero(ledger.changed_at >= since).flatten()
    values = weights.detach().cpu().to(torch.float32)[idx]
    return encode_sparse(idx.numpy(), values.numpy(), ledger.changed_at.numel())


def changed_since(ledger: DownloadLedger) -> np.ndarray:
    """``counts[s]``: how many coordinates changed in round ``s`` or later, for every ``s`` up to the latest round + 1.

    One pass over the ledger answers every client's catch-up size (:func:`catch_up_count`).
    """
    per_round = np.bincount(ledger.changed_at.numpy())
    return np.append(per_round[::-1].cumsum()[::-1], 0)


def catch_up_count(ledger: DownloadLedger, cid: int | None, from_init: bool, counts: np.ndarray) -> int | None:
    """How many coordinates :func:`catch_up` would send client ``cid`` (``counts``: :func:`changed_since`)."""
    since = base_round(ledger, cid, from_init)
    if since is None:
        return None
    return int(counts[min(since, len(counts) - 1)])


def catch_up_values(ledger: DownloadLedger, cid: int | None, weights: torch.Tensor, from_init: bool) -> np.ndarray:
    """The values :func:`catch_up` would send client ``cid`` (which must hold a model), in increasing index order."""
    since = base_round(ledger, cid, from_init)
    if since is None:
        raise ValueError(f"client {cid} holds no model: it is sent the dense one")
    values = weights.detach().cpu().to(torch.float32)[ledger.changed_at >= since]
    return values.numpy()


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
    counts, on_cpu = changed_since(books.ledger), weights.detach().cpu()
    by_base: dict[int | None, int | None] = {}  # clients that hold the same round's model get the same catch-up
    for cid in cids:
        base = base_round(books.ledger, cid, cfg.download_from_init)
        if base not in by_base:
            by_base[base] = catch_up_bytes(books.ledger, cid, plan.server_round, on_cpu, cfg.download_from_init, counts)
        sparse = by_base[base]
        sparse = dense + 1 if sparse is None else sparse
        charged["download"] += min(dense, sparse) + config_bytes
        charged["sparse_downloads"] += int(sparse < dense)
    return charged


def catch_up_bytes(
    ledger: DownloadLedger,
    cid: int,
    server_round: int,
    weights: torch.Tensor,
    from_init: bool,
    counts: np.ndarray,
) -> int | None:
    """The serialized size of :func:`catch_up`'s payload for ``cid`` (None: it needs the dense model),
    building only the parts whose content can change that size.

    Flower cuts an array's bytes into chunks of ``MAX_CHUNK`` and sends equal chunks
    once (:func:`messages.wire_bytes`), so a size depends on content only through
    equal chunks within one array. Sorted distinct indices never repeat a chunk, and
    an array of one chunk has none to repeat: those parts are stood in for by arrays
    of the same dtype and shape. The values, when they span several chunks, are the
    real ones; so is the whole payload where a mask spans several chunks or is one byte
    (where it could equal ``enc``). ``counts``: :func:`changed_since`.
    """
    n = catch_up_count(ledger, cid, from_init, counts)
    if n is None:
        return None
    d = ledger.changed_at.numel()
    enc = sparse.pick_encoding(n, d)
    if enc == sparse.ENC_INDICES:
        positions = {"idx": messages.npy_array(np.arange(n, dtype=np.int32))}
    else:
        positions = {"mask": messages.npy_array(np.zeros(packed_size(d, 1), dtype=np.uint8))}
    if "mask" in positions and (len(positions["mask"].data) > messages.MAX_CHUNK or packed_size(d, 1) <= 1):
        payload = catch_up(ledger, cid, server_round, weights, from_init)
        return messages.wire_bytes(messages.payload_to_record(payload or {}))
    values = messages.npy_array(np.zeros(n, dtype=np.float32))
    if len(values.data) > messages.MAX_CHUNK:
        values = messages.npy_array(catch_up_values(ledger, cid, weights, from_init))
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
    since = base_round(books.ledger, cid, cfg.download_from_init) if cfg.download == "sparse" else None
    content = messages.train_request(model, config, [], extras)
    sparse_downloads = 0
    if since is not None:
        payload = catch_up(books.ledger, cid, plan.server_round, weights, cfg.download_from_init)
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
