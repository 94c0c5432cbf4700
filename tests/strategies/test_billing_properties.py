"""Billing sparse downloads: a catch-up is never charged above the dense model (``strategies/billing.py``).

A returning client is sent the coordinates changed since it last synced
(:func:`strategies.billing.catch_up`) or the dense model, whichever is smaller. Over many
random change histories, where a stale client's catch-up often grows larger
than the model itself, every client's charge is at most what a client that
never took part pays (the dense model and the round's config), in simulation
(a cohort per message) and deployment (one client per message, billed as sent).
"""

from __future__ import annotations

from dataclasses import replace
from typing import cast

import numpy as np
import torch
from flwr.serverapp import Grid

from bridge import messages
from fedsketch.config import RunConfig
from fedsketch.server import ledger as ledgers
from fedsketch.server.books import Books, Counts
from strategies import billing
from strategies.plan import RoundPlan

HISTORIES = 60
CLIENTS = 6
NEVER_SYNCED = 10_000  # a client id that never took part


def history(rng: np.random.Generator) -> tuple[Books, int, torch.Tensor]:
    """Books after a random run of sparse downloads (random change densities, random syncs); the round now billed
    and its model."""
    d, rounds = int(rng.integers(4, 400)), int(rng.integers(2, 12))
    books = Books.start(d, True)
    ledger = books.ledger
    weights = torch.from_numpy(rng.standard_normal(d).astype(np.float32))
    for rnd in range(1, rounds):
        after = weights.clone()
        changed = rng.random(d) < rng.choice([0.0, 0.01, 0.1, 0.5, 0.9, 1.0])
        after[torch.from_numpy(changed)] += 1.0
        ledger = ledgers.mark_synced(ledger, [c for c in range(CLIENTS) if rng.random() < 0.4], rnd)
        ledger, _ = ledgers.record_update(ledger, rnd, weights, after)
        weights = after
    return replace(books, ledger=ledger), rounds, weights


def round_plan(server_round: int, sent: dict[int, list[int]]) -> RoundPlan:
    return RoundPlan(server_round, cast(Grid, None), sent, {"lr": 0.1, "server-round": server_round}, {})


def cohort_charge(books: Books, cfg: RunConfig, server_round: int, w: torch.Tensor, cid: int) -> int:
    """What client ``cid`` is charged for this round's model, as one of a cohort (``count_download``)."""
    p = round_plan(server_round, {1: [cid]})
    return billing.count_download(books, cfg, p, messages.model_record(w.numpy()), w, False)["download"]


def node_charge(books: Books, cfg: RunConfig, server_round: int, w: torch.Tensor, node: int) -> Counts:
    """What the device ``node`` is charged for this round's message (``node_request``)."""
    p = round_plan(server_round, {node: []})
    return billing.node_request(books, cfg, p, node, messages.model_record(w.numpy()), w, p.config, {})[1]


def catch_up_bytes(books: Books, cid: int, server_round: int, w: torch.Tensor) -> int | None:
    payload = billing.catch_up(books.ledger, cid, server_round, w)
    return None if payload is None else messages.wire_bytes(messages.payload_to_record(payload))


def test_a_catch_up_is_never_billed_above_the_dense_model_in_simulation() -> None:
    cfg = RunConfig.from_mapping({"strategy": "fedavg", "download": "sparse"})
    rng, larger, smaller = np.random.default_rng(0), 0, 0
    for _ in range(HISTORIES):
        books, rnd, w = history(rng)
        dense = cohort_charge(books, cfg, rnd, w, NEVER_SYNCED)
        model_bytes = messages.wire_bytes(messages.model_record(w.numpy()))
        for cid in range(CLIENTS):
            assert cohort_charge(books, cfg, rnd, w, cid) <= dense
            size = catch_up_bytes(books, cid, rnd, w)
            larger += size is not None and size > model_bytes
            smaller += size is not None and size < model_bytes
    assert larger > 20 and smaller > 20  # the histories exercise both sides of the cap


def test_a_catch_up_is_never_billed_above_the_dense_message_with_one_client_per_node() -> None:
    cfg = RunConfig.from_mapping({"strategy": "fedavg", "download": "sparse", "client-assignment": "node"})
    rng, caught_up, larger = np.random.default_rng(1), 0, 0
    for _ in range(HISTORIES):
        books, rnd, w = history(rng)
        config = round_plan(rnd, {}).config
        dense = messages.wire_bytes(messages.train_request(messages.model_record(w.numpy()), config, [], {}))
        model_bytes = messages.wire_bytes(messages.model_record(w.numpy()))
        for cid in range(CLIENTS):
            charged = node_charge(replace(books, node_cid={101 + cid: cid}), cfg, rnd, w, 101 + cid)
            assert charged["download"] <= dense
            caught_up += charged["sparse_downloads"]
            size = catch_up_bytes(books, cid, rnd, w)
            larger += size is not None and size > model_bytes
    assert caught_up > 20 and larger > 20
