"""End to end through real Flower simulation: `fedsketch run` and `flwr run .`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from bridge.messages import client_metrics, payload_to_record, wire_bytes
from experiments.cli import main as fedsketch_main
from experiments.flower import procs
from experiments.flower.flower_procs import free_port
from fedsketch.server import runlog

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow

TINY = [
    "num-clients=20",
    "clients-per-round=10",
    "num-rounds=3",
    "eval-every=1",
    "sketch-rows=3",
    "sketch-cols=5000",
    "k=2000",
    "lr=0.5",
    'lr-schedule="constant"',
]


def _rows(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]


def test_fedsketch_run_trains_fetchsgd_and_fedavg_and_counts_serialized_bytes(
    tmp_path: Path, no_leftover_processes: None
) -> None:
    args = ["run", "--out", str(tmp_path), "--strategies", "fetchsgd,fedavg"]
    for pair in [*TINY, "experiment=tiny"]:
        args += ["--set", pair]
    assert fedsketch_main(args) == 0
    fetch, dense = (
        _rows(tmp_path / "tiny" / "fetchsgd"),
        _rows(tmp_path / "tiny" / "fedavg"),
    )
    assert [r["round"] for r in fetch] == [1, 2, 3]
    # Each ServerApp marked its run done; the launcher then stopped Flower without waiting for its teardown.
    assert all(runlog.server_done(tmp_path / "tiny" / name) for name in ("fetchsgd", "fedavg"))
    assert fetch[-1]["test_loss"] < fetch[0]["test_loss"]
    assert fetch[-1]["test_accuracy"] > max(0.3, fetch[0]["test_accuracy"] + 0.1)  # chance: about 0.1
    # Bytes: every client's reply is a (3, 5000) float32 table plus a metrics record of a few
    # dozen bytes whose exact size depends on its values (protobuf varints).
    table = wire_bytes(payload_to_record({"table": np.zeros((3, 5000), np.float32)}))
    metrics = wire_bytes(client_metrics(64, 0.5, 0.1))
    assert table >= 128 + 4 * 3 * 5000  # at least the .npy bytes of the table
    assert fetch[-1]["clients"] * 3 == sum(r["clients"] for r in fetch) == 30
    assert 30 * table < fetch[-1]["cum_upload_bytes"] <= 30 * (table + 2 * metrics)
    d = dense[-1]["cum_dense_upload_bytes"] // 30
    assert 30 * d < dense[-1]["cum_upload_bytes"] <= 30 * (d + 2 * metrics)
    # Downloads: the same model to the same 30 clients; FetchSGD's round config also names the
    # sketch's seed and shape (a few dozen bytes a client).
    assert 30 * 4 * 290_000 < dense[-1]["cum_download_bytes"] < fetch[-1]["cum_download_bytes"]
    assert fetch[-1]["cum_download_bytes"] - dense[-1]["cum_download_bytes"] <= 30 * 100
    assert (tmp_path / "tiny" / "accuracy_vs_upload_bytes.png").stat().st_size > 0


def test_flwr_run_from_the_project_folder_leaves_no_process(tmp_path: Path, no_leftover_processes: None) -> None:
    """`flwr run .` with a private FLWR_HOME runs the app's defaults (shortened here)."""
    port, control = free_port(), free_port()
    bin_dir = str(Path(sys.executable).parent)  # flwr starts the SuperLink and SuperExec by name
    env = dict(
        os.environ,
        PATH=os.pathsep.join([bin_dir, os.environ.get("PATH", "")]),
        FLWR_HOME=str(tmp_path / "home"),
        FLWR_TELEMETRY_ENABLED="0",
        FLWR_DISABLE_UPDATE_CHECK="1",
        FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1",
        FLWR_LOCAL_SUPERLINK_HTTP_API_PORT=str(port),
        FLWR_LOCAL_CONTROL_API_PORT=str(control),
    )
    out = tmp_path / "out"
    overrides = " ".join([*TINY, f'out-dir="{out}"'])
    flwr = str(Path(sys.executable).parent / "flwr")
    try:
        done = subprocess.run(
            [flwr, "run", ".", "--stream", "--run-config", overrides],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=420,
            check=False,
        )
    finally:
        _stop_local_superlink(port, tmp_path / "home")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = _rows(out / "default" / "fetchsgd")
    assert [r["round"] for r in rows] == [1, 2, 3]


def _stop_group(pid: int, grace_s: float = 5.0) -> None:
    """SIGTERM, then SIGKILL, a process group this test did not start (the SuperLink `flwr run` detached)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)


def _stop_local_superlink(port: int, flwr_home: Path) -> None:
    """The detached SuperLink `flwr run` started for this test, and everything it started."""
    found = subprocess.run(
        ["pgrep", "-f", f"flower-superlink.*--port {port}"],
        check=False,
        capture_output=True,
        text=True,
    )
    for pid in found.stdout.split():
        _stop_group(int(pid))
    procs.stop_carrying("FLWR_HOME", str(flwr_home), 5.0)
