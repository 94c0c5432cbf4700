"""The run's books (``fedsketch/server/books.py``): counters added into new books, a ledger only where it is read."""

from __future__ import annotations

from fedsketch.server.books import COUNTERS, Books


def test_only_sparse_downloads_keep_a_coordinate_ledger() -> None:
    assert Books.start(1000, sparse_download=True).ledger.changed_at.shape == (1000,)
    assert Books.start(1000, sparse_download=False).ledger.changed_at.numel() == 0  # 4 d bytes saved


def test_counts_add_into_new_books_and_a_counter_not_counted_stays_as_it_was() -> None:
    start = Books.start(10, sparse_download=False)
    once = start.add({"upload": 5, "clients": 2})
    twice = once.add({"upload": 1})
    assert twice.totals["upload"] == twice.since_row["upload"] == 6 and twice.totals["clients"] == 2
    assert all(twice.totals[c] == 0 for c in COUNTERS if c not in ("upload", "clients"))
    assert all(twice.since_row[c] == 0 for c in COUNTERS if c not in ("upload", "clients"))
    assert start.totals["upload"] == 0 and once.totals["upload"] == 5  # values: the books given are as they were
