"""Shared fixtures: a private Flower home per test, and process hygiene."""

from __future__ import annotations

import atexit
import gc
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from experiments.flower import procs

# Compiled and assertion-rewritten modules are cached in __pycache__ even where the environment turns that off
# (PYTHONDONTWRITEBYTECODE, inherited by the processes tests start): a repeated fast tier collects its test
# modules in 11 s instead of 19 s on each worker (docs/usage.md).
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

ROOT = Path(__file__).resolve().parent.parent
FLOWER_PROCESSES = "experiments.flower.one_process|flower-superlink|flower-superexec|flower-supernode|flwr-clientapp|flwr-serverapp|flwr-simulation|raylet|gcs_server|ray::"
# Every process this test session starts inherits this variable, so the check
# below sees only our own processes, never those of other work on the machine.
SPARE_NAME = "fedsketch-sim"  # experiments/flower/spare.py's NAME: its command line is that of the command it forked
SESSION_TAG = "FEDSKETCH_TEST_SESSION"
LEFTOVER_GRACE_S = 10.0
"""How long a process found at the end of a test may take to exit by itself before it counts as left behind."""


def _state_dir(prefix: str) -> str:
    """A new state folder, removed when the process that made it exits (not by its forks: mutmut's run in them)."""
    path, owner = tempfile.mkdtemp(prefix=prefix), os.getpid()
    atexit.register(lambda: os.getpid() == owner and shutil.rmtree(path, ignore_errors=True))
    return path


# Commands started by tests record their tokens in FEDSKETCH_STATE_DIR, not in the user's state folder
# (experiments/running/stopping.py). Each pytest-xdist worker (``-n 2``) is a session of its own: its own tag
# and state folder, so that one worker's checks never count, or stop, what the other started.
WORKER = os.environ.get("PYTEST_XDIST_WORKER")
if WORKER:
    os.environ[SESSION_TAG] = f"{os.getpid()}-{WORKER}"
    os.environ["FEDSKETCH_STATE_DIR"] = _state_dir(f"fedsketch-test-state-{WORKER}-")
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # two workers on two cores: one thread each, not two
    import torch

    torch.set_num_threads(1)
# At exit the interpreter collects every object a session made, seconds for a worker while the run waits on it.
# Frozen objects are outside every generation, so that final collection skips them (exit handlers still run).
atexit.register(gc.freeze)
os.environ.setdefault(SESSION_TAG, str(os.getpid()))
if "FEDSKETCH_STATE_DIR" not in os.environ:
    os.environ["FEDSKETCH_STATE_DIR"] = _state_dir("fedsketch-test-state-")


def flower_pids(since: float | None = None) -> set[int]:
    """PIDs of Flower/Ray processes that this test session started, running now.

    With ``since`` (seconds since boot), also those started since then whose
    environment no longer reads as one, if the nearest process above them that
    still shows one is this session's (or none does): a Ray process that
    renames itself can overwrite what ``/proc`` shows of its environment. A
    process whose environment reads as one and lacks the tag belongs to other
    work on the machine, whenever it started.
    """
    out = subprocess.run(["pgrep", "-f", FLOWER_PROCESSES], capture_output=True, text=True, check=False)
    named = subprocess.run(["pgrep", "-x", SPARE_NAME], capture_output=True, text=True, check=False)  # forked spares
    found = set(map(int, out.stdout.split())) | set(map(int, named.stdout.split()))
    return {pid for pid in found if _ours(pid) or _renamed_since(pid, since)}


def uptime_s() -> float:
    """Seconds since boot (the clock of ``/proc/PID/stat``'s start times)."""
    return float(Path("/proc/uptime").read_text().split()[0]) if Path("/proc/uptime").exists() else 0.0


def _renamed_since(pid: int, since: float | None) -> bool:
    if since is None or not Path("/proc").is_dir():
        return False
    started = procs.start_time(pid)  # clock ticks since boot; None when gone or a zombie
    env = environ(pid)
    if started is None or env is None or _reads_as_environment(env) or started / os.sysconf("SC_CLK_TCK") < since:
        return False
    return _owner_is_ours(pid) is not False


def environ(pid: int) -> list[bytes] | None:
    """``/proc/PID/environ``'s entries, or None when it is gone or not ours to read."""
    try:
        return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None


def _reads_as_environment(env: list[bytes]) -> bool:
    """Whether every entry is ``KEY=VALUE`` (a process that wrote its new name over it leaves other bytes)."""
    entries = env[:-1] if env and not env[-1] else env
    return all(b"=" in entry for entry in entries)


def _owner_is_ours(pid: int) -> bool | None:
    """Whether the nearest process above ``pid`` whose environment reads as one is this session's; None if none is."""
    parent = procs.parent(pid)
    while parent is not None and parent > 1:
        env = environ(parent)
        if env is not None and _reads_as_environment(env):
            return _tag() in env
        parent = procs.parent(parent)
    return None  # orphaned (adopted by init): nothing above it tells whose it was


def _tag() -> bytes:
    return f"{SESSION_TAG}={os.environ[SESSION_TAG]}".encode()


def _ours(pid: int) -> bool:
    """Whether ``pid`` carries this session's tag (always true where /proc is missing)."""
    if not Path("/proc").is_dir():
        return True
    env = environ(pid)  # None: gone already, or not ours to read
    return env is not None and _tag() in env


@pytest.fixture
def no_leftover_processes() -> Iterator[None]:
    """Fail the test if it leaves Flower or Ray processes behind."""
    since, before = uptime_s(), flower_pids()
    yield
    left = flower_pids(since) - before
    deadline = time.monotonic() + LEFTOVER_GRACE_S
    while left and time.monotonic() < deadline:  # Ray's agents exit on their own soon after their raylet
        time.sleep(0.2)
        left = {pid for pid in left if procs.start_time(pid) is not None}
    for pid in left:
        subprocess.run(["kill", "-9", str(pid)], check=False)
    assert not left, f"processes left behind: {sorted(left)}"


@pytest.fixture(autouse=True)
def own_environment() -> Iterator[None]:
    """Each test ends with the environment it began with: code a test runs in this process (a spare's warm-up,
    a command) sets variables that later tests' processes would inherit, such as the run's one-machine Ray
    (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``), with which no ``ray start`` joins a cluster."""
    before = dict(os.environ)
    yield
    if os.environ != before:
        os.environ.clear()
        os.environ.update(before)


HANDOFF_ENV = "FEDSKETCH_LOADED"  # fedsketch/data/handoff.py's ENV (not imported: it imports torch)


@pytest.fixture(autouse=True)
def no_handed_data(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test starts and ends with no data handed over: a command run in this process (``main``, the API)
    names the data it loaded in the environment and keeps it (fedsketch/data/handoff.py)."""
    monkeypatch.setenv(HANDOFF_ENV, "")  # restored to what it was (unset) after the test
    yield
    handoff = sys.modules.get("fedsketch.data.handoff")
    if handoff is not None:
        handoff.forget()
