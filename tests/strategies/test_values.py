"""The server's state is one frozen value: a round replaces it and never changes the one it was given.

:class:`strategies.values.ServerValues` holds the weights, the method's state,
the books (counters, the download ledger, stateful clients' homes and applied
rounds), the DP noise's state and the round. Each step of a round returns what it
counted and the strategy adds it into new books, so a value taken before a round
(a checkpoint's, say) still reads what it read then, to the last counter and
ledger entry, after the round has run.
"""

from __future__ import annotations

import copy
import math
from typing import Any, cast

import pytest
import torch
from flwr.app import ConfigRecord
from flwr.serverapp import Grid

from bridge.flower import task_identity
from fedsketch.config import RunConfig
from fedsketch.server.books import Books
from strategies.server_app import build_strategy
from strategies.strategy import FedSketchStrategy
from strategies.values import ServerValues
from tests.federation import TestGrid

BASE = {"num-clients": 12, "clients-per-round": 4, "model-hidden": 16, "k": 30, "num-rounds": 3, "eval-every": 1}


def one_round(strat: FedSketchStrategy, grid: TestGrid, server_round: int) -> None:
    """What :meth:`FedSketchStrategy.start` does for one round: the round, then its metrics row."""
    strat.run_round(server_round, cast(Grid, grid), ConfigRecord())
    strat.log_row(server_round, 0.0)


def snapshot(books: Books) -> dict[str, Any]:
    """Every field of the books, copied (the ledger's tensor cloned)."""
    return {
        **copy.deepcopy({k: v for k, v in vars(books).items() if k != "ledger"}),
        "changed_at": books.ledger.changed_at.clone(),
        "synced": dict(books.ledger.synced),
    }


def same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Field by field; NaN losses equal, tensors compared whole."""
    for key, x in a.items():
        y = b[key]
        if isinstance(x, torch.Tensor):
            if not torch.equal(x, y):
                return False
        elif x != y and not (isinstance(x, float) and math.isnan(x) and math.isnan(y)):
            return False
    return True


@pytest.mark.parametrize(
    "settings",
    [
        {"strategy": "fedavg", "download": "sparse"},  # counters, the download ledger
        {"strategy": "local_topk"},  # stateful clients: their homes and applied rounds
        {"strategy": "fetchsgd", "clip-norm": 1.0},  # clipped updates counted
    ],
    ids=["fedavg-sparse-download", "local_topk-client-state", "fetchsgd-clipped"],
)
def test_a_round_replaces_the_server_values_and_leaves_the_ones_it_was_given_as_they_were(
    settings: dict[str, Any],
) -> None:
    cfg = RunConfig.from_mapping({**BASE, **settings})
    strat = build_strategy(cfg, None)
    grid = TestGrid(cfg.to_mapping(), num_nodes=2)
    with task_identity():
        one_round(strat, grid, 1)
        before: ServerValues = strat.values
        books_then, weights_then = snapshot(before.books), before.weights.clone()
        one_round(strat, grid, 2)
    after = strat.values
    assert after is not before and after.books is not before.books
    assert same(snapshot(before.books), books_then)  # nothing of the old books changed in place
    assert torch.equal(before.weights, weights_then)
    assert not same(snapshot(after.books), books_then)  # the round did count
    assert after.books.totals["upload"] > before.books.totals["upload"] > 0
    assert after.books.totals["clients"] == 2 * cfg.clients_per_round
    if cfg.download == "sparse":
        assert not torch.equal(after.books.ledger.changed_at, books_then["changed_at"])
        assert after.books.ledger.synced != books_then["synced"]
    if settings["strategy"] == "local_topk":
        assert set(after.books.applied.values()) == {1, 2} and after.books.homes != {}
    if cfg.clip_norm:
        assert after.books.totals["clipped"] > before.books.totals["clipped"], (after.books.totals, before.books.totals)


def test_books_add_counts_into_new_books_and_refuse_a_counter_they_do_not_keep() -> None:
    books = Books.start(4, False)
    more = books.add({"upload": 5, "clients": 2}).add({"upload": 1})
    assert (more.totals["upload"], more.since_row["upload"], more.totals["clients"]) == (6, 6, 2)
    assert books.totals["upload"] == books.since_row["upload"] == 0  # the books it was given: as they were
    row = more.next_row()
    assert row.since_row["upload"] == 0 and row.totals["upload"] == 6 and more.since_row["upload"] == 6
    with pytest.raises(KeyError, match="no such counter: bytes, uploads"):
        books.add({"uploads": 1, "bytes": 2, "upload": 3})
