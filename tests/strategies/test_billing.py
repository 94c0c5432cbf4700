"""The catch-up sizes billing charges without building each payload equal the built payloads' serialized sizes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bridge import messages
from fedsketch.server import download
from strategies import billing


def _reference(ledger: download.DownloadLedger, cid: int, rnd: int, w: torch.Tensor, from_init: bool) -> int | None:
    payload = download.catch_up(ledger, cid, rnd, w, from_init)
    return None if payload is None else messages.wire_bytes(messages.payload_to_record(payload))


def _ledger(d: int, rounds: int, per_round: int, seed: int) -> download.DownloadLedger:
    gen = torch.Generator().manual_seed(seed)
    changed_at = download.new_ledger(d).changed_at
    for rnd in range(1, rounds):
        changed_at[torch.randint(0, d, (per_round,), generator=gen)] = rnd
    # clients synced to every round, one forgotten, and (cid 99) one never seen
    synced = {cid: cid for cid in range(1, rounds + 1)}
    return download.DownloadLedger(changed_at, {**synced, 0: download.FORGOTTEN})


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
    counts = download.changed_since(ledger)
    for from_init in (False, True):
        for cid in [*range(rounds + 1), 99]:
            want = _reference(ledger, cid, rounds, w, from_init)
            got = billing.catch_up_bytes(ledger, cid, rounds, w, from_init, counts)
            assert got == want, (cid, from_init)


def test_equal_value_chunks_are_counted_once_as_flower_sends_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(messages, "MAX_CHUNK", 256)
    ledger = download.DownloadLedger(torch.full((4096,), 3, dtype=torch.int32), {1: 2})
    counts = download.changed_since(ledger)
    constant = billing.catch_up_bytes(ledger, 1, 4, torch.full((4096,), 2.0), False, counts)
    varied = billing.catch_up_bytes(ledger, 1, 4, torch.arange(4096, dtype=torch.float32), False, counts)
    assert constant is not None and varied is not None and constant < varied


def test_changed_since_counts_every_round() -> None:
    ledger = download.DownloadLedger(torch.tensor([0, 0, 1, 1, 1, 2, 4, 4, 4, 4], dtype=torch.int32))
    counts = download.changed_since(ledger)
    assert counts.tolist() == [10, 8, 5, 4, 4, 0]
    for since in range(6):
        assert counts[since] == int((ledger.changed_at >= since).sum())
    ledger = download.mark_synced(ledger, [7], 9)  # synced after the last change: nothing to send
    assert download.catch_up_count(ledger, 7, False, counts) == 0
    assert np.array_equal(download.catch_up_values(ledger, 7, torch.randn(10), False), np.zeros(0, np.float32))


def test_a_one_byte_mask_equal_to_the_encoding_byte_is_sent_once() -> None:
    changed_at = download.new_ledger(8).changed_at
    changed_at[0] = 2  # the packed mask is the byte 1, the same as enc = 1 (bitmap)
    ledger = download.DownloadLedger(changed_at, {1: 2})
    w = torch.randn(8)
    got = billing.catch_up_bytes(ledger, 1, 3, w, False, download.changed_since(ledger))
    assert got == _reference(ledger, 1, 3, w, False)
