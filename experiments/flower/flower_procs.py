"""Starting, watching and stopping Flower's processes from the outside.

Both ways fedsketch runs Flower start its processes with these: a private
SuperLink per simulated run (:mod:`experiments.flower.launch`) and a SuperLink with
SuperNodes on loopback (:mod:`experiments.deployment.deploy`). Each runs from this
environment's console scripts with a private ``FLWR_HOME`` and no telemetry,
on a free loopback port, in a process group of its own that is stopped as a
whole: SIGTERM, then SIGKILL after a grace period. A SuperLink has started
once its HTTP health endpoint answers. A Ray that Flower starts for a run
listens on loopback only (:data:`LOOPBACK_RAY`).
"""

from __future__ import annotations

import itertools
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import httpx

from fedsketch.server import runlog


class Child(Protocol):
    """What watching and stopping a started process needs of it (``subprocess.Popen`` has it)."""

    pid: int
    returncode: int | None

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


LOOPBACK_RAY = ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
"""Ray (2.55) on Linux takes a node's address to be the machine's network address, even when told 127.0.0.1
(``resolve_ip_for_localhost``), and its GCS server, raylet and workers listen on every interface: anyone on
the network could reach an unauthenticated Ray, which runs code. Ray's one-machine mode (this variable at
0; on Linux it changes nothing else) takes loopback for the node's address, and every Ray process then
listens on 127.0.0.1 only. Set unless ``RAY_ADDRESS`` names a cluster to join, or the variable is set."""


def flower_env(flwr_home: Path) -> dict[str, str]:
    """Environment for Flower processes: private home, no telemetry, no installs, a Ray on loopback only."""
    env = dict(os.environ)
    if not env.get("RAY_ADDRESS"):
        env.setdefault(*LOOPBACK_RAY)
    # The SuperLink starts ``flower-superexec`` and friends by name: put the
    # venv's scripts first on PATH even when the venv is not activated.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.update(
        FLWR_HOME=str(flwr_home),
        FLWR_TELEMETRY_ENABLED="0",
        FLWR_DISABLE_UPDATE_CHECK="1",
        FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1",
        RAY_DEDUP_LOGS="0",
        FLWR_SUPEREXEC_TASK_POLL_INTERVAL="0.1",  # Flower's default 1 s: up to a second before a run starts
        PYTHONUNBUFFERED="1",
    )
    return env


def bin_path(name: str) -> str:
    """A console script installed beside the running interpreter."""
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.exists() else name


def stop_group(proc: Child, grace_s: float = 5.0) -> None:
    """SIGTERM a process group we started, then SIGKILL whatever is left after ``grace_s``; nothing once it is
    reaped (its pid may be another process's by then: ``procs.stop_carrying`` finds what its group left). A child
    forked an instant ago may not lead its group yet (before its ``setsid``): then the process itself."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        if proc.returncode is not None:
            return
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            try:
                os.kill(proc.pid, sig)
            except ProcessLookupError:
                return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def wait_healthy(port: int, proc: subprocess.Popen[bytes], timeout: float, log_file: Path) -> None:
    """Wait for the SuperLink's HTTP health endpoint.

    Raises
    ------
    RuntimeError
        If the SuperLink exits or does not answer within ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"flower-superlink exited with code {proc.returncode}; see {log_file}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=0.5).is_success:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"flower-superlink did not start within {timeout:.0f} s; see {log_file}")


def program(name: str) -> str:
    """``python`` is this interpreter (which ``bin_path`` may not find under that name); paths stay as they are."""
    return sys.executable if name == "python" else bin_path(name)


def signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    """Send ``sig`` to the process group of ``proc`` (started in a session of its own), if it is still there."""
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def wait_healthy_tls(
    address: str, ca_cert: Path | None, proc: subprocess.Popen[bytes], log_file: Path, timeout: float
) -> None:
    """:func:`wait_healthy` for a SuperLink at ``address``, over HTTPS verified against ``ca_cert`` when one is given."""
    verify: ssl.SSLContext | bool = ssl.create_default_context(cafile=str(ca_cert)) if ca_cert else False
    url = f"{'https' if ca_cert else 'http'}://{address}/health"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"flower-superlink exited with code {proc.returncode}; see {log_file}")
        try:
            if httpx.get(url, timeout=0.5, verify=verify).is_success:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"flower-superlink did not answer at {url} within {timeout:.0f} s; see {log_file}")


LOGS_GRACE_S = 3.0
"""How long a finished run waits for the ServerApp's last log line to reach ``flower.log``."""


def watch(
    cmd: list[str],
    env: dict[str, str],
    log_file: Path,
    finished: Callable[[], bool],
    poll: Callable[[], None] | None,
) -> int:
    """Run ``cmd`` in its own process group until it ends or the ServerApp has marked the run done; 0 then."""
    with open(log_file, "ab") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return follow(proc, log_file, finished, poll)


def follow(proc: Child, log_file: Path, finished: Callable[[], bool], poll: Callable[[], None] | None) -> int:
    """:func:`watch` for a process already started (in a session of its own, its logs going to ``log_file``)."""
    done = False
    try:
        for tick in itertools.count():
            if proc.poll() is not None or done:
                break
            if poll is not None and tick % 5 == 0:
                poll()
            time.sleep(0.1)
            done = finished()
        if done:
            _wait_for_line(log_file, runlog.SERVER_DONE_LOG, LOGS_GRACE_S, proc)
    finally:
        stop_group(proc)
    if poll is not None:
        poll()
    return 0 if done else int(proc.returncode or 0)


def _wait_for_line(log_file: Path, line: str, timeout_s: float, proc: Child) -> None:
    """Until ``line`` is in ``log_file`` (the ServerApp's logs have all been streamed), ``proc`` ends, or a timeout."""
    deadline = time.monotonic() + timeout_s
    needle = line.encode()
    while time.monotonic() < deadline and proc.poll() is None and needle not in log_file.read_bytes():
        time.sleep(0.05)
