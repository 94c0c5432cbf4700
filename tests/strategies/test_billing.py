"""What each client is charged for what it receives (``strategies/billing.py``), to the byte of the serialized records.

In simulation (a cohort per message) and deployment (one client per message, billed as sent). A client of
a cohort is charged what a message to it alone would carry: the model or, with sparse downloads, its
catch-up when smaller (the built payload's size), and the round's config naming one client; its own arrays
are charged to it. A device is charged the message it is sent, which is its catch-up when that message is
smaller (a tie sends the model). A second exchange charges each asked client its query and config. The
catch-up sizes are worked out without building the parts whose content cannot change them (they equal the
built payloads' serialized sizes): a spy on the catch-up's functions (calling through) sees which
payloads were built (docs/mutation.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any, cast

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, MessageType, RecordDict
from flwr.serverapp import Grid

from bridge import messages
from bridge.flower import task_identity
from fedsketch import wire
from fedsketch.compress.sparse import decode_sparse_pairs
from fedsketch.config import RunConfig
from fedsketch.methods import ClientUpdate
from fedsketch.server import ledger as ledgers
from fedsketch.server.books import Books, Counts
from strategies import billing
from strategies.plan import RoundPlan


def _reference(ledger: ledgers.DownloadLedger, cid: int, rnd: int, w: torch.Tensor, from_init: bool) -> int | None:
    payload = billing.catch_up(ledger, cid, rnd, w, from_init)
    return None if payload is None else messages.wire_bytes(messages.payload_to_record(payload))


def _ledger(d: int, rounds: int, per_round: int, seed: int) -> ledgers.DownloadLedger:
    gen = torch.Generator().manual_seed(seed)
    changed_at = Books.start(d, sparse_download=True).ledger.changed_at
    for rnd in range(1, rounds):
        changed_at[torch.randint(0, d, (per_round,), generator=gen)] = rnd
    # clients synced to every round, one forgotten, and (cid 99) one never seen
    synced = {cid: cid for cid in range(1, rounds + 1)}
    return ledgers.DownloadLedger(changed_at, {**synced, 0: ledgers.FORGOTTEN})


@pytest.mark.parametrize("max_chunk", [None, 64, 1000])
@pytest.mark.parametrize(("d", "per_round"), [(5, 2), (8, 3), (9, 1), (100, 7), (3000, 40), (50_000, 900)])
@pytest.mark.parametrize("weights", ["random", "constant"])
def test_catch_up_bytes_equal_the_built_payloads(
    monkeypatch: pytest.MonkeyPatch, max_chunk: int | None, d: int, per_round: int, weights: str
) -> None:
    if max_chunk is not None:  # small chunks: values, masks and indices of several chunks, equal ones included
        monkeypatch.setattr(messages, "MAX_CHUNK", max_chunk)
    rounds = 12
    ledger = _ledger(d, rounds, per_round, seed=d)
    w = torch.randn(d) if weights == "random" else torch.full((d,), 0.5)
    counts = billing.changed_since(ledger)
    for from_init in (False, True):
        for cid in [*range(rounds + 1), 99]:
            want = _reference(ledger, cid, rounds, w, from_init)
            got = billing.catch_up_bytes(ledger, cid, rounds, w, from_init, counts)
            assert got == want, (cid, from_init)


def test_equal_value_chunks_are_counted_once_as_flower_sends_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(messages, "MAX_CHUNK", 256)
    ledger = ledgers.DownloadLedger(torch.full((4096,), 3, dtype=torch.int32), {1: 2})
    counts = billing.changed_since(ledger)
    constant = billing.catch_up_bytes(ledger, 1, 4, torch.full((4096,), 2.0), False, counts)
    varied = billing.catch_up_bytes(ledger, 1, 4, torch.arange(4096, dtype=torch.float32), False, counts)
    assert constant is not None and varied is not None and constant < varied


def test_changed_since_counts_every_round() -> None:
    ledger = ledgers.DownloadLedger(torch.tensor([0, 0, 1, 1, 1, 2, 4, 4, 4, 4], dtype=torch.int32))
    counts = billing.changed_since(ledger)
    assert counts.tolist() == [10, 8, 5, 4, 4, 0]
    for since in range(6):
        assert counts[since] == int((ledger.changed_at >= since).sum())
    ledger = ledgers.mark_synced(ledger, [7], 9)  # synced after the last change: nothing to send
    assert billing.catch_up_count(ledger, 7, False, counts) == 0
    assert np.array_equal(billing.catch_up_values(ledger, 7, torch.randn(10), False), np.zeros(0, np.float32))


def test_a_one_byte_mask_equal_to_the_encoding_byte_is_sent_once() -> None:
    changed_at = Books.start(8, sparse_download=True).ledger.changed_at
    changed_at[0] = 2  # the packed mask is the byte 1, the same as enc = 1 (bitmap)
    ledger = ledgers.DownloadLedger(changed_at, {1: 2})
    w = torch.randn(8)
    got = billing.catch_up_bytes(ledger, 1, 3, w, False, billing.changed_since(ledger))
    assert got == _reference(ledger, 1, 3, w, False)


# each client's charge, to the byte, in simulation and deployment --------------------------------------------


ROUND = 4
D = 3000
SYNCED = {1: 3, 2: 2, 3: 3, 4: ledgers.FORGOTTEN, 6: 1}  # 5 never took part
EXTRAS = {1: {"a": np.arange(7, dtype=np.float32)}, 3: {"b": np.ones((2, 3), dtype=np.int64)}}


def run_config(**settings: object) -> RunConfig:
    return RunConfig.from_mapping({"strategy": "fedavg", **settings})


def weights(d: int = D) -> torch.Tensor:
    return torch.arange(d, dtype=torch.float32) * 0.25 + 0.5  # distinct values: no two chunks alike


def books(d: int = D, sparse: bool = True, ones: int = 100) -> Books:
    """Round 4's books: 5 coordinates changed in round 3, 35 in round 2, up to ``ones`` in round 1, the rest never."""
    out = Books.start(d, sparse)
    if not sparse:
        return out
    changed_at = out.ledger.changed_at.clone()
    changed_at[:ones] = 1
    changed_at[:40] = 2
    changed_at[:5] = 3
    return replace(out, ledger=ledgers.DownloadLedger(changed_at, dict(SYNCED)))


def ledger_books(d: int, changed: list[int] | slice, synced: dict[int, int], **fields: Any) -> Books:
    """Books of a sparse-download run whose ledger has ``changed`` coordinates changed in round 3."""
    changed_at = torch.zeros(d, dtype=torch.int32)
    changed_at[changed] = 3
    return replace(Books.start(d, True), ledger=ledgers.DownloadLedger(changed_at, synced), **fields)


def round_plan(sent: dict[int, list[int]]) -> RoundPlan:
    return RoundPlan(ROUND, cast(Grid, None), sent, {"lr": 0.125, "server-round": ROUND}, {})


def model(d: int = D) -> ArrayRecord:
    return messages.model_record(weights(d).numpy())


def caught_up(book: Books, cid: int, from_init: bool, d: int = D) -> ArrayRecord | None:
    """The catch-up payload ``cid`` is sent, built and serialized."""
    payload = billing.catch_up(book.ledger, cid, ROUND, weights(d), from_init)
    return None if payload is None else messages.payload_to_record(payload)


def alone(record: ArrayRecord, config: dict[str, Any], extra: ArrayRecord | None = None) -> int:
    """The serialized size of a message to one client alone."""
    return messages.wire_bytes(messages.train_request(record, config, [0], {} if extra is None else {0: extra}))


def cohort_charge(book: Books, cid: int, from_init: bool, config: dict[str, Any], d: int = D) -> tuple[int, int]:
    """What ``cid`` alone should be charged (the smaller of model and catch-up), and 1 if that is its catch-up."""
    dense = alone(model(d), config)
    record = caught_up(book, cid, from_init, d)
    sparse = dense + 1 if record is None else alone(record, config)
    return min(dense, sparse), int(sparse < dense)


# ------------------------------------------------------------------------------------- a cohort per message
@pytest.mark.parametrize("from_init", [False, True])
@pytest.mark.parametrize("max_chunk", [None, 64])
@pytest.mark.parametrize("ones", [100, D - 5])  # catch-ups from round 1 smaller than the model, or larger
def test_each_client_of_a_cohort_is_charged_its_smaller_download(
    monkeypatch: pytest.MonkeyPatch, from_init: bool, max_chunk: int | None, ones: int
) -> None:
    if max_chunk is not None:  # values and masks of several chunks: the real values are read
        monkeypatch.setattr(messages, "MAX_CHUNK", max_chunk)
    cfg = run_config(download="sparse", **{"download-from-init": from_init})
    book, p = books(ones=ones), round_plan({11: [1, 2], 12: [3, 4, 5, 6]})
    charged = billing.count_download(book, cfg, p, model(), weights(), False)
    charges = [cohort_charge(books(ones=ones), cid, from_init, p.config) for cid in range(1, 7)]
    assert charged["download"] == sum(c for c, _ in charges)
    assert charged["sparse_downloads"] == sum(s for _, s in charges) == {100: 4 + from_init, D - 5: 3}[ones]
    assert charges[3] == (alone(model(), p.config), 0)  # forgotten: the dense model
    for cid in range(1, 7):  # each one alone: the same charge, whoever shares its cohort
        one = billing.count_download(books(ones=ones), cfg, round_plan({11: [cid]}), model(), weights(), False)
        assert (one["download"], one["sparse_downloads"]) == charges[cid - 1]


def test_a_catch_up_larger_than_a_tiny_model_is_charged_as_the_model() -> None:
    book = ledger_books(8, [0, 5], {1: 3, 2: 3})  # a one-byte mask: the catch-up is built to be sized
    cfg, p = run_config(download="sparse"), round_plan({11: [1, 2]})
    charged = billing.count_download(book, cfg, p, model(8), weights(8), False)
    record = caught_up(book, 1, False, 8)
    assert record is not None and alone(record, p.config) > alone(model(8), p.config)
    assert charged["download"] == 2 * alone(model(8), p.config)
    assert charged["sparse_downloads"] == 0


@pytest.mark.parametrize("stateful", [False, True])
def test_dense_downloads_charge_every_sampled_client_the_model_and_its_config(stateful: bool) -> None:
    config = {**round_plan({}).config, **({wire.SETTLED: [0]} if stateful else {})}
    for cfg, book, sent in [
        (run_config(download="dense"), books(sparse=False), {11: [1, 2], 12: [3]}),
        (run_config(download="sparse"), books(), {101: [], 102: [], 103: []}),  # devices: no cohort to catch up
    ]:
        charged = billing.count_download(book, cfg, round_plan(sent), model(), weights(), stateful)
        assert charged["download"] == 3 * alone(model(), config)
        assert charged["sparse_downloads"] == 0


def test_a_catch_up_as_large_as_the_model_is_charged_but_not_counted_as_sparse() -> None:
    d = 238  # ten changed coordinates: a catch-up of exactly the model's serialized size
    book = ledger_books(d, slice(0, 10), {1: 3})
    p = round_plan({11: [1]})
    record = caught_up(book, 1, False, d)
    assert record is not None and messages.wire_bytes(record) == messages.wire_bytes(model(d))
    charged = billing.count_download(book, run_config(download="sparse"), p, model(d), weights(d), False)
    assert charged["download"] == alone(model(d), p.config)
    assert charged["sparse_downloads"] == 0


def test_arrays_for_single_clients_are_charged_as_serialized() -> None:
    records = {cid: messages.payload_to_record(x) for cid, x in EXTRAS.items()}
    charged = billing.requests(records)
    assert charged == {"download": sum(messages.wire_bytes(r) for r in records.values())} and charged["download"] > 0


def spy(monkeypatch: pytest.MonkeyPatch, name: str) -> list[int]:
    """Count the calls of ``billing.<name>``, which still runs."""
    calls: list[int] = []
    real = getattr(billing, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(billing, name, counted)
    return calls


def sized(ledger: ledgers.DownloadLedger, w: torch.Tensor) -> int | None:
    """Client 1's catch-up size as billed, checked against the built payload's."""
    got = billing.catch_up_bytes(ledger, 1, ROUND, w, False, billing.changed_since(ledger))
    payload = billing.catch_up(ledger, 1, ROUND, w)
    assert payload is not None and got == messages.wire_bytes(messages.payload_to_record(payload))
    return got


def ledger(d: int, changed: int) -> ledgers.DownloadLedger:
    return ledger_books(d, slice(0, changed), {1: 3}).ledger


@pytest.mark.parametrize("spare", [0, 1])
def test_values_of_one_chunk_are_sized_without_reading_them(monkeypatch: pytest.MonkeyPatch, spare: int) -> None:
    d, n = 3000, 40  # indices: 160 bytes against a 375-byte mask
    values = len(messages.npy_array(np.zeros(n, dtype=np.float32)).data)
    monkeypatch.setattr(messages, "MAX_CHUNK", values - 1 + spare)  # one chunk exactly, or two
    built, read = spy(monkeypatch, "catch_up"), spy(monkeypatch, "catch_up_values")
    sized(ledger(d, n), weights(d))
    assert (len(built), len(read)) == (1, 1 - spare)  # the one built is the reference's


@pytest.mark.parametrize("spare", [0, 1])
def test_a_mask_of_one_chunk_is_sized_without_building_it(monkeypatch: pytest.MonkeyPatch, spare: int) -> None:
    d, n = 3000, 100  # a 375-byte mask against 400 bytes of indices
    mask = len(messages.npy_array(np.zeros(375, dtype=np.uint8)).data)
    monkeypatch.setattr(messages, "MAX_CHUNK", mask - 1 + spare)
    built = spy(monkeypatch, "catch_up")
    sized(ledger(d, n), weights(d))
    assert len(built) == 2 - spare


@pytest.mark.parametrize(("d", "builds"), [(8, 2), (9, 1), (16, 1), (17, 1)])
def test_only_a_one_byte_mask_is_built_to_be_sized(monkeypatch: pytest.MonkeyPatch, d: int, builds: int) -> None:
    built = spy(monkeypatch, "catch_up")
    sized(ledger(d, 2), weights(d))  # two of up to 17: the mask is smaller than 8 bytes of indices
    assert len(built) == builds


# ---------------------------------------------------------------------------------- one client per message
def node_books() -> Books:
    return replace(books(), node_cid={100 + cid: cid for cid in range(1, 7)})


def node_request(cfg: RunConfig, book: Books, node: int, extras: dict[int, ArrayRecord]) -> tuple[RecordDict, Counts]:
    p = round_plan({node: []})
    return billing.node_request(book, cfg, p, node, model(), weights(), p.config, extras)


def test_a_device_that_kept_its_model_is_sent_and_charged_its_catch_up() -> None:
    cfg, book = run_config(download="sparse", **{"client-assignment": "node"}), node_books()
    extras = {1: messages.payload_to_record(EXTRAS[1])}
    content, charged = node_request(cfg, book, 101, extras)
    assert charged["download"] == messages.wire_bytes(content)
    assert charged["sparse_downloads"] == 1
    request = messages.read_request(content)
    assert request.weights is None and request.catch_up is not None and request.base_round == 3
    assert request.cids == [] and request.config["lr"] == 0.125 and request.server_round == ROUND
    assert set(request.extras) == {1} and np.array_equal(request.extras[1]["a"], EXTRAS[1]["a"])
    idx, values = decode_sparse_pairs(request.catch_up, D)
    assert idx.tolist() == list(range(5))  # changed in round 3, the one it has not seen
    assert torch.equal(values, weights()[:5])
    dense = messages.train_request(model(), round_plan({}).config, [], extras)
    assert messages.wire_bytes(content) < messages.wire_bytes(dense)


@pytest.mark.parametrize("from_init", [False, True])
def test_a_device_holding_no_model_is_sent_and_charged_the_model(from_init: bool) -> None:
    cfg = run_config(download="sparse", **{"client-assignment": "node", "download-from-init": from_init})
    for node in (104, 999):  # forgotten; a node never heard from (with download-from-init: the initial model)
        content, charged = node_request(cfg, node_books(), node, {})
        request = messages.read_request(content)
        assert charged["download"] == messages.wire_bytes(content)
        if from_init and node == 999:
            assert request.catch_up is not None and request.base_round == ledgers.INITIAL
            idx, values = decode_sparse_pairs(request.catch_up, D)
            assert idx.tolist() == list(range(100)) and torch.equal(values, weights()[:100])  # rounds 1 to 3
            assert charged["sparse_downloads"] == 1
        else:
            assert request.catch_up is None and request.weights is not None
            assert np.array_equal(request.weights, weights().numpy())
            assert charged["sparse_downloads"] == 0


def test_with_dense_downloads_a_device_is_sent_the_model_whatever_the_ledger_holds() -> None:
    content, charged = node_request(
        run_config(download="dense", **{"client-assignment": "node"}), node_books(), 101, {}
    )
    request = messages.read_request(content)
    assert request.catch_up is None and request.weights is not None
    assert charged["download"] == messages.wire_bytes(content) and charged["sparse_downloads"] == 0


def test_a_catch_up_message_as_large_as_the_model_message_leaves_the_model() -> None:
    d = 249  # sixteen changed coordinates: the two messages serialize to the same size
    book = ledger_books(d, slice(0, 16), {1: 3}, node_cid={101: 1})
    p = round_plan({101: []})
    record = caught_up(book, 1, False, d)
    assert record is not None
    dense = messages.train_request(model(d), p.config, [], {})
    sparse = messages.train_request(record, {**p.config, wire.BASE_ROUND: 3}, [], {}, key=wire.CATCH_UP_KEY)
    assert messages.wire_bytes(sparse) == messages.wire_bytes(dense)
    cfg = run_config(download="sparse")
    content, charged = billing.node_request(book, cfg, p, 101, model(d), weights(d), p.config, {})
    assert messages.read_request(content).catch_up is None
    assert charged["download"] == messages.wire_bytes(dense) and charged["sparse_downloads"] == 0


# ------------------------------------------------------------------------------------------- a round's requests
def extra_records() -> dict[int, ArrayRecord]:
    return {cid: messages.payload_to_record(x) for cid, x in EXTRAS.items()}


@pytest.mark.parametrize("stateful", [False, True])
@pytest.mark.parametrize("mode", ["dense", "sparse"])
def test_a_cohort_round_sends_each_node_its_clients_and_bills_each_client(stateful: bool, mode: str) -> None:
    cfg, book = run_config(download=mode), replace(books(sparse=mode == "sparse"), applied={1: 2, 4: 3})
    p = round_plan({11: [1, 2], 12: [3, 4]})
    targets = p.targets(book)
    contents, charged = billing.round_requests(book, cfg, p, model(), weights(), targets, extra_records(), stateful)
    assert set(contents) == {11, 12}
    for node, cids in p.sent.items():
        request = messages.read_request(contents[node])
        assert request.cids == cids and np.array_equal(request.weights, weights().numpy())
        assert request.config["lr"] == 0.125
        if stateful:
            assert request.config[wire.SETTLED] == [book.applied.get(c, -1) for c in cids]
        else:
            assert wire.SETTLED not in request.config
        assert set(request.extras) == set(cids) & set(EXTRAS)
        for cid in request.extras:
            for name, x in EXTRAS[cid].items():
                assert np.array_equal(request.extras[cid][name], x)
    config = {**p.config, **({wire.SETTLED: [0]} if stateful else {})}
    if mode == "dense":
        charges = 4 * [(alone(model(), config), 0)]
    else:  # clients 1 and 3 kept the model of round 3, 2 that of round 2, 4 was forgotten
        charges = [cohort_charge(books(), cid, False, config) for cid in range(1, 5)]
    extras = sum(messages.wire_bytes(r) for r in extra_records().values())
    assert charged["download"] == sum(c for c, _ in charges) + extras
    assert charged["sparse_downloads"] == sum(s for _, s in charges) == (3 if mode == "sparse" else 0)
    assert charged["download_sent"] == sum(messages.wire_bytes(c) for c in contents.values())


@pytest.mark.parametrize("stateful", [False, True])
def test_a_round_of_devices_bills_each_message_as_sent(stateful: bool) -> None:
    cfg, book = run_config(download="sparse", **{"client-assignment": "node"}), replace(node_books(), applied={1: 3})
    p = round_plan({101: [], 104: [], 999: []})
    targets = p.targets(book)
    contents, charged = billing.round_requests(book, cfg, p, model(), weights(), targets, extra_records(), stateful)
    sent = sum(messages.wire_bytes(c) for c in contents.values())
    assert charged["download"] == charged["download_sent"] == sent
    assert charged["sparse_downloads"] == 1
    first, forgotten, new = (messages.read_request(contents[n]) for n in (101, 104, 999))
    assert first.catch_up is not None and first.base_round == 3 and set(first.extras) == {1}
    assert forgotten.catch_up is None and np.array_equal(forgotten.weights, weights().numpy())
    assert new.catch_up is None and new.extras == {}
    if stateful:
        settled = [first.config[wire.SETTLED], forgotten.config[wire.SETTLED], new.config[wire.SETTLED]]
        assert settled == [[3], [-1], [-1]]
    else:
        assert all(wire.SETTLED not in r.config for r in (first, forgotten, new))


# ------------------------------------------------------------------------------------------ a second exchange
QUERY = {"q": np.linspace(-1.0, 1.0, 50, dtype=np.float32)}


def update(cid: int, node: int) -> ClientUpdate:
    return ClientUpdate(cid, {}, 10, 0.0, 0, node)


@pytest.fixture
def identity() -> Iterator[None]:
    with task_identity():
        yield


def query_charge() -> int:
    config = {wire.ROUND: ROUND, wire.PHASE: 2}
    return messages.wire_bytes(messages.query_request(messages.payload_to_record(QUERY), config, [0]))


@pytest.mark.usefixtures("identity")
def test_a_second_exchange_asks_a_cohort_only_the_clients_that_answered() -> None:
    p = round_plan({11: [1, 2], 12: [3], 13: [4], 14: [5, 6]})
    updates = [update(3, 12), update(1, 11), update(6, 14), update(2, 11)]
    sent, requests, charged = billing.second_exchange(run_config(), p, updates, QUERY)
    assert sent == {11: [1, 2], 12: [3], 14: [6]}
    assert [m.metadata.dst_node_id for m in requests] == [11, 12, 14]
    for m in requests:
        assert m.metadata.message_type == MessageType.TRAIN
        request = messages.read_request(m.content)
        assert request.phase == 2 and request.server_round == ROUND and request.cids == sent[m.metadata.dst_node_id]
        assert request.query is not None and np.array_equal(request.query["q"], QUERY["q"])
    assert charged == {
        "download": 4 * query_charge(),
        "download_sent": sum(messages.wire_bytes(m.content) for m in requests),
    }


@pytest.mark.usefixtures("identity")
def test_a_second_exchange_asks_each_device_that_answered() -> None:
    p = round_plan({101: [], 102: [], 103: []})
    cfg = run_config(**{"client-assignment": "node"})
    sent, requests, charged = billing.second_exchange(cfg, p, [update(7, 103), update(5, 101)], QUERY)
    assert sent == {103: [], 101: []}
    assert [m.metadata.dst_node_id for m in requests] == [103, 101]
    assert all(messages.read_request(m.content).cids == [] for m in requests)
    assert charged == {
        "download": 2 * query_charge(),
        "download_sent": sum(messages.wire_bytes(m.content) for m in requests),
    }
    assert all(isinstance(m.content[wire.CONFIG_KEY], ConfigRecord) for m in requests)
