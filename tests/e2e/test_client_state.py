"""Through a real Flower simulation: a client whose uploads the server rejects keeps no trace of them.

Client 0's training data are NaN, so every update it uploads is non-finite and
the server rejects it, every round. Its error memory (local top-k, kept on disk,
one file per client, which this test reads while the run goes on: the run
deletes them when it ends) must never commit what it sent: its file holds the
last upload's state as pending, never a committed one. The other clients'
uploads are applied, and their memories are committed.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from experiments.cli import main as fedsketch_main
from fedsketch.client.state import DiskStates, State, committed, pending_round

pytestmark = pytest.mark.slow

CLIENTS, ROUNDS = 6, 10  # rounds of about 20 ms here: enough of them for the watcher to see several


def _watch(folder: Path, seen: dict[int, list[State]], stop: threading.Event) -> None:
    """Every new version of each client's state file (written by rename: always whole)."""
    versions: dict[int, int] = {}
    while not stop.wait(0.005):  # a round takes about 20 ms once the simulation runs
        try:
            files = list(folder.rglob("*.npz")) if folder.is_dir() else []  # one folder per Flower run
        except OSError:  # a run's folder removed while walked (its clean-up at the end): look again
            continue
        for file in files:
            try:
                cid, version = int(file.stem), file.stat().st_mtime_ns
                if versions.get(cid) != version:
                    seen.setdefault(cid, []).append(DiskStates(file.parent).load(cid))
                    versions[cid] = version
            except (OSError, ValueError):
                continue  # replaced or deleted while read: the next look gets it


def _data(path: Path) -> Path:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(CLIENTS * 40, 20)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    owner = np.repeat(np.arange(CLIENTS), 40)
    x[owner == 0] = 3e38  # finite, so the data checks pass; its forward pass overflows: client 0's uploads are NaN
    np.savez(path, x_train=x, y_train=y, x_test=x[owner != 0][:50], y_test=y[owner != 0][:50], client_ids=owner)
    return path


def test_rejected_uploads_never_commit_the_clients_error_memory(tmp_path: Path, no_leftover_processes: None) -> None:
    settings = {
        "experiment": "rejected",
        "dataset": "npz",
        "data-root": str(_data(tmp_path / "data.npz")),
        "partition": "natural",
        "model": "mlp",
        "model-hidden": 16,
        "num-clients": CLIENTS,
        "clients-per-round": CLIENTS,
        "num-rounds": ROUNDS,
        "eval-every": 1,
        "k": 50,
        "min-replies": 1,
        "client-state": "disk",
    }
    args = ["run", "--out", str(tmp_path), "--strategies", "local_topk", "--no-plot"]
    for key, value in settings.items():
        args += ["--set", f"{key}={json.dumps(value)}"]
    run = tmp_path / "rejected" / "local_topk"
    seen: dict[int, list[State]] = {}
    stop = threading.Event()
    watcher = threading.Thread(target=_watch, args=(run / "client-state", seen, stop), daemon=True)
    watcher.start()
    try:
        assert fedsketch_main(args) == 0
    finally:
        stop.set()
        watcher.join()
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == list(range(1, ROUNDS + 1))
    assert all(r["clients"] == CLIENTS - 1 and r["rejected"] + r["client_errors"] == 1 for r in rows)
    # client 0 went on uploading, and keeping its upload pending, round after round
    assert len({pending_round(s) for s in seen.get(0, [])}) >= 2
    assert all(pending_round(s) is not None and not committed(s) for s in seen[0])
    for cid in range(1, CLIENTS):
        kept = [committed(s) for s in seen.get(cid, []) if committed(s)]
        assert kept, f"client {cid} never committed its error memory"
        assert all(torch.isfinite(t).all() for state in kept for t in state.values())
