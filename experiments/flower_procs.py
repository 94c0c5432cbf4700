"""Flower's processes from the outside: their environment, a free port, their console scripts, stopping them.

Both ways fedsketch runs Flower start its processes from here: a private
SuperLink per simulated run (:mod:`experiments.launch`) and a SuperLink with
SuperNodes on loopback (:mod:`experiments.deploy`). Each runs with a private
``FLWR_HOME`` and no telemetry, in a process group of its own that is stopped
as a whole: SIGTERM, then SIGKILL after a grace period.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def flower_env(flwr_home: Path) -> dict[str, str]:
    """Environment for Flower processes: private home, no telemetry, no installs."""
    env = dict(os.environ)
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


def stop_group(proc: subprocess.Popen[bytes], grace_s: float = 5.0) -> None:
    """SIGTERM a process group we started, then SIGKILL whatever is left after ``grace_s``."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def stop_pid_group(pid: int, grace_s: float = 5.0) -> None:
    """The same for a process group we did not start (e.g. a detached SuperLink)."""
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
