"""bridge/runtime/launcher.py: the SuperNode under a warm launcher that forks a ClientApp per message."""

from __future__ import annotations

import ctypes
import gc
import itertools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NoReturn

import pytest

from bridge.runtime import launcher
from bridge.runtime.launcher_options import parse
from experiments.deployment.deploy import TAG, Deployment, LocalFederation, node_settings
from experiments.deployment.deploy_commands import CONNECTION, connection_toml, superlink_command, supernode_command
from experiments.deployment.pki import ServerCertificates, make_certificates, make_node_keys
from experiments.flower import procs
from experiments.flower.flower_procs import bin_path, flower_env, free_port, stop_group, wait_healthy_tls
from experiments.flower.procs import stop_carrying
from tests.forked_credit import Credit

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.slow
def test_each_round_runs_the_runs_own_clientapp_code_in_a_fork(tmp_path: Path) -> None:
    """The FAB's code, not the copy the launcher was started from, answers; no flower-superexec runs."""
    app = tmp_path / "app"
    for part in ("clients", "fedsketch", "strategies", "experiments"):
        shutil.copytree(ROOT / part, app / part, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", app / "pyproject.toml")
    with open(app / "clients" / "client_app.py", "a", encoding="utf-8") as f:
        f.write('\nimport os as _os, pathlib as _p\n_p.Path(_os.environ["FLWR_HOME"], "from-the-fab").touch()\n')
    settings = {**node_settings(1), "num-rounds": 2, "eval-every": 2, "out-dir": str(tmp_path / "runs")}
    (tmp_path / "run.toml").write_text("".join(f"{k} = {v!r}\n".replace("'", '"') for k, v in settings.items()))
    with LocalFederation(Deployment(1), tmp_path / "fed") as fed:
        launcher = fed.procs["supernode-0"]
        assert fed.run(app, tmp_path / "run.toml", tmp_path / "flower.log") == 0
        log = fed.log("supernode-0").read_text(errors="replace")
        assert launcher.poll() is None  # the launcher outlives its tasks
    assert (tmp_path / "fed" / "nodes" / "node-0" / "from-the-fab").exists()
    assert "launcher ready" in log and log.count("Sent successfully") == 2
    assert "Starting Flower SuperExec" not in log  # Flower's per-message launcher never started


@pytest.mark.slow
def test_the_launcher_says_ready_only_once_the_superlink_has_accepted_its_supernode(
    tmp_path: Path, no_leftover_processes: None, superlink: SuperLink
) -> None:
    """Started before its SuperLink, the device says it waits for it; ready comes once the SuperNode has joined."""
    node_cmd = supernode_command(superlink.address, free_port(), 0, 1, None, None)
    log = tmp_path / "device.log"
    device = _start_device(node_cmd, log, tmp_path, {TAG: str(tmp_path)})
    try:
        _wait_for(log, f"launcher: waiting for the SuperLink at {superlink.address}", device)
        assert "launcher ready" not in log.read_text()
        superlink.start()
        _wait_for(log, f"connected to the SuperLink at {superlink.address}", device)
        ready = next(line for line in log.read_text().splitlines() if line.startswith("launcher ready"))
        assert re.match(r"launcher ready: SuperNode \d+ connected", ready), ready
    finally:
        stop_group(device)
        stop_carrying(TAG, str(tmp_path), 5.0)


def _start_device(node_cmd: list[str], log: Path, tmp_path: Path, tag: dict[str, str]) -> subprocess.Popen[bytes]:
    """The device's launcher and SuperNode (``node_cmd`` run by this Python), its output in ``log``."""
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, *node_cmd[1:]],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**flower_env(tmp_path / "node"), **tag},
            start_new_session=True,
        )


def _wait_for(log: Path, text: str, proc: subprocess.Popen[bytes], timeout: float = 120.0, count: int = 1) -> None:
    deadline = time.monotonic() + timeout
    while log.read_text(errors="replace").count(text) < count:
        if proc.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"no {text!r} (exit code {proc.poll()}):\n{log.read_text(errors='replace')[-3000:]}")
        time.sleep(0.5)


@pytest.mark.slow
def test_a_runtime_port_taken_is_one_line_saying_what_to_do(tmp_path: Path, no_leftover_processes: None) -> None:
    """Another process holds the device's local Runtime API port: Flower's error, the launcher's advice, no traceback."""
    import socket

    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    taken = holder.getsockname()[1]
    node_cmd = supernode_command(f"127.0.0.1:{free_port()}", taken, 0, 1, None, None)
    try:
        done = subprocess.run(
            [sys.executable, *node_cmd[1:]],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            env={**flower_env(tmp_path / "node"), TAG: str(tmp_path)},
            start_new_session=True,
        )
    finally:
        holder.close()
        stop_carrying(TAG, str(tmp_path), 5.0)
    out = done.stdout + done.stderr
    assert done.returncode != 0, out
    assert "Traceback" not in out, out
    assert "launcher: SuperNode Runtime HTTP API failed to start. Another process may hold its port" in out, out


@pytest.mark.slow
def test_a_plain_text_device_against_a_tls_superlink_is_told_so_within_30_s(
    tmp_path: Path, no_leftover_processes: None
) -> None:
    """The SuperLink closes the connection without a word and logs nothing; Flower's SuperNode retries for ever."""
    port, tag = free_port(), {TAG: str(tmp_path)}
    certs = make_certificates(tmp_path / "certs")
    link: subprocess.Popen[bytes] | None = None
    device: subprocess.Popen[bytes] | None = None
    log = tmp_path / "device.log"
    try:
        with open(tmp_path / "superlink.log", "wb") as out:
            link = subprocess.Popen(
                [bin_path("flower-superlink"), *superlink_command(port, certs, auth=False)[1:]],
                cwd=tmp_path,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**flower_env(tmp_path / "link"), **tag},
            )
        wait_healthy_tls(f"127.0.0.1:{port}", certs.ca_cert, link, tmp_path / "superlink.log", timeout=60.0)
        node_cmd = supernode_command(f"127.0.0.1:{port}", free_port(), 0, 1, None, None)  # --insecure: plain text
        device = _start_device(node_cmd, log, tmp_path, tag)
        started = time.monotonic()
        _wait_for(log, "Is the SuperLink using TLS? It is", device, timeout=60.0)
        took = time.monotonic() - started
    finally:
        for proc in (device, link):
            if proc is not None:
                stop_group(proc)
        stop_carrying(TAG, str(tmp_path), 5.0)
    hint = next(line for line in log.read_text().splitlines() if "Is the SuperLink using TLS?" in line)
    print(f"after {took:.1f} s: {hint}")
    assert took < 30.0
    assert f"attempts to reach the SuperLink at 127.0.0.1:{port} failed" in hint
    assert "this device connects in plain text (--insecure): give the SuperNode the CA certificate" in hint
    assert "launcher ready" not in log.read_text()


# --------------------------------------------------------------------------------------------------
# The launcher in a fork of this process (``launcher.main`` as ``python -m bridge.runtime.launcher`` runs it),
# against a real SuperLink; what the fork ran is credited to its test (tests/forked_credit.py).

ECHO_APP = Path(__file__).with_name("echo_app")


class SuperLink:
    """A ``flower-superlink`` on loopback that keeps its state in memory: started again, it knows no node."""

    def __init__(self, work: Path) -> None:
        self.work, self.port, self.proc = work, free_port(), None
        self.address = f"127.0.0.1:{self.port}"
        self.env = {**flower_env(work / "user"), TAG: str(work)}
        self.certs: ServerCertificates | None = None
        (work / "user").mkdir(parents=True)
        (work / "user" / "config.toml").write_text(connection_toml(self.address, None), encoding="utf-8")

    def with_tls(self) -> None:
        """Certificates for TLS, made now, and SuperNode authentication."""
        self.certs = make_certificates(self.work / "certs")
        config = connection_toml(self.address, self.certs.ca_cert)
        (self.work / "user" / "config.toml").write_text(config, encoding="utf-8")

    def register(self, public: Path) -> None:
        flwr = [bin_path("flwr"), "supernode", "register", str(public), CONNECTION]
        done = subprocess.run(flwr, env=self.env, capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stdout + done.stderr

    def start(self, name: str = "superlink") -> None:
        auth = self.certs is not None
        cmd = [bin_path("flower-superlink"), *superlink_command(self.port, self.certs, auth=auth)[1:]]
        with open(self.work / f"{name}.log", "wb") as out:
            self.proc = subprocess.Popen(
                cmd, cwd=self.work, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=self.env
            )
        ca = self.certs.ca_cert if self.certs else None
        wait_healthy_tls(self.address, ca, self.proc, self.work / f"{name}.log", timeout=60.0)

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()

    def run(self, rounds: int) -> list[list[dict[str, int]]]:
        """``flwr run`` of the echo app; each round's answers."""
        done = subprocess.run(
            [bin_path("flwr"), "run", str(ECHO_APP), CONNECTION, "--stream", "--run-config", f"rounds={rounds}"],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return [json.loads(line.split(" ", 1)[1]) for line in done.stdout.splitlines() if line.startswith("answers ")]


@pytest.fixture
def superlink(tmp_path: Path) -> Iterator[SuperLink]:
    link = SuperLink(tmp_path / "link")
    try:
        yield link
    finally:
        if link.proc is not None:
            stop_group(link.proc)
        stop_carrying(TAG, str(link.work), 5.0)


@dataclass
class Device:
    """``launcher.main()`` in a fork: its standard output and error, and what it reports as it ends."""

    pid: int
    out: Path
    err: Path
    report: Path
    credit: Credit
    status: int | None = None

    def ended(self) -> bool:
        """Whether the fork has ended (reaped once, its status kept)."""
        if self.status is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            self.status = status if pid else None
        return self.status is not None

    def said(self) -> str:
        """Its standard output, then its standard error."""
        return self.out.read_text(errors="replace") + self.err.read_text(errors="replace")

    def wait_for(self, text: str, count: int = 1, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while self.said().count(text) < count:
            if time.monotonic() > deadline or self.ended():
                pytest.fail(f"no {text!r}:\n{self.said()[-3000:]}")
            time.sleep(0.1)

    def end(self, sig: int | None = signal.SIGTERM, timeout: float = 30.0) -> dict[str, Any]:
        """Send ``sig`` (none: let it end by itself); its report once it has ended (it is killed after ``timeout``)."""
        if sig is not None and not self.ended():
            os.kill(self.pid, sig)
        deadline = time.monotonic() + timeout
        while not self.ended() and time.monotonic() < deadline:
            time.sleep(0.05)
        if self.status is None:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
            pytest.fail(f"the launcher did not end within {timeout} s:\n{self.said()[-3000:]}")
        self.credit.receive()
        report = json.loads(self.report.read_text()) if self.report.exists() else {}
        return {**report, "exit": os.waitstatus_to_exitcode(self.status)}

    def supernode(self) -> int:
        """The pid of the launcher's SuperNode, once it runs."""
        deadline = time.monotonic() + 30.0
        while time.monotonic() < deadline:
            for pid in procs.descendants({self.pid}):
                if procs.parent(pid) == self.pid and _name(pid) == "flower-supernode"[:15]:  # the kernel keeps 15
                    return pid
            time.sleep(0.1)
        pytest.fail("no SuperNode under the launcher")


def _name(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None


def _device(tmp_path: Path, superlink: str, *options: str, argv_given: bool = False) -> Device:
    node_cmd = supernode_command(superlink, free_port(), 0, 1, None, None)
    return _device_cmd(tmp_path, node_cmd, *options, argv_given=argv_given)


def _device_cmd(tmp_path: Path, node_cmd: list[str], *options: str, argv_given: bool = False) -> Device:
    """A device's launcher and SuperNode, forked from this process and started as ``python -m`` starts it (its
    arguments in ``sys.argv``, its output block-buffered to a file, its errors line-buffered to another). The fork
    reports its exit code, the SuperNode's, the tasks it still held when ``main`` returned, and the waits of its
    loop (each with the number of tasks running) until it was stopped. With ``argv_given``, ``main`` is given the
    arguments instead (``sys.argv`` stays this process's)."""
    cut = node_cmd.index("--")
    argv = [*node_cmd[3:cut], "--poll-s", "0.05", *options, *node_cmd[cut:]]
    out, err, report = tmp_path / "device.out", tmp_path / "device.err", tmp_path / "device.json"
    out.touch()
    err.touch()
    credit = Credit()
    pid = os.fork()
    if pid == 0:  # pragma: no cover -- the fork
        code, made, arenas, sleeps = 98, [], [], []
        try:
            for sig in (signal.SIGINT, signal.SIGTERM):  # as a fresh process has them, not pytest's
                signal.signal(sig, signal.SIG_DFL)
            for fd, path in ((1, out), (2, err)):
                os.dup2(os.open(path, os.O_WRONLY), fd)
            sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115 -- block-buffered, as to a file
            sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115 -- line-buffered, as Python's
            os.environ.update(flower_env(tmp_path / "node"))
            os.environ.pop("OPENBLAS_NUM_THREADS", None)

            class Recorded(launcher.Launcher):
                def __init__(self, *args: Any) -> None:
                    super().__init__(*args)
                    made.append(self)

            def sleep(seconds: float) -> None:
                if made and not made[0].stopping:
                    sleeps.append([round(seconds, 6), len(made[0].tasks)])
                time.sleep(seconds)

            launcher.Launcher = Recorded  # type: ignore[misc]
            launcher.limit_malloc_arenas = arenas.append
            launcher.time = types.SimpleNamespace(sleep=sleep, monotonic=time.monotonic, perf_counter=time.perf_counter)
            if not argv_given:
                sys.argv = ["launcher", *argv]
            try:
                code = launcher.main(argv) if argv_given else launcher.main()
            except SystemExit as exc:
                print(f"exit: {exc.code}", file=sys.stderr)
                code = exc.code if isinstance(exc.code, int) else 1
            node = made[0].node if made else None
            state = {
                "code": code,
                "supernode_alive": node.alive() if node else None,
                "supernode_exit": node.returncode if node else None,
                "tasks": sorted(made[0].tasks) if made else None,
                "openblas_threads": os.environ.get("OPENBLAS_NUM_THREADS"),
                "backoff": node.backoff if node else None,  # the SuperNode's waits as the options say
                "arenas": arenas,
                "sleeps": sleeps,
            }
            report.write_text(json.dumps(state))
            credit.send()
        finally:
            os._exit(code if isinstance(code, int) else 97)
    return Device(pid, out, err, report, credit)


@pytest.mark.slow
def test_a_run_gets_one_fork_per_message_each_dying_with_the_launcher_which_outlives_them(
    tmp_path: Path, superlink: SuperLink
) -> None:
    superlink.start()
    device = _device(tmp_path, superlink.address, "--preload", "json,colorsys")
    try:
        device.wait_for("launcher ready")
        rounds = superlink.run(2)
        alive_after_the_run = not device.ended()
    finally:
        report = device.end()
    ready = next(line for line in device.said().splitlines() if line.startswith("launcher ready"))
    warm = re.fullmatch(
        rf"launcher ready: SuperNode \d+ connected to the SuperLink at {superlink.address}; 2 modules imported in "
        r"(\d+\.\d) s; one fork per ClientApp task from 127\.0\.0\.1:\d+",
        ready,
    )
    assert warm and float(warm[1]) < 30, ready
    assert [len(answers) for answers in rounds] == [1, 1]
    first, second = rounds[0][0], rounds[1][0]
    assert first["parent"] == second["parent"] == device.pid  # forks of the launcher, one a message
    assert len({first["pid"], second["pid"], device.pid}) == 3
    assert first["on_parent_death"] == second["on_parent_death"] == signal.SIGKILL
    assert alive_after_the_run
    assert "a new task came" not in device.said() and "Traceback" not in device.said()
    _assert_the_loops_waits(report.pop("sleeps"), poll_s=0.05, first=0.01)
    assert report == {
        "code": 0,
        "supernode_alive": False,
        "supernode_exit": 0,  # it said goodbye to the SuperLink
        "tasks": [],
        "openblas_threads": "1",
        "backoff": True,
        "arenas": [2],
        "exit": 0,
    }


def _assert_the_loops_waits(sleeps: list[list[float]], poll_s: float, first: float) -> None:
    """Idle, the loop asks every ``poll_s``; ``first`` after a task starts or ends, then backing off to ``poll_s``."""
    waits = [wait for wait, _ in sleeps]
    assert max(waits) == pytest.approx(poll_s)
    assert sum(1 for wait, tasks in sleeps if not tasks and wait == pytest.approx(poll_s)) >= 5, sleeps
    assert any(first < wait < poll_s for wait, tasks in sleeps if tasks), sleeps  # backing off while a task runs
    changes = [now for before, now in itertools.pairwise(sleeps) if bool(before[1]) != bool(now[1])]
    assert len(changes) >= 4, sleeps  # two tasks, each started and ended
    assert all(wait == pytest.approx(first) for wait, _ in changes), sleeps


@pytest.mark.slow
def test_a_module_it_cannot_preload_stops_its_supernode_and_names_the_module(tmp_path: Path) -> None:
    device = _device(tmp_path, f"127.0.0.1:{free_port()}", "--preload", "json,no_such_module", argv_given=True)
    report = device.end(sig=None, timeout=5.0)  # no grace period spent: the SuperNode ends on its first SIGTERM
    assert "exit: cannot preload 'no_such_module': No module named 'no_such_module'" in device.said()
    assert "launcher ready" not in device.said()
    assert (report["code"], report["supernode_alive"], report["exit"]) == (1, False, 1)


@pytest.mark.slow
def test_stopped_before_its_superlink_answers_the_launcher_ends_its_supernode_and_exits_0(tmp_path: Path) -> None:
    address = f"127.0.0.1:{free_port()}"
    device = _device(tmp_path, address, "--supernode-waits", "flower")
    device.wait_for(f"launcher: waiting for the SuperLink at {address} (the SuperNode retries until it connects)")
    report = device.end()
    assert "launcher ready" not in device.said() and "gave up" not in device.said()
    assert report == {**report, "code": 0, "supernode_alive": False, "supernode_exit": 0, "backoff": False, "exit": 0}


@pytest.mark.slow
def test_a_key_the_supernode_cannot_read_ends_the_launcher_with_what_to_do(tmp_path: Path) -> None:
    (tmp_path / "key").write_text("not a key", encoding="utf-8")
    certs = make_certificates(tmp_path / "certs")
    node_cmd = supernode_command(f"127.0.0.1:{free_port()}", free_port(), 0, 1, certs.ca_cert, tmp_path / "key")
    device = _device_cmd(tmp_path, node_cmd)
    report = device.end(sig=None)
    hint = "launcher: the SuperNode gave up with Flower's exit code 302: the key given with "
    assert hint + "--auth-supernode-private-key cannot be read" in device.err.read_text()  # on standard error
    assert report == {**report, "code": 1, "supernode_alive": False, "supernode_exit": 1, "exit": 1}


@pytest.mark.slow
def test_a_device_the_superlink_does_not_know_is_told_which_superlink_refused_it(
    tmp_path: Path, superlink: SuperLink
) -> None:
    superlink.with_tls()
    superlink.start()
    keys = make_node_keys(tmp_path / "keys", "node-0")  # never registered
    assert superlink.certs is not None
    node_cmd = supernode_command(superlink.address, free_port(), 0, 1, superlink.certs.ca_cert, keys.private)
    device = _device_cmd(tmp_path, node_cmd)
    report = device.end(sig=None)
    hint = f"launcher: the SuperNode gave up with Flower's exit code 305: the SuperLink at {superlink.address} refused"
    assert hint in device.err.read_text()
    assert (report["code"], report["exit"]) == (1, 1)


@pytest.mark.slow
def test_a_supernode_killed_before_it_joined_ends_the_launcher_with_the_signals_number(tmp_path: Path) -> None:
    device = _device(tmp_path, f"127.0.0.1:{free_port()}")
    os.kill(device.supernode(), signal.SIGKILL)
    report = device.end(sig=None)
    assert "launcher ready" not in device.said() and "gave up" not in device.said()
    assert report == {**report, "code": signal.SIGKILL, "supernode_alive": False, "supernode_exit": -signal.SIGKILL}


@pytest.mark.slow
def test_a_supernode_that_left_rejoins_each_time_after_2_s_and_a_run_reaches_it(
    tmp_path: Path, superlink: SuperLink
) -> None:
    """A SuperLink that keeps its state in memory forgets the node; Flower's SuperNode then exits 0 (a 401 on its
    heartbeat). The launcher starts it again after a wait, and it joins the new SuperLink as a new node."""
    superlink.start()
    device = _device(tmp_path, superlink.address)
    try:
        device.wait_for("launcher ready")
        for again in (1, 2):
            superlink.kill()
            superlink.start(f"superlink-{again}")
            device.wait_for("launcher ready", count=1 + again)
        rounds = superlink.run(1)
    finally:
        report = device.end()
    lines = [line for line in device.said().splitlines() if line.startswith("launcher")]
    exited = f"launcher: the SuperNode exited with code 0; starting it again in 2 s to rejoin the SuperLink at {superlink.address}"
    assert [line for line in lines if line.startswith("launcher: the SuperNode")] == [exited, exited]
    again = rf"launcher ready: SuperNode (\d+) connected to the SuperLink at {superlink.address} again"
    nodes = [int(re.fullmatch(again, line)[1]) for line in lines[2:] if line.startswith("launcher ready")]  # type: ignore[index]
    first = int(lines[0].split()[3])
    assert len({first, *nodes}) == 3  # a new node each time
    assert [[answer["parent"] for answer in answers] for answers in rounds] == [[device.pid]]
    assert sum(1 for wait, _ in report["sleeps"] if wait == 0.1) >= 2 * 10  # two waits of 2 s, in looks of 0.1 s
    assert report == {**report, "code": 0, "supernode_alive": False, "supernode_exit": 0, "exit": 0}


@pytest.mark.slow
def test_stopped_while_it_waits_to_start_its_supernode_again_the_launcher_ends_at_once(
    tmp_path: Path, superlink: SuperLink
) -> None:
    superlink.start()
    device = _device(tmp_path, superlink.address)
    try:
        device.wait_for("launcher ready")
        superlink.kill()
        superlink.start("superlink-again")
        device.wait_for("starting it again in 2 s")
    finally:
        stopped = time.monotonic()
        report = device.end()
    assert time.monotonic() - stopped < 1.0
    assert device.said().count("launcher ready") == 1
    assert report == {**report, "code": 0, "supernode_alive": False, "supernode_exit": 0, "exit": 0}


@pytest.mark.slow
def test_a_refused_rejoin_is_tried_again_later_and_a_key_become_unreadable_ends_the_launcher(
    tmp_path: Path, superlink: SuperLink
) -> None:
    superlink.with_tls()
    keys = make_node_keys(tmp_path / "keys", "node-0")
    superlink.start()
    superlink.register(keys.public)
    assert superlink.certs is not None
    node_cmd = supernode_command(superlink.address, free_port(), 0, 1, superlink.certs.ca_cert, keys.private)
    device = _device_cmd(tmp_path, node_cmd)
    try:
        device.wait_for("launcher ready")
        superlink.kill()
        superlink.start("superlink-again")  # in memory: the key is no longer registered
        device.wait_for(f"exit code 305: the SuperLink at {superlink.address} refused this SuperNode")
        keys.private.write_text("not a key", encoding="utf-8")
        device.wait_for("gave up with Flower's exit code 302: the key given with")
    finally:
        report = device.end(sig=None)
    said = device.said()
    assert "starting it again in 2 s" in said and "starting it again in 4 s" in said and "again\n" not in said
    assert report == {**report, "code": 1, "supernode_alive": False, "supernode_exit": 1, "exit": 1}


@pytest.mark.slow
def test_a_killed_launchers_supernode_shuts_down_as_on_a_sigterm(tmp_path: Path, superlink: SuperLink) -> None:
    """Its parent's death is a SIGTERM to the SuperNode, which then says goodbye to the SuperLink and stops its
    Runtime API (a SIGKILL would leave no line)."""
    superlink.start()
    device = _device(tmp_path, superlink.address)
    try:
        device.wait_for("launcher ready")
    finally:
        device.end(signal.SIGKILL)
    deadline = time.monotonic() + 10.0
    while "Finished server process" not in device.said() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "Finished server process" in device.said()


# --------------------------------------------------------------------------------------------------
# The loop's parts on children forked here (no SuperNode started: never ``stop``, which would signal it).


@pytest.fixture
def lz() -> Iterator[launcher.Launcher]:
    """A launcher whose SuperNode is a child of this process that sleeps until SIGTERMed (killed on the way out)."""
    lz = launcher.Launcher(*parse(["--", "flower-supernode", "--superlink", "127.0.0.1:9", "--insecure"]))
    lz.node.pid = _forked(_until_signalled)
    yield lz
    launcher._signal(lz.node.pid, signal.SIGKILL)
    lz._end_tasks()
    lz.supernode_alive()


def _until_signalled() -> NoReturn:  # pragma: no cover -- a fork
    try:
        signal.pause()
    finally:
        os._exit(0)


def _forked(target: Callable[..., Any], *args: object, **kwargs: Any) -> int:
    """``launcher._fork``; a child that came back from it (only a broken ``_fork`` returns there) ends at once."""
    me = os.getpid()
    pid = launcher._fork(target, *args, **kwargs)
    if os.getpid() != me:  # pragma: no cover
        os._exit(70)
    return pid


def _task(fd: int, on_sigterm: bytes | None) -> NoReturn:  # pragma: no cover -- a fork
    """A task that writes ``on_sigterm`` to ``fd`` and exits when SIGTERMed (ignores SIGTERM when ``None``)."""
    try:
        if on_sigterm is None:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        else:
            signal.signal(signal.SIGTERM, lambda *_: (os.write(fd, on_sigterm), os._exit(0)))
        os.write(fd, b"+")
        time.sleep(60)
    finally:
        os._exit(1)


def _tasks(count_polite: int, count_stubborn: int) -> tuple[list[int], int]:
    """Forks through the launcher's ``_fork`` running :func:`_task`; their pids and the read end of their pipe."""
    read, write = os.pipe()
    pids = [_forked(_task, write, b"t") for _ in range(count_polite)]
    pids += [_forked(_task, write, None) for _ in range(count_stubborn)]
    os.close(write)
    started = b""
    while len(started) < len(pids):
        started += os.read(read, 16)
    return pids, read


def test_ending_tasks_sigterms_them_then_sigkills_those_left_after_the_grace_period(
    lz: launcher.Launcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(launcher, "STOP_GRACE_S", 0.5)
    (polite, stubborn), read = _tasks(1, 1)
    lz.tasks = {polite, stubborn}
    start = time.monotonic()
    lz._end_tasks()
    took = time.monotonic() - start
    assert os.read(read, 16) == b"t"  # the polite one had its SIGTERM
    os.close(read)
    assert 0.5 <= took < 1.5, took
    assert lz.tasks <= {stubborn}  # the polite one reaped; the SIGKILLed one perhaps not yet
    with pytest.raises(ChildProcessError):
        os.waitpid(polite, os.WNOHANG)
    if lz.tasks:
        assert os.waitstatus_to_exitcode(os.waitpid(stubborn, 0)[1]) == -signal.SIGKILL
    else:
        assert launcher._signal(stubborn, 0) is False
    assert lz.supernode_alive()  # only ``stop`` ends the SuperNode


@pytest.mark.parametrize("stop", [False, True])
def test_ending_tasks_or_stopping_takes_no_grace_period_when_all_end_on_sigterm(
    lz: launcher.Launcher, monkeypatch: pytest.MonkeyPatch, stop: bool
) -> None:
    """``stop`` ends the SuperNode too (it ends on its SIGTERM here); ending the tasks leaves it running."""
    monkeypatch.setattr(launcher, "STOP_GRACE_S", 5.0)
    pids, read = _tasks(2, 0)
    lz.tasks = set(pids)
    start = time.monotonic()
    if stop:
        lz.stop()
    else:
        lz._end_tasks()
    assert time.monotonic() - start < 0.9
    assert (os.read(read, 16), lz.tasks) == (b"tt", set())
    os.close(read)
    assert (lz.stopping, lz.supernode_alive(), lz.returncode) == (
        (True, False, -signal.SIGTERM) if stop else (False, True, None)
    )


def test_a_supernode_that_ignores_sigterm_is_killed_after_the_grace_period_and_waited_for(
    lz: launcher.Launcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(launcher, "STOP_GRACE_S", 0.3)
    launcher._signal(lz.node.pid, signal.SIGKILL)
    lz.supernode_alive()
    (stubborn,), read = _tasks(0, 1)
    os.close(read)
    lz.node.pid, lz.node.returncode = stubborn, None
    start = time.monotonic()
    lz.stop()
    assert 0.3 <= time.monotonic() - start < 0.8  # waited for in looks of 50 ms once SIGKILLed
    assert (lz.supernode_alive(), lz.returncode) == (False, -signal.SIGKILL)


def test_a_new_task_while_others_run_ends_them_and_says_which_at_once(
    lz: launcher.Launcher, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with open(tmp_path / "out", "w", encoding="utf-8") as out:  # block-buffered, as the launcher's output to a file
        monkeypatch.setattr(sys, "stdout", out)
        lz._end_stale_tasks()
        assert (tmp_path / "out").read_text() == ""
        pids, read = _tasks(2, 0)
        lz.tasks = set(pids)
        lz._end_stale_tasks()
        said = (tmp_path / "out").read_text()  # before anything else flushes it
    assert said == f"launcher: a new task came while task(s) {sorted(pids)} still ran; ending them\n"
    assert (os.read(read, 16), lz.tasks) == (b"tt", set())
    os.close(read)
    assert lz.supernode_alive()


def test_reaping_forgets_ended_tasks_and_says_whether_any_still_runs(lz: launcher.Launcher) -> None:
    assert lz._reap() is False
    (running,), read = _tasks(1, 0)
    ended, gone = _forked(os._exit, 0), _forked(os._exit, 0)
    os.waitpid(gone, 0)  # reaped already: no longer this process's child
    lz.tasks = {running, ended, gone}
    deadline = time.monotonic() + 10.0
    while ended in lz.tasks and time.monotonic() < deadline:
        assert lz._reap() is True
        time.sleep(0.01)
    assert lz.tasks == {running}
    assert launcher._signal(running, signal.SIGTERM) is True
    assert os.read(read, 16) == b"t"
    os.close(read)
    while lz._reap():
        time.sleep(0.01)
    assert lz.tasks == set()
    assert launcher._signal(running, signal.SIGTERM) is False  # reaped: no such process


def test_a_runtime_api_that_fails_is_asked_once_a_look(lz: launcher.Launcher) -> None:
    """One try: the loop asks again soon, or ends with its SuperNode (Flower's client would retry for ever)."""
    listener = socket.create_server(("127.0.0.1", 0))
    connections: list[object] = []

    def hang_up() -> None:  # accept and close at once, as a SuperNode going away
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            connections.append(conn)
            conn.close()

    threading.Thread(target=hang_up, daemon=True).start()
    lz.options = replace(lz.options, port=listener.getsockname()[1])
    client = lz._runtime_client()
    try:
        assert [lz._acquire(client), lz._acquire(client)] == [None, None]
    finally:
        client.close()
        listener.close()
    assert len(connections) == 2


def test_while_a_task_runs_it_asks_for_the_next_at_most_once_a_stale_check(
    lz: launcher.Launcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(launcher, "STALE_CHECK_S", 0.2)
    assert [lz._ask_now(), lz._ask_now()] == [True, True]  # no task runs: ask every time
    lz.tasks = {1}
    lz._asked = 0.0
    assert [lz._ask_now(), lz._ask_now()] == [True, False]
    time.sleep(0.3)
    assert [lz._ask_now(), lz._ask_now()] == [True, False]


def _dispositions(fd: int, *args: object) -> NoReturn:  # pragma: no cover -- a fork
    try:
        death = ctypes.c_int(0)
        ctypes.CDLL(None).prctl(2, ctypes.byref(death))  # PR_GET_PDEATHSIG
        sigs = (signal.SIGINT, signal.SIGTERM, signal.SIGQUIT, signal.SIGCHLD)
        said = {"default": [signal.getsignal(s) == signal.SIG_DFL for s in sigs], "death": death.value, "args": args}
        os.write(fd, json.dumps(said).encode())
    finally:
        os._exit(0)


@pytest.mark.parametrize("on_parent_death", [None, signal.SIGKILL])
def test_a_fork_has_default_signal_handlers_the_arguments_and_the_signal_for_its_parents_death(
    on_parent_death: int | None,
) -> None:
    read, write = os.pipe()
    sigs = (signal.SIGINT, signal.SIGTERM, signal.SIGQUIT, signal.SIGCHLD)
    before = [signal.signal(s, lambda *_: None) for s in sigs]  # this process's own, which a fork must not keep
    try:
        extra = {} if on_parent_death is None else {"on_parent_death": on_parent_death}
        pid = _forked(_dispositions, write, "a", 2, **extra)
    finally:
        for s, handler in zip(sigs, before, strict=True):
            signal.signal(s, handler)
    os.close(write)
    os.waitpid(pid, 0)
    with os.fdopen(read, "rb") as said:
        got = json.loads(said.read())
    assert got == {"default": [True] * 4, "death": on_parent_death or signal.SIGTERM, "args": ["a", 2]}


def test_preloading_imports_the_modules_and_freezes_what_is_loaded() -> None:
    read, write = os.pipe()
    credit = Credit()
    pid = os.fork()
    if pid == 0:  # pragma: no cover -- the fork
        try:
            sys.modules.pop("colorsys", None)
            gc.unfreeze()
            launcher.preload(["colorsys"])
            os.write(write, json.dumps(["colorsys" in sys.modules, gc.get_freeze_count() > 0]).encode())
            credit.send()
        finally:
            os._exit(0)
    os.close(write)
    credit.receive()
    os.waitpid(pid, 0)
    with os.fdopen(read, "rb") as said:
        assert json.loads(said.read()) == [True, True]
