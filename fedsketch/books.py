"""The run's books: what the server keeps besides the model and the method's state.

Byte and failure counters (totals, and since the last metrics row), the rounds
of DP noise released (the privacy budget counts them), the download ledger
(:mod:`fedsketch.download`), which node keeps a stateful client's memory, which
client a node is (deployment), and the last round each stateful client's upload
was applied. A checkpoint saves exactly these values with the weights and the
method's state (:mod:`fedsketch.checkpoint`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from fedsketch.download import DownloadLedger

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
    "sparse_downloads",
    "diagnostic",
)
"""Totals kept over the run; metrics rows report each since the previous row."""


@dataclass
class Books:
    """Counters and small maps, all plain values (tensors, ints, dicts)."""

    totals: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0))
    since_row: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0))
    dp_rounds: int = 0  # rounds whose noisy sum was released
    last_loss: float = float("nan")  # mean training loss of the last applied round
    homes: dict[int, int] = field(default_factory=dict)  # cid -> the node that keeps its state
    node_cid: dict[int, int] = field(default_factory=dict)  # node -> its own client (one client per node)
    applied: dict[int, int] = field(default_factory=dict)  # cid -> last round its upload was applied (stateful)
    ledger: DownloadLedger = field(default_factory=lambda: DownloadLedger(torch.zeros(0, dtype=torch.int32)))

    @classmethod
    def start(cls, d: int, sparse_download: bool) -> Books:
        """Empty books; the ledger tracks ``d`` coordinates only when downloads are sparse."""
        return cls(ledger=DownloadLedger(torch.zeros(d if sparse_download else 0, dtype=torch.int32)))

    def add(self, key: str, amount: int) -> None:
        """Count ``amount`` of ``key`` in the totals and since the last row."""
        self.totals[key] += amount
        self.since_row[key] += amount

    def take_row(self) -> dict[str, int]:
        """The counts since the last row; starts a new row."""
        row, self.since_row = self.since_row, dict.fromkeys(self.totals, 0)
        return row
