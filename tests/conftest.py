"""Shared fixtures: a private Flower home per test, and process hygiene."""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FLOWER_PROCESSES = "flower-superlink|flower-supernode|flwr-clientapp|flwr-serverapp|raylet"
# Every process this test session starts inherits this variable, so the check
# below sees only our own processes, never those of other work on the machine.
SESSION_TAG = "FEDSKETCH_TEST_SESSION"
os.environ.setdefault(SESSION_TAG, str(os.getpid()))
# Commands started by tests record their tokens here, not in the user's state folder (experiments/stopping.py).
os.environ.setdefault("FEDSKETCH_STATE_DIR", tempfile.mkdtemp(prefix="fedsketch-test-state-"))


def flower_pids() -> set[int]:
    """PIDs of Flower/Ray processes that this test session started, running now."""
    out = subprocess.run(["pgrep", "-f", FLOWER_PROCESSES], capture_output=True, text=True, check=False)
    return {pid for pid in map(int, out.stdout.split()) if _ours(pid)}


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
    before = flower_pids()
    yield
    left = flower_pids() - before
    for pid in left:
        subprocess.run(["kill", "-9", str(pid)], check=False)
    assert not left, f"processes left behind: {sorted(left)}"
