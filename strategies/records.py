"""What the server writes down about a round: its counts in the books and its line in ``rounds.jsonl``.

Every client that was asked and did not contribute counts once, by kind
(:class:`strategies.replies.RoundReplies`); bytes are counted from what the
replies carried. ``rounds.jsonl`` holds one line per round: who was sampled and
answered, who failed and how, whether the update was applied and why not.
"""

from __future__ import annotations

import time
from typing import Any

from fedsketch.books import Books
from strategies.replies import RoundReplies

FAILURE_KINDS = (
    ("failures", "failed"),
    ("timeouts", "timeouts"),
    ("client_errors", "errors"),
    ("rejected", "rejected"),
)
"""Each books counter of clients that did not contribute, and the :class:`RoundReplies` field it counts."""


def count_failures(books: Books, got: RoundReplies) -> None:
    """Count the clients that were asked and did not contribute, by kind."""
    for key, field in FAILURE_KINDS:
        books.add(key, getattr(got, field))


def count_replies(books: Books, got: RoundReplies) -> None:
    """Bill what the replies carried, and count who failed and how."""
    books.add("upload", got.upload_bytes)
    books.add("diagnostic", got.diagnostic_bytes)
    count_failures(books, got)


def round_line(
    server_round: int, sampled: int, got: RoundReplies, skipped: str | None, contributors: int
) -> dict[str, Any]:
    """The round's line in ``rounds.jsonl`` (``unix_time``: when the round ended, before any evaluation)."""
    row: dict[str, Any] = {
        "round": server_round,
        "sampled": sampled,
        "clients": contributors,
        "timeouts": got.timeouts,
        "client_errors": got.errors,
        "rejected": got.rejected,
        "applied": skipped is None,
        "reason": skipped or "",
        "unix_time": round(time.time(), 3),
    }
    if got.failures:  # the first reason, so the command can say why without reading flower.log
        cid, why = next(iter(got.failures.items()))
        row["first_failure"] = f"client {cid}: {why}"
    return row
