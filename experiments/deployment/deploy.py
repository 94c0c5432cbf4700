"""fedsketch on Flower's deployment runtime, on this machine: a SuperLink and N SuperNodes.

Simulation (:mod:`experiments.flower.launch`) runs every client inside the SuperLink's
process tree. A real federation runs one SuperLink on a server and one
``flower-supernode`` per device, each told which data is its own with
``--node-config "partition-id=I num-partitions=N"``; the ServerApp then runs in
``client-assignment = "node"`` mode, one client per SuperNode.

:class:`LocalFederation` starts such a federation on 127.0.0.1, with optional
TLS and SuperNode authentication (certificates and keys from
:mod:`experiments.deployment.pki`), the SuperLink's state in a database file (a
SuperLink killed and started again knows every node), runs fedsketch on it with ``flwr run``, and stops every
process it started together with everything those spawned, found by a variable
in their environment (the SuperLink detaches its ``flower-superexec`` into a
session of its own, out of reach of a process group). The commands
(:mod:`experiments.deployment.deploy_commands`) are the ones :mod:`experiments.deployment.recipe`
prints for real devices.

Each SuperNode runs under :mod:`bridge.runtime.launcher` (``isolation = "launcher"``):
one process that has imported torch and Flower forks a child per message,
instead of Flower's default of a fresh ``flwr-clientapp`` process per message
(``isolation = "subprocess"``); ``experiments/bench/bench_device.py`` compares them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from experiments.deployment.deploy_commands import (
    CONNECTION,
    DATABASE,
    Deployment,
    connection_toml,
    node_settings,
    superlink_command,
    supernode_command,
)
from experiments.deployment.pki import NodeKeys, ServerCertificates, make_certificates, make_node_keys
from experiments.flower import procs
from experiments.flower.app_files import staged_app
from experiments.flower.flower_procs import (
    bin_path,
    flower_env,
    free_port,
    program,
    signal_group,
    stop_group,
    wait_healthy_tls,
)

if TYPE_CHECKING:
    from fedsketch.config import RunConfig

TAG = "FEDSKETCH_FEDERATION"  # in the environment of every process of one LocalFederation
__all__ = ["TAG", "Deployment", "LocalFederation", "node_settings", "run_all"]  # what a run on a LocalFederation needs


class LocalFederation:
    """A SuperLink and ``num_supernodes`` SuperNodes on 127.0.0.1, files under ``work_dir``.

    A context manager: entering starts the SuperLink, makes certificates and keys
    as the deployment asks, registers the keys, starts the SuperNodes and waits
    until all are online; leaving stops every process started here.
    """

    def __init__(self, deployment: Deployment, work_dir: Path, device_bin: Path | None = None) -> None:
        self.deployment = deployment
        self.device_bin = device_bin  # the devices' environment (its bin/), if not this one
        self.work_dir = work_dir
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.env = self._env(work_dir / "flwr-home")
        self.database = work_dir / DATABASE  # the SuperLink's state: a restarted SuperLink knows every node
        self.certs: ServerCertificates | None = None
        self.keys: dict[int, NodeKeys] = {}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def __enter__(self) -> Self:
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def log(self, name: str) -> Path:
        """The log file of process ``name`` (``superlink``, ``supernode-0``, ...)."""
        return self.work_dir / "logs" / f"{name}.log"

    # ------------------------------------------------------------- nodes
    def start_supernode(self, partition_id: int, key: Path | None = None) -> subprocess.Popen[bytes]:
        """Start the SuperNode of ``partition_id`` (again, after :meth:`kill_supernode`).

        With authentication its key pair is made and registered the first time;
        ``key`` instead uses that private key as it is, registered or not.
        """
        n = self.deployment.num_supernodes
        if key is None and self.deployment.auth:
            self.register([partition_id])
            key = self.keys[partition_id].private
        ca = self.certs.ca_cert if self.certs is not None else None
        dep = self.deployment
        cmd = supernode_command(self.address, free_port(), partition_id, n, ca, key, dep.isolation, dep.supernode_waits)
        # Each SuperNode gets its own FLWR_HOME, as it would on its own device.
        env = self._env(self.work_dir / "nodes" / f"node-{partition_id}")
        if self.device_bin is not None:
            env["PATH"] = os.pathsep.join([str(self.device_bin), env["PATH"]])
            cmd = [str(self.device_bin / cmd[0]), *cmd[1:]]
        return self._spawn(f"supernode-{partition_id}", cmd, env)

    def register(self, partition_ids: list[int]) -> None:
        """Make and register key pairs for SuperNodes that have none yet.

        The ``flwr supernode register`` calls run side by side: each takes seconds.

        Raises
        ------
        RuntimeError
            If a registration fails.
        """
        new = [i for i in partition_ids if i not in self.keys]
        keys = {i: make_node_keys(self.work_dir / "keys", f"node-{i}") for i in new}
        calls = {i: self._flwr_call("supernode", "register", str(k.public), CONNECTION) for i, k in keys.items()}
        for i, call in calls.items():
            out, err = call.communicate(timeout=120)
            if call.returncode != 0:
                raise RuntimeError(f"flwr supernode register {keys[i].public} failed ({call.returncode}): {out}{err}")
            self.keys[i] = keys[i]

    def restart_supernodes(self) -> None:
        """Stop every SuperNode, wait until the SuperLink has dropped them, start them again and wait for them.

        Flower's SuperNode (1.41, 1.42), once it has pulled a message, waits for the
        reply before it pulls again, with no timeout (``_push_messages``): one
        that pulled a message of a run stopped mid-round never serves another.
        """
        ids = [int(name.removeprefix("supernode-")) for name in self.procs if name.startswith("supernode-")]
        old = set(self.online_nodes())
        for i in ids:
            stop_group(self.procs.pop(f"supernode-{i}"))
            procs.stop_carrying("FLWR_HOME", str(self.work_dir / "nodes" / f"node-{i}"), 5.0)
        # Until the SuperLink drops them (their heartbeat lapses: up to 2 x 30 s), the old nodes would be
        # sampled and never answer, and an authenticated key could not be activated again.
        deadline = time.monotonic() + 120.0
        while old & set(self.online_nodes()) and time.monotonic() < deadline:
            time.sleep(1.0)
        for i in ids:
            self.start_supernode(i)
        self.wait_online(len(ids))

    def online_nodes(self) -> list[int]:
        """Ids of the SuperNodes the SuperLink reports online (asked up to three times, 1 s and 2 s apart).

        Raises
        ------
        RuntimeError
            If the SuperLink does not answer the third query either.
        """
        for wait_s in (1.0, 2.0):  # a query can fail on a busy machine: ask again
            try:
                return self._online_nodes()
            except RuntimeError:
                time.sleep(wait_s)
        return self._online_nodes()

    def _online_nodes(self) -> list[int]:
        nodes = self.flwr_json("supernode", "list")["nodes"]
        return sorted(int(n["node-id"]) for n in nodes if n["status"] == "online")

    def wait_online(self, count: int, timeout: float = 90.0) -> list[int]:
        """Wait until ``count`` SuperNodes are online.

        Raises
        ------
        RuntimeError
            If a SuperNode exits, or ``count`` are not online within ``timeout`` s.
        """
        deadline, nodes, error = time.monotonic() + timeout, [], ""
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited with code {proc.returncode}; see {self.log(name)}")
            try:
                nodes = self.online_nodes()
            except RuntimeError as exc:  # a query may fail while nodes register: ask again
                error = f" (last query: {exc})"
            if len(nodes) >= count:
                return nodes
            time.sleep(1.0)
        raise RuntimeError(
            f"{len(nodes)} of {count} SuperNodes online after {timeout:.0f} s{error}; logs in {self.work_dir / 'logs'}"
        )

    # --------------------------------------------------------------- runs
    def flwr(self, *args: str) -> str:
        """Run one ``flwr`` command against this SuperLink; returns its output.

        Raises
        ------
        RuntimeError
            If the command fails.
        """
        call = self._flwr_call(*args)
        out, err = call.communicate(timeout=120)
        if call.returncode != 0:
            raise RuntimeError(f"flwr {' '.join(args)} failed ({call.returncode}): {out}{err}")
        return out

    def flwr_json(self, *args: str) -> dict[str, Any]:
        """``flwr ARGS --format json``'s reply; a RuntimeError if it fails or says it failed (in the JSON, exit 0)."""
        out = self.flwr(*args, CONNECTION, "--format", "json")
        reply: dict[str, Any] = json.loads(out[out.find("{") :])
        if not reply.get("success"):
            raise RuntimeError(f"flwr {' '.join(args)} failed: {reply}")
        return reply

    def _flwr_call(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [bin_path("flwr"), *args], env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )

    def run(
        self,
        app_dir: Path,
        run_config: Path,
        log_file: Path,
        poll: Callable[[], None] | None = None,
        poll_s: float = 0.5,
    ) -> int:
        """``flwr run APP fedsketch-deploy --stream --run-config FILE``; returns its exit code.

        ``poll`` is called every ``poll_s`` seconds while the run goes on. The app is
        submitted from a copy of its own files (:func:`experiments.flower.app_files.stage_app`) in the
        run's folder (that of ``log_file``).
        """
        with staged_app(app_dir, log_file.parent) as staged, open(log_file, "ab") as log:
            cmd = [bin_path("flwr"), "run", str(staged), CONNECTION, "--stream", "--run-config", str(run_config)]
            proc = subprocess.Popen(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                while proc.poll() is None:
                    if poll is not None:
                        poll()
                    time.sleep(poll_s)
            finally:
                stop_group(proc)
        if poll is not None:
            poll()
        return int(proc.returncode or 0)

    def stop_runs(self) -> list[int]:
        """``flwr stop`` every run on this SuperLink that has not finished; returns their ids.

        Stopping ``flwr run`` only stops the log stream: the run's ServerApp
        goes on, and would compete with the next run for the SuperNodes. A
        RuntimeError if the SuperLink does not answer.
        """
        runs = self.flwr_json("ls")["runs"]
        active = [int(r["run-id"]) for r in runs if not str(r["status"]).startswith("finished")]
        for run_id in active:
            self.flwr("stop", str(run_id), CONNECTION)
        return active

    # ---------------------------------------------------------- lifecycle
    def _env(self, flwr_home: Path) -> dict[str, str]:
        return {**flower_env(flwr_home), TAG: str(self.work_dir.resolve())}

    def start_superlink(self) -> None:
        """Start the SuperLink on its database (again, after it was killed) and wait until it answers.

        Raises
        ------
        RuntimeError
            If it exits or does not answer within 60 s.
        """
        cmd = superlink_command(self.port, self.certs, self.deployment.auth, database=self.database)
        link = self._spawn("superlink", cmd, self.env)
        ca = self.certs.ca_cert if self.certs is not None else None
        wait_healthy_tls(self.address, ca, link, self.log("superlink"), timeout=60.0)

    def _start(self) -> None:
        home = Path(self.env["FLWR_HOME"])
        home.mkdir(parents=True, exist_ok=True)
        (self.work_dir / "logs").mkdir(parents=True, exist_ok=True)
        self.database.unlink(missing_ok=True)  # a new federation (SQLite drops a WAL it finds beside a new database)
        if self.deployment.tls:
            self.certs = make_certificates(self.work_dir / "certs")
        ca = self.certs.ca_cert if self.certs is not None else None
        (home / "config.toml").write_text(connection_toml(self.address, ca), encoding="utf-8")
        self.start_superlink()
        if self.deployment.auth:
            self.register(list(range(self.deployment.num_supernodes)))
        for i in range(self.deployment.num_supernodes):
            self.start_supernode(i)
        self.wait_online(self.deployment.num_supernodes)

    def _spawn(self, name: str, cmd: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        with open(self.log(name), "ab") as log:
            proc = subprocess.Popen(
                [program(cmd[0]), *cmd[1:]], env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.procs[name] = proc
        return proc

    def close(self) -> None:
        """Stop every process started here and all they spawned (safe to call twice)."""
        for proc in self.procs.values():  # all at once: each may take seconds to shut down
            signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + 5.0
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                stop_group(proc, grace_s=0.0)
        self.procs.clear()
        procs.stop_carrying(TAG, str(self.work_dir.resolve()), 5.0)  # the detached ones, and any orphans


def run_all(deployment: Deployment, runs: Sequence[RunConfig], plot: bool) -> int:
    """``fedsketch deploy``'s runs, one after another, on a federation started here; the exit code. A skipped run
    (SIGUSR1) is stopped on the SuperLink and the SuperNodes start again: none keeps one of its messages."""
    from experiments.running import runner, stopping
    from experiments.running.command_plan import APP_DIR, conclude
    from experiments.running.progress import RunWatcher, make_progress
    from fedsketch.server import runlog

    exp_dir = runlog.experiment_dir(runs[0])
    n = deployment.num_supernodes
    with stopping.Invocation("deploy") as invocation:
        if all(runner.is_finished(cfg) for cfg in runs):
            print(f"every run is finished: no SuperLink or SuperNode ({n}) started")
            return conclude(runner.run_all(runs, _nothing_to_run), invocation, exp_dir, plot=plot)
        print(f"starting a SuperLink and {n} SuperNodes; logs in {exp_dir / 'deployment' / 'logs'}")
        with LocalFederation(deployment, exp_dir / "deployment") as fed, make_progress() as progress:

            def execute(cfg: RunConfig, path: Path) -> int:
                watcher = stopping.checked(RunWatcher(progress, runner.describe(cfg), path, cfg.num_rounds))
                try:
                    return fed.run(APP_DIR, path / "run_config.toml", path / "flower.log", poll=watcher)
                except stopping.Skipped:
                    try:
                        fed.stop_runs()  # the skipped run's ServerApp would go on on the shared SuperLink
                        start = time.monotonic()
                        fed.restart_supernodes()  # one may hold a message of the skipped run for good
                        print(
                            f"fedsketch: restarted the {n} SuperNodes for the next run ({time.monotonic() - start:.1f} s)"
                        )
                    except RuntimeError as exc:
                        print(f"fedsketch: the skipped run may still hold the SuperLink or a SuperNode: {exc}")
                    raise

            results = runner.run_all(runs, execute)
    return conclude(results, invocation, exp_dir, plot=plot)


def _nothing_to_run(cfg: RunConfig, path: Path) -> int:
    raise RuntimeError(f"{path}: a finished run would run again")
