"""What a client keeps (``fedsketch/client/state.py``): in memory and on disk, committed and pending.

On disk, a run is the same as in memory, one file per client, and unreadable
files fail alone. A client's stored state is its committed arrays, its pending
arrays (the state its last upload leads to) and that upload's round. Settling
commits the pending arrays only when the server says it applied exactly that
round; otherwise the client keeps exactly what it had committed. On disk each
client is one ``.npz`` under ``<run dir>/client-state``, never unpickled.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from bridge.flower import task_identity
from fedsketch.client import state as client_state
from fedsketch.client.state import DiskStates, clear_states, state_root
from fedsketch.config import ConfigError, RunConfig
from fedsketch.fit import check_against_model
from fedsketch.server.runlog import run_dir
from strategies.server_app import build_strategy
from tests.federation import TestGrid

SETTINGS = {
    "strategy": "local_topk",
    "num-clients": 10,
    "clients-per-round": 4,
    "model-hidden": 16,
    "k": 300,
    "num-rounds": 5,
    "eval-every": 1,
}
FLOWER_RUN_ID = 1  # the run id InProcessGrid's contexts carry


def run(out: Path, settings: dict[str, Any]) -> tuple[list[dict[str, Any]], torch.Tensor, TestGrid]:
    cfg = RunConfig.from_mapping({**SETTINGS, **settings, "out-dir": str(out)})
    strat = build_strategy(cfg, out / "metrics")
    grid = TestGrid(cfg.to_mapping(), num_nodes=2)
    with task_identity():
        strat.start(grid)
    rows = [json.loads(line) for line in (out / "metrics" / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in ("wall_s", "unix_time")} for r in rows], strat.weights, grid


def test_disk_states_round_trip_and_replace_atomically(tmp_path: Path) -> None:
    store = DiskStates(tmp_path / "s")
    assert store.load(3) == {}
    store.save(3, {"error": torch.arange(5, dtype=torch.float32)})
    store.save(3, {"error": torch.full((5,), 2.0), "momentum": torch.ones(5)})
    loaded = store.load(3)
    assert set(loaded) == {"error", "momentum"} and torch.equal(loaded["error"], torch.full((5,), 2.0))
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == ["3.npz"]  # no temporary file left


def test_an_unreadable_state_file_is_named(tmp_path: Path) -> None:
    store = DiskStates(tmp_path)
    store.path(7).write_bytes(b"not a zip file")
    with pytest.raises(ValueError, match=r"client 7: its state file .*7\.npz is unreadable"):
        store.load(7)


def test_a_run_with_state_on_disk_equals_one_with_state_in_memory(tmp_path: Path) -> None:
    memory_rows, memory_w, _ = run(tmp_path / "memory", {})
    disk_rows, disk_w, grid = run(tmp_path / "disk", {"client-state": "disk"})
    assert disk_rows == memory_rows
    assert torch.equal(disk_w, memory_w)
    cfg = RunConfig.from_mapping({**SETTINGS, "client-state": "disk", "out-dir": str(tmp_path / "disk")})
    files = sorted((state_root(cfg) / f"run-{FLOWER_RUN_ID}").glob("*.npz"))
    assert 4 <= len(files) <= 10  # one per client that took part
    assert all(not ctx.state.array_records for ctx in grid.contexts.values())  # nothing kept in memory
    clear_states(cfg)
    assert not state_root(cfg).exists()


def test_a_client_whose_state_cannot_be_read_fails_alone(tmp_path: Path) -> None:
    settings = {"client-state": "disk", "num-rounds": 2, "clients-per-round": 10}
    cfg = RunConfig.from_mapping({**SETTINGS, **settings, "out-dir": str(tmp_path)})
    torn = DiskStates(state_root(cfg) / f"run-{FLOWER_RUN_ID}").path(4)
    torn.parent.mkdir(parents=True)
    torn.write_bytes(b"torn")
    rows, _, _ = run(tmp_path, settings)
    assert [(r["clients"], r["client_errors"]) for r in rows] == [(9, 1), (9, 1)]  # client 4, both rounds


def test_disk_state_is_checked_against_free_disk_not_memory(tmp_path: Path) -> None:
    small = RunConfig.from_mapping(
        {**SETTINGS, "client-state": "disk", "max-client-state-mb": 1, "out-dir": str(tmp_path)}
    )
    check_against_model(small, d=1000)  # 10 clients x 4 kB: the 1 MB memory bound does not apply on disk
    with pytest.raises(ConfigError, match="'max-client-state-mb'"):
        check_against_model(RunConfig.from_mapping({**SETTINGS, "max-client-state-mb": 1}), d=100_000)
    huge = RunConfig.from_mapping(
        {**SETTINGS, "client-state": "disk", "num-clients": 10**9, "out-dir": str(tmp_path / "x")}
    )
    with pytest.raises(ConfigError, match=r"GiB free under .*\(setting 'client-state' = 'disk'\)"):
        check_against_model(huge, d=1_000_000)


# committed and pending state, and the file on disk ----------------------------------------------------------


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
