"""The leftover-process check (``conftest.flower_pids``) on real processes: ours are found, other work's are not.

Several people's tests run Flower and Ray on one machine at once; the check
kills what it finds, so a process of theirs must never count as ours.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from tests.conftest import SESSION_TAG, flower_pids, uptime_s

# Writes a long title over its own environment, as Ray's workers and agents do when they rename themselves.
RENAMED = "import ray._raylet as r, time; r.setproctitle('ray::Renamed' + ' ' * 20000); time.sleep(60)"
PARENT = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {RENAMED!r}])"


def _env_without_tag() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != SESSION_TAG}


@contextmanager
def _started(args: list[str], env: dict[str, str] | None = None) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(args, env=env)
    try:
        yield proc
    finally:
        for child in _children(proc.pid):
            os.kill(child, signal.SIGKILL)
        proc.kill()
        proc.wait()


def _children(parent: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(parent)], capture_output=True, text=True, check=False).stdout
    return [int(pid) for pid in out.split()]


def _child_renamed(parent: int, timeout_s: float = 30.0) -> int:
    """The pid of ``parent``'s child once its title shows the new name."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for pid in _children(parent):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if f.read().startswith(b"ray::Renamed"):
                        return pid
            except OSError:
                pass
        time.sleep(0.1)
    raise AssertionError(f"no renamed child under {parent} after {timeout_s} s")


@pytest.mark.slow  # starts real processes and waits for them
@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
def test_a_look_alike_started_by_other_work_is_not_counted() -> None:
    since = uptime_s()
    with (
        _started(["bash", "-c", "exec -a flower-superlink-elsewhere sleep 60"], _env_without_tag()) as theirs,
        _started(["bash", "-c", "exec -a flower-superlink-ours sleep 60"]) as ours,
    ):
        time.sleep(0.5)
        found = flower_pids(since)
        assert ours.pid in found
        assert theirs.pid not in found


@pytest.mark.slow  # starts real processes and waits for them
@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
def test_a_renamed_process_counts_as_ours_only_under_a_parent_of_ours() -> None:
    since = uptime_s()
    with (
        _started([sys.executable, "-c", PARENT]) as ours,
        _started([sys.executable, "-c", PARENT], _env_without_tag()) as theirs,
    ):
        mine, other = _child_renamed(ours.pid), _child_renamed(theirs.pid)
        with open(f"/proc/{mine}/environ", "rb") as f:
            assert SESSION_TAG.encode() not in f.read()  # the title overwrote the tag: found through its parent
        found = flower_pids(since)
        assert mine in found
        assert other not in found
