"""Download compression: send a returning client only the coordinates that changed since it last synced.

FetchSGD's server applies a k-sparse update each round (Rothchild et al., ICML
2020, Sec. 4), so a client that kept the model it last received needs only
the coordinates changed since then to catch up; the paper's download figures
count exactly that (Sec. 6). The same holds for every method here: whatever
the update's density, a client is sent the changed coordinates' *new values*
(overwriting, so the result is bit-exact) in the smallest sparse encoding of
:mod:`fedsketch.compress.sparse`, or the dense model when that is smaller or
the client has never taken part. With ``download-from-init`` a client that
has never taken part rebuilds the initial model from the run's seed (every
client builds the same model to train it), so it counts as synced to round 1
and is sent only the coordinates changed since: where clients rarely return,
this is most of what a sparse update saves on the download.

The server keeps one ``int32`` per coordinate (the last round that changed
it, ``4 d`` bytes) and one round number per client that has taken part; a
client's catch-up set is every coordinate changed in a round it has not seen.
A client counts as synced only once its reply has been accepted, so a client
whose message may never have arrived is charged from its older sync point next
time: the count errs on the side of more bytes, never fewer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from fedsketch.compress.common import Payload
from fedsketch.compress.sparse import decode_sparse_pairs, encode_sparse


@dataclass(frozen=True)
class DownloadLedger:
    """What each client has seen: a value, which a round replaces (:func:`record_update`, :func:`mark_synced`).

    ``changed_at[j]`` is the last round whose update changed coordinate ``j``
    (0: never changed since the initial model); ``synced[cid] = s`` means the
    client holds the model that was sent in round ``s`` (the weights after
    round ``s - 1``). Neither is changed in place.
    """

    changed_at: torch.Tensor
    synced: Mapping[int, int] = field(default_factory=dict)


def new_ledger(d: int) -> DownloadLedger:
    """A ledger for a model of ``d`` parameters that no client has seen yet."""
    if d <= 0:
        raise ValueError(f"model size d must be > 0; got {d}")
    return DownloadLedger(torch.zeros(d, dtype=torch.int32))


def record_update(
    ledger: DownloadLedger, server_round: int, before: torch.Tensor, after: torch.Tensor
) -> tuple[DownloadLedger, int]:
    """The ledger with the coordinates that round ``server_round`` changed marked, and how many."""
    if before.shape != ledger.changed_at.shape or after.shape != ledger.changed_at.shape:
        d = ledger.changed_at.numel()
        raise ValueError(f"weights of shape {tuple(before.shape)} and {tuple(after.shape)}; the ledger has d={d}")
    changed = (before != after).cpu()
    return replace(ledger, changed_at=torch.where(changed, server_round, ledger.changed_at)), int(changed.sum())


INITIAL = 1
"""The sync point of a client holding the initial model: the model sent in round 1."""
FORGOTTEN = 0
"""The sync point of a client that failed since it last synced: it holds nothing to rely on."""


def base_round(ledger: DownloadLedger, cid: int | None, from_init: bool) -> int | None:
    """The round whose model client ``cid`` holds; ``None`` if it holds none (it needs the dense model).

    A client never synced holds the initial model when ``from_init`` (it rebuilds
    it from the seed). A client that failed holds nothing to rely on (:func:`forget`).
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


def apply_catch_up(weights: np.ndarray, payload: Payload) -> np.ndarray:
    """The client side: overwrite the changed coordinates of the model it kept (returns a new array)."""
    idx, val = decode_sparse_pairs(payload, weights.size)
    out = np.array(weights, dtype=np.float32, copy=True)
    out[idx.numpy()] = val.numpy()
    return out


def forget(ledger: DownloadLedger, cids: list[int]) -> DownloadLedger:
    """The ledger where these clients may not hold what they were sent (they failed): their next download is dense.

    Also with ``from_init``: a client whose reply failed may be one that cannot rebuild the initial model.
    """
    return mark_synced(ledger, cids, FORGOTTEN)


def mark_synced(ledger: DownloadLedger, cids: list[int], server_round: int) -> DownloadLedger:
    """The ledger where the clients whose replies were accepted in ``server_round`` hold that round's model."""
    return replace(ledger, synced={**ledger.synced, **{int(cid): server_round for cid in cids}})
