"""The processes the tests of Flower's process handling start, stopped whatever a test did."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from experiments.flower import procs


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[bytes]]]:
    """The processes a test starts (append them), theirs and their groups: killed and reaped when it ends; never
    through the pid of one already reaped, which may be another process's by then."""
    children: list[subprocess.Popen[bytes]] = []
    yield children
    running = [child for child in children if child.poll() is None]
    for pid in procs.descendants({child.pid for child in running}):
        os.kill(pid, signal.SIGKILL)
    for child in running:
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except ProcessLookupError:  # not a group's leader
            child.kill()
    for child in children:
        child.wait(timeout=10)
        if child.stdout is not None:  # a pipe left open is a ResourceWarning in whichever test collects it
            child.stdout.close()


@pytest.fixture
def homes() -> Iterator[list[Path]]:
    """The ``FLWR_HOME`` of each run a test makes (append them): whatever still carries one when the test ends
    is killed, whether or not the code under test stopped it (a mutant's, say)."""
    found: list[Path] = []
    yield found
    for home in found:
        procs.stop_carrying("FLWR_HOME", str(home), 0.0, first=signal.SIGKILL)
