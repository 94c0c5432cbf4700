"""Flower's Ray backend over a Ray cluster of two nodes: the path of a run over several machines, on one.

Two ``ray start`` processes make the cluster, a head and a node that joins it
(``--address``), each on its own loopback address, with one CPU each (as many
as one simulated node's ClientApp worker asks for) and a custom resource that
names it. ``fedsketch run`` then runs with ``RAY_ADDRESS`` set, as a user does
on the head machine. Flower sizes its actor pool per Ray node (each node's CPUs
over ``num-cpus``: one actor on each here) and Ray places each actor where its
CPU is free, so both nodes hold an actor and take messages.

Ray rewrites ``127.0.0.1`` (and ``localhost``) given as a node's or the head's
address to the machine's network address (``resolve_ip_for_localhost`` in Ray
2.55), so the nodes use ``127.0.0.2`` and ``127.0.0.3``: still loopback, and
two distinct addresses as two machines would have. The test checks that every
TCP socket of the cluster and of the run stays on loopback.
"""

from __future__ import annotations

import importlib
import ipaddress
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from experiments.cli import main as fedsketch_main
from experiments.flower import procs
from experiments.flower.federation import cpus_per_node
from experiments.flower.flower_procs import free_port
from tests.bridge.runtime.test_simulation_backend import TINY
from tests.conftest import flower_pids

HEAD_IP, WORKER_IP = "127.0.0.2", "127.0.0.3"
CLUSTER_TAG = "FEDSKETCH_RAY_CLUSTER"
"""Every process of the cluster inherits this variable (with a fresh value): how it is found and stopped."""
SUPERNODES = 2
ACTOR_RUN = "ClientAppActor.run"
"""The Ray actor task of Flower 1.41's Ray backend that runs one message through the ClientApp."""
IP = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True)
class Cluster:
    """A running two-node Ray cluster: the head's GCS address, and the tag its processes carry."""

    address: str
    tag: str
    seen: procs.Seen

    def processes(self) -> list[int]:
        """Its live processes (those renamed by Ray found through their parents, and remembered)."""
        return procs.carrying(CLUSTER_TAG, self.tag, self.seen)


def _ray_start(args: list[str], log: Path, env: dict[str, str], timeout_s: float = 180.0) -> subprocess.Popen[bytes]:
    """``ray start ARGS --block`` until it says the node runs; ``--block`` keeps it the node's owner.

    Ray gives a raylet a fixed 30 s to register (``ray/_private/node.py``); on a loaded 2-core
    machine that can run out, so a node that timed out during start-up is started once more.

    Raises
    ------
    RuntimeError
        If it exits first or does not start within ``timeout_s``, twice for a start-up time-out.
    """
    for attempt in range(2):
        proc = _start_once(args, log, env, timeout_s)
        if proc is not None:
            return proc
        if attempt or b"timed out during startup" not in log.read_bytes():
            break
        log.rename(log.with_suffix(".first-try.log"))
    raise RuntimeError(f"ray start {' '.join(args)} did not start:\n{log.read_text(errors='replace')}")


def _start_once(args: list[str], log: Path, env: dict[str, str], timeout_s: float) -> subprocess.Popen[bytes] | None:
    ray = str(Path(sys.executable).parent / "ray")
    with open(log, "wb") as out:
        proc = subprocess.Popen([ray, "start", *args, "--block"], env=env, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout_s
    while b"Ray runtime started" not in log.read_bytes():
        if proc.poll() is not None or time.monotonic() > deadline:
            _stop(proc)
            return None
        time.sleep(0.2)
    return proc


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM a ``ray start --block`` (it stops its node's processes), SIGKILL after 20 s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@contextmanager
def two_node_cluster(cpus: int) -> Iterator[Cluster]:
    """A head on ``HEAD_IP`` and a node on ``WORKER_IP`` that joins it, ``cpus`` CPUs each, no dashboard, no GPU.

    On the way out both ``ray start`` processes are stopped, then whatever of
    the cluster is still running (by its tag, never by name: ``ray stop`` ends
    every Ray process on the machine, other users' too).
    """
    tag, port = uuid.uuid4().hex, free_port()
    env = {**os.environ, CLUSTER_TAG: tag, "RAY_USAGE_STATS_ENABLED": "0"}
    common = [
        "--num-cpus",
        str(cpus),
        "--num-gpus",
        "0",
        "--object-store-memory",
        str(100 * 1024 * 1024),
        "--disable-usage-stats",
    ]
    root = Path(tempfile.mkdtemp(prefix="fsray-"))  # short: Ray's socket paths live below it
    cluster, started = Cluster(f"{HEAD_IP}:{port}", tag, {}), []
    try:
        head = [
            "--head",
            "--node-ip-address",
            HEAD_IP,
            "--port",
            str(port),
            "--include-dashboard=false",
            "--dashboard-port",
            str(free_port()),
            "--ray-client-server-port",
            str(free_port()),
            "--temp-dir",
            str(root / "head"),
            "--resources",
            '{"fedsketch_head": 1}',
            "--dashboard-agent-listen-port",
            str(free_port()),
            *common,
        ]
        started.append(_ray_start(head, root / "head.log", env))
        worker = [
            "--address",
            cluster.address,
            "--node-ip-address",
            WORKER_IP,
            "--temp-dir",
            str(root / "worker"),
            "--resources",
            '{"fedsketch_worker": 1}',
            "--dashboard-agent-listen-port",
            str(free_port()),
            *common,
        ]
        started.append(_ray_start(worker, root / "worker.log", env))
        cluster.processes()  # remember them before any renames itself out of sight
        yield cluster
    finally:
        cluster.processes()
        for proc in reversed(started):  # the joining node first, as `ray stop` on each machine would
            _stop(proc)
        procs.stop_carrying(CLUSTER_TAG, tag, 10.0, seen=cluster.seen)
        subprocess.run(["rm", "-rf", str(root)], check=False)


@contextmanager
def gcs_channel(address: str) -> Iterator[Any]:
    """A gRPC channel to the cluster's GCS (what the Ray dashboard's state API reads; the dashboard is off)."""
    channel = importlib.import_module("grpc").insecure_channel(address)
    try:
        yield channel
    finally:
        channel.close()


def _generated(name: str) -> Any:
    """One of Ray's generated protobuf modules (they carry no type information)."""
    return importlib.import_module(f"ray.core.generated.{name}")


def alive_nodes(channel: Any) -> dict[str, tuple[str, str]]:
    """Node id -> (its address, its fedsketch_* custom resource), for every live node of the cluster."""
    service, messages = _generated("gcs_service_pb2_grpc"), _generated("gcs_service_pb2")
    alive_state = _generated("gcs_pb2").GcsNodeInfo.GcsNodeState.Value("ALIVE")
    reply = service.NodeInfoGcsServiceStub(channel).GetAllNodeInfo(messages.GetAllNodeInfoRequest(), timeout=30)
    alive = [n for n in reply.node_info_list if n.state == alive_state]
    return {
        n.node_id.hex(): (n.node_manager_address, next(r for r in n.resources_total if r.startswith("fedsketch_")))
        for n in alive
    }


def actor_runs_per_node(channel: Any) -> Counter[str]:
    """How many ClientApp messages each node ran: Ray's task events for ``ACTOR_RUN``, by the node that ran them."""
    service, messages = _generated("gcs_service_pb2_grpc"), _generated("gcs_service_pb2")
    reply = service.TaskInfoGcsServiceStub(channel).GetTaskEvents(messages.GetTaskEventsRequest(), timeout=30)
    events = [e for e in reply.events_by_task if e.task_info.name == ACTOR_RUN and e.state_updates.node_id]
    return Counter(e.state_updates.node_id.hex() for e in events)


def _ip(hex_address: str) -> IP:
    """An address of ``/proc/net/tcp{,6}`` (each 32-bit word in this machine's little-endian order)."""
    raw = bytes.fromhex(hex_address.split(":")[0])
    ip = ipaddress.ip_address(b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4)))
    return (ip.ipv4_mapped or ip) if isinstance(ip, ipaddress.IPv6Address) else ip


def tcp_addresses(pids: list[int]) -> set[IP]:
    """The local and remote addresses of every TCP socket that ``pids`` hold."""
    inodes = set()
    for pid in pids:
        try:
            links = [os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()]
        except OSError:  # gone meanwhile
            continue
        inodes |= {link[8:-1] for link in links if link.startswith("socket:[")}
    found: set[IP] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for row in Path(table).read_text().splitlines()[1:]:
            fields = row.split()
            if fields[9] in inodes:
                found |= {_ip(fields[1]), _ip(fields[2])}
    return found


def _run_watching_sockets(args: list[str], cluster: Cluster) -> tuple[int, set[IP], set[str]]:
    """``fedsketch`` with ``args``; the TCP addresses of the cluster's and the run's processes meanwhile, and the
    command lines of this test session's Ray services that are not the cluster's."""
    addresses: set[IP] = set()
    others: set[str] = set()
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            ours = cluster.processes()
            run = [pid for pid in flower_pids() if pid not in cluster.seen]
            addresses.update(tcp_addresses(ours + run))
            for pid in run:
                try:
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                except OSError:
                    continue
                if Path(cmd.split(" ", 1)[0]).name in {"gcs_server", "raylet"}:  # the program, not an argument:
                    others.add(cmd)  # a Ray worker names its raylet (--raylet-name=...) and is not a service
            time.sleep(0.5)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        code = fedsketch_main(args)
    finally:
        done.set()
        watcher.join()
    return code, addresses, others


def _metrics(folder: Path) -> list[dict[str, object]]:
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if k not in {"wall_s", "unix_time"}} for row in rows]


@pytest.mark.slow
def test_a_run_on_a_two_node_ray_cluster_uses_both_nodes_and_equals_the_in_process_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_leftover_processes: None
) -> None:
    common = ["--strategies", "fetchsgd", "--supernodes", str(SUPERNODES), "--gpus-per-node", "0", "--no-plot"]
    for pair in [*TINY, "experiment=tiny"]:
        common += ["--set", pair]
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert fedsketch_main(["run", "--out", str(tmp_path / "inprocess"), "--backend", "inprocess", *common]) == 0

    with two_node_cluster(cpus_per_node(SUPERNODES)) as cluster:
        with gcs_channel(cluster.address) as channel:
            nodes = alive_nodes(channel)
        assert sorted(nodes.values()) == [(HEAD_IP, "fedsketch_head"), (WORKER_IP, "fedsketch_worker")]
        monkeypatch.setenv("RAY_ADDRESS", cluster.address)  # no --backend: RAY_ADDRESS makes it Ray, as for a user
        code, addresses, others = _run_watching_sockets(["run", "--out", str(tmp_path / "cluster"), *common], cluster)
        assert code == 0
        with gcs_channel(cluster.address) as channel:
            runs = actor_runs_per_node(channel)
    assert not cluster.processes()  # the cluster is gone (the fixture checks this test's every process too)

    assert not others, f"the run started Ray services of its own instead of joining the cluster: {others}"
    # (a) ClientApp messages ran on both nodes: each node's actor took some
    ran_on = {nodes[node][1]: count for node, count in runs.items()}
    assert set(ran_on) == {"fedsketch_head", "fedsketch_worker"}, (ran_on, runs)
    # every TCP socket of the cluster and of the run was on loopback (and the scan did see the cluster's)
    assert {ipaddress.ip_address(HEAD_IP), ipaddress.ip_address(WORKER_IP)} <= addresses, addresses
    strays = {a for a in addresses if not (a.is_loopback or a.is_unspecified)}
    assert not strays, f"sockets off loopback: {strays}"

    # (b) the same metrics as the in-process backend's, every field but the timings
    inproc = _metrics(tmp_path / "inprocess" / "tiny" / "fetchsgd")
    on_cluster = _metrics(tmp_path / "cluster" / "tiny" / "fetchsgd")
    assert [r["round"] for r in inproc] == [1, 2, 3]
    assert on_cluster == inproc
    log = (tmp_path / "cluster" / "tiny" / "fetchsgd" / "flower.log").read_text(encoding="utf-8", errors="replace")
    assert "ClientApp calls run in the simulation process" not in log  # Flower's Ray backend ran them
