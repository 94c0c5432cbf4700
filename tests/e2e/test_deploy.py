"""Real Flower deployment on loopback: a SuperLink, SuperNodes, TLS and SuperNode auth.

Each SuperNode round costs about 10-30 s here (every message starts a fresh
ClientApp process that imports torch), so the runs are kept to 2-4 rounds.
"""

from __future__ import annotations

import json
import re
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from experiments.deployment.deploy import Deployment, LocalFederation, node_settings
from experiments.deployment.pki import make_node_keys
from experiments.flower import procs
from experiments.flower.flower_procs import signal_group, stop_group
from experiments.running import runner
from fedsketch.config import RunConfig

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow

TINY = {"eval-every": 1, "local-batch-size": 64, "sketch-rows": 5, "sketch-cols": 2000, "k": 500, "lr": 0.2}


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]


def _processes_in(folder: Path) -> list[int]:
    """Live processes whose environment points into ``folder``: every Flower process started there."""
    needle = str(folder).encode()
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if needle in (entry / "environ").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def test_supernode_with_an_unregistered_key_is_refused(tmp_path: Path, no_leftover_processes: None) -> None:
    with LocalFederation(Deployment(1, tls=True, auth=True), tmp_path / "fed") as fed:
        registered = fed.wait_online(1)
        intruder = make_node_keys(tmp_path / "intruder", "intruder")
        proc = fed.start_supernode(1, key=intruder.private)
        assert proc.wait(timeout=60) != 0  # Flower gives up with its exit code 305 (status 1): not activated
        assert fed.online_nodes() == registered
    assert "No SuperNode found with the given public key" in fed.log("superlink").read_text()
    device = fed.log("supernode-1").read_text()
    assert "Failed to activate SuperNode" in device and "launcher ready" not in device
    # the device side is told where the reason is, and the likely fix
    assert f"Flower's exit code 305: the SuperLink at {fed.address} refused this SuperNode" in device
    assert "'No SuperNode found with the given public key': register this device's public key" in device
    assert not _processes_in(tmp_path)


def _kill_supernode(fed: LocalFederation, partition_id: int) -> None:
    """SIGKILL a SuperNode and its ClientApps, as a device that loses power would stop."""
    proc = fed.procs.pop(f"supernode-{partition_id}")
    signal_group(proc, signal.SIGKILL)  # no goodbye to the SuperLink
    proc.wait()
    procs.stop_carrying("FLWR_HOME", str(fed.work_dir / "nodes" / f"node-{partition_id}"), 5.0)


def test_a_supernode_killed_mid_round_is_tolerated_and_takes_part_again_after_restart(
    tmp_path: Path, no_leftover_processes: None
) -> None:
    """Round 2 completes without the node that died holding its message; the node comes back later.

    Flower 1.41 and 1.42 keep a node that died without saying goodbye "online" until its
    heartbeat lapses (up to 2 x 30 s) and refuses to activate it again before
    that: the restarted ``flower-supernode`` gives up (Flower's exit code 305). A supervisor
    restarts it, as the systemd unit of the deployment kit does (``Restart=always``).
    While its old self has lapsed and its new self is not yet activated, only two
    nodes are connected: ``min-nodes`` = 3 makes the next round wait (up to the
    round timeout) for the node to be back rather than race it.
    """
    values = {
        **node_settings(3),
        **TINY,
        "num-rounds": 5,
        "experiment": "flaky",
        "out-dir": str(tmp_path / "runs"),
        "min-nodes": 3,
        "min-replies": 2,
        "round-timeout": 40.0,
        # each client trains long enough (well over the 0.05 s between looks) to be killed before it replies
        "client-update": "delta",
        "local-steps": 100,
    }
    run_dir = runner.prepare(RunConfig.from_mapping(values))
    with LocalFederation(Deployment(3, tls=True, auth=True), tmp_path / "fed") as fed:
        node_ids = fed.wait_online(3)
        starts: list[float] = []

        def chaos() -> None:  # called every 0.05 s while the run goes on
            if not starts and fed.log("supernode-2").read_text().count("Received successfully") == 2:
                _kill_supernode(fed, 2)  # it holds round 2's message: that reply never comes
                starts.append(time.monotonic())
                fed.start_supernode(2)  # same key, so the same node id
            elif starts and fed.procs["supernode-2"].poll() is not None and time.monotonic() - starts[-1] > 3.0:
                starts.append(time.monotonic())  # refused while its old self still counts as online: retry
                fed.start_supernode(2)

        code = fed.run(ROOT, run_dir / "run_config.toml", run_dir / "flower.log", poll=chaos, poll_s=0.05)
        assert starts, "SuperNode 2 never received round 2's message"
        assert fed.online_nodes() == node_ids
    assert code == 0, (run_dir / "flower.log").read_text()[-3000:]
    rows = _rows(run_dir)
    assert [r["round"] for r in rows] == [1, 2, 3, 4, 5]
    assert [rows[0]["clients"], rows[1]["clients"]] == [3, 2]
    # back in a later round (under load its first round back may still time out)
    assert max(r["clients"] for r in rows[2:]) == 3
    assert rows[-1]["test_loss"] < rows[0]["test_loss"]
    assert not _processes_in(tmp_path)


def test_a_supernode_stopped_mid_round_is_counted_at_once_as_its_clients_error(
    tmp_path: Path, no_leftover_processes: None
) -> None:
    """Ctrl-C or ``systemctl stop`` on a device that holds a round's message: the round goes on without waiting.

    The SuperNode says goodbye (SIGTERM), and the SuperLink answers the round's
    request to it with an error of its own, whose source is the SuperLink
    (node 1), not the node. The reply is matched to the node by the request it
    answers: the node's client counts as a client error, not a time-out, and the
    round ends long before ``round-timeout``. The devices run under the launcher,
    the deployment's default, whose own SIGTERM follows the group's; each client
    trains long enough to be stopped between receiving the message and replying.
    """
    values = {
        **node_settings(2),
        **TINY,
        "num-rounds": 3,
        "experiment": "leave",
        "out-dir": str(tmp_path / "runs"),
        "min-nodes": 1,
        "min-replies": 1,
        "round-timeout": 300.0,
        "client-update": "delta",
        "local-steps": 100,
    }
    run_dir = runner.prepare(RunConfig.from_mapping(values))
    with LocalFederation(Deployment(2), tmp_path / "fed") as fed:
        fed.wait_online(2)
        stopped: list[float] = []

        def leave() -> None:  # called every 0.05 s while the run goes on
            if not stopped and fed.log("supernode-1").read_text().count("Received successfully") == 2:
                stop_group(fed.procs.pop("supernode-1"))  # SIGTERM: as Ctrl-C or systemctl stop
                stopped.append(time.time())

        code = fed.run(ROOT, run_dir / "run_config.toml", run_dir / "flower.log", poll=leave, poll_s=0.05)
        node = int(re.findall(r"SuperNode ID: (\d+)", fed.log("supernode-1").read_text())[0])
    assert code == 0, (run_dir / "flower.log").read_text()[-3000:]
    assert stopped, "SuperNode 1 never received round 2's message"
    rows = _rows(run_dir)
    counts = [(r["round"], r["clients"], r["client_errors"], r["timeouts"]) for r in rows]
    assert counts == [(1, 2, 0, 0), (2, 1, 1, 0), (3, 1, 0, 0)]
    rounds = [json.loads(line) for line in (run_dir / "rounds.jsonl").read_text().splitlines()]
    print(f"round 2 ended {rounds[1]['unix_time'] - stopped[0]:.1f} s after the node was stopped")
    assert rounds[1]["unix_time"] - stopped[0] < 30.0  # not the 300 s round-timeout
    log = (run_dir / "flower.log").read_text()
    assert f"node {node} error: " in log and "not asked" not in log
    assert not _processes_in(tmp_path)
