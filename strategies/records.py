"""What the server writes down about a round: its counts for the books and its line in ``rounds.jsonl``.

Every client that was asked and did not contribute counts once, by kind
(:class:`strategies.replies.RoundReplies`); bytes are counted from what the
replies carried. ``rounds.jsonl`` holds one line per round: which of a deployment's nodes were
missing, who was sampled and answered, who failed and how, whether the update
was applied and why not.
"""

from __future__ import annotations

import time
from typing import Any

from fedsketch.server.books import Counts
from strategies.replies import RoundReplies

FAILURE_KINDS = (
    ("failures", "failed"),
    ("timeouts", "timeouts"),
    ("client_errors", "errors"),
    ("rejected", "rejected"),
    ("bounded", "bounded"),
)
"""Each books counter of clients that did not contribute, and the :class:`RoundReplies` field it counts."""


def failure_counts(got: RoundReplies) -> Counts:
    """The clients that were asked and did not contribute, counted by kind."""
    return {key: getattr(got, field) for key, field in FAILURE_KINDS}


def reply_counts(got: RoundReplies) -> Counts:
    """What the replies carried, billed, and who failed and how, counted."""
    return {"upload": got.upload_bytes, "diagnostic": got.diagnostic_bytes, **failure_counts(got)}


def round_counts(got: RoundReplies, dense_bytes: int) -> Counts:
    """A round's first exchange: :func:`reply_counts`, and the clients that contributed with the dense bytes they
    stand for (``dense_bytes`` each: what an uncompressed upload would have cost)."""
    clients = len(got.contributors())
    return {**reply_counts(got), "clients": clients, "dense": dense_bytes * clients}


def round_line(
    server_round: int, sampled: int, got: RoundReplies, skipped: str | None, contributors: int, missing: int = 0
) -> dict[str, Any]:
    """The round's line in ``rounds.jsonl`` (``unix_time``: when the round ended, before any evaluation;
    ``missing_nodes``: a deployment's nodes not connected when the round was sampled)."""
    row: dict[str, Any] = {
        "round": server_round,
        "missing_nodes": missing,
        "sampled": sampled,
        "clients": contributors,
        "timeouts": got.timeouts,
        "client_errors": got.errors,
        "rejected": got.rejected,
        "bounded": got.bounded,
        "applied": skipped is None,
        "reason": skipped or "",
        "unix_time": round(time.time(), 3),
    }
    if got.failures:  # the first reason, so the command can say why without reading flower.log
        cid, why = next(iter(got.failures.items()))
        row["first_failure"] = f"client {cid}: {why}"
    return row
