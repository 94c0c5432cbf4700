"""What a client keeps (``fedsketch/client/state.py``): committed and pending state, and its file on disk.

A client's stored state is its committed arrays, its pending arrays (the state
its last upload leads to) and that upload's round. Settling commits the
pending arrays only when the server says it applied exactly that round;
otherwise the client keeps exactly what it had committed. On disk each client
is one ``.npz`` under ``<run dir>/client-state``, never unpickled.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from fedsketch.client import state as client_state
from fedsketch.client.state import DiskStates
from fedsketch.config import RunConfig
from fedsketch.server.runlog import run_dir


def same(a: client_state.State, b: client_state.State) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


BASE = {"error": torch.tensor([1.0, 2.0]), "momentum": torch.tensor([-1.0])}
NEW = {"error": torch.tensor([5.0, 6.0]), "momentum": torch.tensor([7.0])}


def test_stored_state_splits_into_committed_and_pending_of_its_round() -> None:
    stored = client_state.with_pending(BASE, NEW, 6)
    assert set(stored) == {"error", "momentum", "pending.error", "pending.momentum", "pending-round"}
    assert same(client_state.committed(stored), BASE)
    assert client_state.pending_round(stored) == 6
    assert same(client_state.pending(stored, 6), NEW)
    assert client_state.pending_round(BASE) is None and client_state.pending_round({}) is None
    assert same(client_state.committed(BASE), BASE)


def test_only_the_applied_round_commits_and_anything_else_keeps_exactly_what_was_committed() -> None:
    stored = client_state.with_pending(BASE, NEW, 6)
    assert same(client_state.settle(stored, 6), NEW)
    for told in (None, -1, 0, 5, 7):  # never applied, an earlier round, a later one: the upload of 6 was not
        assert same(client_state.settle(stored, told), BASE), told
    assert same(client_state.settle(BASE, None), BASE) and same(client_state.settle(BASE, 3), BASE)
    assert client_state.settle({}, None) == {}


def test_a_second_exchange_needs_the_state_pending_from_its_own_round() -> None:
    stored = client_state.with_pending(BASE, NEW, 6)
    with pytest.raises(ValueError) as err:
        client_state.pending(stored, 4)
    assert str(err.value) == "this client has no state pending from round 4"
    with pytest.raises(ValueError, match="no state pending from round 6"):
        client_state.pending(BASE, 6)


def test_client_states_live_under_the_run_folder_and_clearing_them_twice_is_fine(tmp_path: Path) -> None:
    cfg = RunConfig.from_mapping({"out-dir": str(tmp_path), "strategy": "local_topk"})
    root = client_state.state_root(cfg)
    assert root == run_dir(cfg) / "client-state"
    client_state.clear_states(cfg)  # nothing there yet
    DiskStates(root / "run-1").save(0, BASE)
    (run_dir(cfg) / "metrics.jsonl").write_text("{}\n")
    client_state.clear_states(cfg)
    client_state.clear_states(cfg)
    assert not root.exists() and (run_dir(cfg) / "metrics.jsonl").exists()


def test_a_state_is_saved_into_a_new_nested_folder_and_read_back_as_float32(tmp_path: Path) -> None:
    store = DiskStates(tmp_path / "a" / "b" / "run-1")
    store.save(12, {"error": torch.tensor([0.5, -2.0], dtype=torch.float64), "count": torch.tensor([3])})
    assert store.path(12) == tmp_path / "a" / "b" / "run-1" / "12.npz"
    loaded = store.load(12)
    assert set(loaded) == {"error", "count"}
    assert torch.equal(loaded["error"], torch.tensor([0.5, -2.0])) and loaded["count"].dtype == torch.float32
    assert store.load(13) == {}


def test_a_state_file_holding_a_pickled_object_is_refused_not_unpickled(tmp_path: Path) -> None:
    store = DiskStates(tmp_path)
    with open(store.path(5), "wb") as f:
        np.savez(f, allow_pickle=True, error=np.array([{"a": 1}], dtype=object))
    with pytest.raises(ValueError, match=r"client 5: its state file .*5\.npz is unreadable"):
        store.load(5)
