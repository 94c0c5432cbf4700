"""A deployment that survives what an operator meets: a device lost for good, a launcher killed alone.

Real SuperLink and SuperNode processes on loopback, each SuperNode under the ClientApp launcher, a
tiny FetchSGD job (Rothchild et al., ICML 2020). The timings printed are what docs/deployment.md's
"What survives what" reports.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from experiments.deployment.deploy import Deployment, LocalFederation, node_settings
from experiments.flower import procs
from experiments.running import runner
from fedsketch.config import RunConfig

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow
TINY = {"eval-every": 1, "local-batch-size": 64, "sketch-rows": 5, "sketch-cols": 2000, "k": 500, "lr": 0.2}


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _device(home: Path) -> list[int]:
    """The processes of one device: all that carry its FLWR_HOME (the launcher, its SuperNode and tasks)."""
    return procs.processes_with_env("FLWR_HOME", str(home))


def _power_off(home: Path) -> None:
    """SIGKILL a device's processes, its launcher last: as a device that loses power, no goodbye."""
    pids = _device(home)
    launcher = [pid for pid in pids if procs.parent(pid) not in pids]  # the one the others descend from
    for pid in [*(p for p in pids if p not in launcher), *launcher]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_a_device_lost_for_good_in_round_3_of_6_leaves_a_quorum_that_finishes_the_run(
    tmp_path: Path, no_leftover_processes: None
) -> None:
    """`fedsketch deploy`'s defaults: 4 SuperNodes, a quorum of 3; one dies for good while it holds round 3."""
    args = [sys.executable, "-m", "experiments.cli", "deploy", "--out", str(tmp_path), "--supernodes", "4"]
    args += ["--strategies", "fetchsgd", "--no-plot"]
    for key, value in {**TINY, "num-rounds": 6, "experiment": "lost", "round-timeout": 90}.items():
        args += ["--set", f"{key}={value}"]
    fed, run = tmp_path / "lost" / "deployment", tmp_path / "lost" / "fetchsgd"
    log = tmp_path / "deploy.log"
    with open(log, "wb") as out:
        cli = subprocess.Popen(args, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    killed = 0.0
    try:
        device_log = fed / "logs" / "supernode-3.log"
        while cli.poll() is None:
            if (
                not killed
                and device_log.exists()
                and device_log.read_text(errors="replace").count("Received succ") == 3
            ):
                _power_off(fed / "nodes" / "node-3")
                killed = time.time()
            time.sleep(0.05)
    finally:
        if cli.poll() is None:
            os.killpg(cli.pid, signal.SIGINT)
        cli.wait(timeout=60)
    console = log.read_text(errors="replace")
    assert cli.returncode == 0, console[-3000:]
    assert killed, "SuperNode 3 never received round 3's message"
    rounds = _lines(run / "rounds.jsonl")
    for r in rounds:
        waited = r["unix_time"] - killed
        print(
            f"round {r['round']}: missing {r['missing_nodes']}, sampled {r['sampled']}, clients {r['clients']}, "
            f"timeouts {r['timeouts']}, client errors {r['client_errors']}, applied {r['applied']}, "
            f"ended {waited:+.1f} s after the kill {r.get('first_failure', '')[:160]}"
        )
    assert [r["round"] for r in rounds] == [1, 2, 3, 4, 5, 6] and all(r["applied"] for r in rounds)
    assert [r["clients"] for r in rounds[:2]] == [4, 4] and rounds[2]["clients"] == 3
    assert rounds[2]["timeouts"] + rounds[2]["client_errors"] == 1  # the node that died holding round 3's message
    # once the SuperLink has dropped it (its heartbeat lapsed), a round samples the 3 left and counts it missing
    assert rounds[-1]["missing_nodes"] == 1 and rounds[-1]["sampled"] == 3 and rounds[-1]["clients"] == 3
    assert [r["round"] for r in _lines(run / "metrics.jsonl")] == [1, 2, 3, 4, 5, 6]
    assert "checkpoint-every=5" in console and "min-nodes=3" in console


def test_a_launcher_killed_alone_takes_its_supernode_along_and_no_round_waits_for_it(
    tmp_path: Path, no_leftover_processes: None
) -> None:
    """The out-of-memory killer picks the launcher: its SuperNode says goodbye and the next round goes on at once."""
    values = {
        **node_settings(2),
        **TINY,
        "num-rounds": 4,
        "experiment": "orphan",
        "out-dir": str(tmp_path / "runs"),
        "min-nodes": 1,
        "round-timeout": 60.0,
    }
    run_dir = runner.prepare(RunConfig.from_mapping(values))
    with LocalFederation(Deployment(2), tmp_path / "fed") as fed:
        fed.wait_online(2)
        home, launcher = tmp_path / "fed" / "nodes" / "node-1", fed.procs["supernode-1"]
        seen: dict[str, float] = {}

        def kill_launcher() -> None:  # called every 0.05 s while the run goes on
            if "killed" not in seen and fed.log("supernode-1").read_text().count("Received successfully") == 2:
                os.kill(launcher.pid, signal.SIGKILL)  # the launcher alone, not its process group
                seen["killed"] = time.time()
            elif "killed" in seen and "gone" not in seen and not [p for p in _device(home) if p != launcher.pid]:
                seen["gone"] = time.time()

        code = fed.run(ROOT, run_dir / "run_config.toml", run_dir / "flower.log", poll=kill_launcher, poll_s=0.05)
        launcher.wait(timeout=10)
    assert code == 0, (run_dir / "flower.log").read_text()[-3000:]
    assert "killed" in seen, "SuperNode 1 never received round 2's message"
    gone = seen.get("gone", float("inf")) - seen["killed"]
    rounds = _lines(run_dir / "rounds.jsonl")
    after = [(r["round"], round(r["unix_time"] - seen["killed"], 1), r["clients"]) for r in rounds]
    print(
        f"device's processes gone {gone:.2f} s after its launcher's SIGKILL; rounds (round, s after, clients): {after}"
    )
    assert gone <= 5.0, f"the device's processes outlived their launcher by {gone:.1f} s"
    assert [r["round"] for r in rounds] == [1, 2, 3, 4]
    assert rounds[-1]["clients"] == 1 and rounds[-1]["timeouts"] == 0
    assert rounds[-1]["unix_time"] - seen["killed"] < 30.0  # no round waited for the 60 s round-timeout
