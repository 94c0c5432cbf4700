"""Client state on disk: the same run as in memory, one file per client, unreadable files fail alone."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from bridge.flower import task_identity
from tests.federation import TestGrid
from fedsketch.client.state import DiskStates, clear_states, state_root
from fedsketch.config import ConfigError, RunConfig, check_against_model
from strategies.server_app import build_strategy

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
