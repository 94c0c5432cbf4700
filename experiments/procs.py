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
from pathlib import Path


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
