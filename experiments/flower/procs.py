"""The process table, read from ``/proc``: whose environment carries a value, when a process started, its descendants.

Flower's SuperLink starts its SuperExec (and that the ServerApp and Ray)
detached, in sessions of their own, so a process group does not reach them; a
variable every one of them inherits does (a private ``FLWR_HOME``, a run's
token, a measurement's tag). Ray's processes then rename themselves, which can
overwrite the environment ``/proc`` shows: callers that must keep track of them
follow a process once found (by its start time, so a reused pid is not taken
for it) and the descendants of the ones found.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

Seen = dict[int, int | None]
"""Processes found once: pid -> start time, so a reused pid is not taken for the one found."""


def processes_with_env(key: str, value: str) -> list[int]:
    """PIDs of this user's processes, other than this one, whose environment has ``key=value``."""
    needle = f"{key}={value}".encode()
    pids = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                pids.append(int(entry.name))
        except OSError:  # gone, or not ours
            continue
    return [pid for pid in pids if pid != os.getpid()]


def _stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command name (state, parent pid, ...), or None if it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def start_time(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot); ``None`` if it is gone or a zombie."""
    fields = _stat(pid)
    return None if fields is None or fields[0] == "Z" else int(fields[19])


def parent(pid: int) -> int | None:
    """``pid``'s parent pid; ``None`` if it is gone."""
    fields = _stat(pid)
    return None if fields is None else int(fields[1])


def descendants(roots: set[int]) -> set[int]:
    """Every process below ``roots`` (by parent pid), roots excluded."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        fields = _stat(int(entry.name))
        if fields is not None:
            parents[int(entry.name)] = int(fields[1])
    below: set[int] = set()
    frontier = set(roots)
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - below - roots
        below |= frontier
    return below


def carrying(key: str, value: str, seen: Seen | None = None) -> list[int]:
    """PIDs of the live processes whose environment holds ``key=value``, their children, and those in ``seen``.

    ``seen`` (updated here) keeps a process found once, however it renames
    itself, until it exits; its descendants are found through it.
    """
    found = set(processes_with_env(key, value))
    if seen is not None:
        found |= {pid for pid, start in seen.items() if start is not None and start_time(pid) == start}
        found |= descendants(found)
        for pid in found:
            seen.setdefault(pid, start_time(pid))
    return sorted(pid for pid in found if pid != os.getpid() and start_time(pid) is not None)


def stop_carrying(key: str, value: str, grace_s: float, first: int = signal.SIGTERM, seen: Seen | None = None) -> int:
    """Signal every process carrying ``key=value`` (and each one in ``seen``), SIGKILL those left after ``grace_s``.

    Returns how many there were, once none is left (``first=SIGKILL``: kill at
    once, only wait for the kernel to end them). Pass ``seen`` from an earlier
    :func:`carrying` to also stop what was found before its parents went away.
    """
    found: Seen = {} if seen is None else seen

    def still_there() -> list[int]:
        return carrying(key, value, found)  # a dying parent may still start one: it is found here

    left = still_there()
    _signal_all(left, first)
    deadline = time.monotonic() + grace_s
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = still_there()
    for _ in range(20):  # SIGKILL cannot be refused; the loop only waits for the kernel
        if not left:
            break
        _signal_all(left, signal.SIGKILL)
        time.sleep(0.1)
        left = still_there()
    return len(found)


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
