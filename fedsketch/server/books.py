"""The run's books: what the server keeps besides the model and the method's state.

Byte and failure counters (totals, and since the last metrics row), the rounds
of DP noise released (the privacy budget counts them), the download ledger
(:mod:`fedsketch.server.ledger`), which node keeps a stateful client's memory, which
client a node is (deployment), and the last round each stateful client's upload
was applied. A checkpoint saves exactly these values with the weights and the
method's state (:mod:`fedsketch.server.checkpoint`).

The books are a value: nothing changes them in place. The server's steps return
what they count (:data:`Counts`: bytes billed, clients failed, updates clipped)
and the round adds it, ``books.add(counts)``, into new books.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import torch

from fedsketch.server.ledger import DownloadLedger

COUNTERS = (
    "upload",
    "download",
    "download_sent",
    "dense",
    "clients",
    "failures",
    "timeouts",
    "client_errors",
    "rejected",
    "skipped_rounds",
    "clipped",
    "bounded",
    "sparse_downloads",
    "diagnostic",
)
"""Totals kept over the run; metrics rows report each since the previous row."""

Counts = Mapping[str, int]
"""What one step counted, by counter (each a name of :data:`COUNTERS`)."""


@dataclass(frozen=True)
class Books:
    """Counters and small maps, all plain values (tensors, ints, dicts), none changed in place."""

    totals: Mapping[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0))
    since_row: Mapping[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0))
    dp_rounds: int = 0  # rounds whose noisy sum was released
    last_loss: float = float("nan")  # mean training loss of the last applied round
    homes: Mapping[int, int] = field(default_factory=dict)  # cid -> the node that keeps its state
    node_cid: Mapping[int, int] = field(default_factory=dict)  # node -> its own client (one client per node)
    applied: Mapping[int, int] = field(default_factory=dict)  # cid -> last round its upload was applied (stateful)
    ledger: DownloadLedger = field(default_factory=lambda: DownloadLedger(torch.zeros(0, dtype=torch.int32)))

    @classmethod
    def start(cls, d: int, sparse_download: bool) -> Books:
        """Empty books; the ledger tracks ``d`` coordinates only when downloads are sparse."""
        return cls(ledger=DownloadLedger(torch.zeros(d if sparse_download else 0, dtype=torch.int32)))

    def add(self, counts: Counts) -> Books:
        """These books with ``counts`` added to the totals and to the counts since the last row.

        Raises
        ------
        KeyError
            If a count names no counter of :data:`COUNTERS`.
        """
        unknown = sorted(set(counts) - set(self.totals))
        if unknown:
            raise KeyError(f"no such counter: {', '.join(unknown)}")
        totals = {key: value + counts.get(key, 0) for key, value in self.totals.items()}
        since = {key: value + counts.get(key, 0) for key, value in self.since_row.items()}
        return replace(self, totals=totals, since_row=since)

    def next_row(self) -> Books:
        """These books with a new metrics row begun: nothing counted since it."""
        return replace(self, since_row=dict.fromkeys(self.totals, 0))
