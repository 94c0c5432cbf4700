"""Shared fixtures: a private Flower home per test, and process hygiene."""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from experiments import procs

ROOT = Path(__file__).resolve().parent.parent
FLOWER_PROCESSES = "flower-superlink|flower-superexec|flower-supernode|flwr-clientapp|flwr-serverapp|flwr-simulation|raylet|gcs_server|ray::"
# Every process this test session starts inherits this variable, so the check
# below sees only our own processes, never those of other work on the machine.
SESSION_TAG = "FEDSKETCH_TEST_SESSION"
os.environ.setdefault(SESSION_TAG, str(os.getpid()))
# Commands started by tests record their tokens here, not in the user's state folder (experiments/stopping.py).
os.environ.setdefault("FEDSKETCH_STATE_DIR", tempfile.mkdtemp(prefix="fedsketch-test-state-"))


def flower_pids(since: float | None = None) -> set[int]:
    """PIDs of Flower/Ray processes that this test session started, running now.

    With ``since`` (seconds since boot), also those started since then that no
    longer show any environment of this session's: a Ray process that renames
    itself can overwrite what ``/proc`` shows of its environment.
    """
    out = subprocess.run(["pgrep", "-f", FLOWER_PROCESSES], capture_output=True, text=True, check=False)
    return {pid for pid in map(int, out.stdout.split()) if _ours(pid) or _renamed_since(pid, since)}


def uptime_s() -> float:
    """Seconds since boot (the clock of ``/proc/PID/stat``'s start times)."""
    return float(Path("/proc/uptime").read_text().split()[0]) if Path("/proc/uptime").exists() else 0.0


def _renamed_since(pid: int, since: float | None) -> bool:
    """Started since ``since``, showing no session tag, and below a process of this session.

    A Ray process that renames itself can overwrite what ``/proc`` shows of its
    environment; its parent (the raylet) still shows ours. Another session's
    processes, renamed or not, are never below one of ours.
    """
    if since is None or not Path("/proc").is_dir():
        return False
    started = procs.start_time(pid)  # clock ticks since boot; None when gone or a zombie
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    if started is None or SESSION_TAG.encode() in env or started / os.sysconf("SC_CLK_TCK") < since:
        return False
    return _below_ours(pid)


def _below_ours(pid: int) -> bool:
    """Whether an ancestor of ``pid`` (short of init) is this process or carries this session's tag."""
    parent = _parent(pid)
    while parent > 1:
        if parent == os.getpid() or _ours(parent):
            return True
        parent = _parent(parent)
    return False


def _parent(pid: int) -> int:
    """The parent pid of ``pid`` (0 when it is gone)."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def _ours(pid: int) -> bool:
    """Whether ``pid`` carries this session's tag (always true where /proc is missing)."""
    if not Path("/proc").is_dir():
        return True
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:  # gone already, or not ours to read
        return False
    return f"{SESSION_TAG}={os.environ[SESSION_TAG]}".encode() in env


@pytest.fixture
def no_leftover_processes() -> Iterator[None]:
    """Fail the test if it leaves Flower or Ray processes behind."""
    since, before = uptime_s(), flower_pids()
    yield
    left = flower_pids(since) - before
    for pid in left:
        subprocess.run(["kill", "-9", str(pid)], check=False)
    assert not left, f"processes left behind: {sorted(left)}"
