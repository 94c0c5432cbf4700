"""What each client has seen of the model: the ledger that sparse downloads are worked out from.

FetchSGD's server applies a k-sparse update each round (Rothchild et al., ICML
2020, Sec. 4), so a client that kept the model it last received needs only the
coordinates changed since then to catch up (``download = "sparse"``; the
catch-up and its bytes: :mod:`strategies.billing`). The server keeps one
``int32`` per coordinate (the last round that changed it, ``4 d`` bytes) and one
round number per client that has taken part. A client counts as synced only once
its reply has been accepted, so a client whose message may never have arrived is
charged from its older sync point next time: the count errs on the side of more
bytes, never fewer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import torch


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


def forget(ledger: DownloadLedger, cids: list[int]) -> DownloadLedger:
    """The ledger where these clients may not hold what they were sent (they failed): their next download is dense.

    Also with ``from_init``: a client whose reply failed may be one that cannot rebuild the initial model.
    """
    return mark_synced(ledger, cids, FORGOTTEN)


def mark_synced(ledger: DownloadLedger, cids: list[int], server_round: int) -> DownloadLedger:
    """The ledger where the clients whose replies were accepted in ``server_round`` hold that round's model."""
    return replace(ledger, synced={**ledger.synced, **{int(cid): server_round for cid in cids}})
