"""Measure a command's whole process tree: summed PSS over time, by role, and when each role appeared.

Flower's SuperLink starts its SuperExec, that the simulation process, and that
Ray's GCS, raylet, agents and workers, several of them in sessions of their
own; ``/usr/bin/time`` sees only the first process. Every one of them inherits
the environment, so a variable set on the command (``tag_env``) finds them.
Ray's processes then rename themselves (``ray::DashboardAgent``), which
overwrites the environment that ``/proc`` shows: a process seen once stays
counted until it exits, and so do the children of counted processes.
PSS (proportional set size) charges each shared page to its sharers in equal
parts, so the sum over processes counts torch's libraries once, not once per
process.
"""

from __future__ import annotations

import os
import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

from experiments.flower import procs

TAG = "FEDSKETCH_MEASURE_TAG"

ONE_PROCESS = "Flower simulation in one process (ServerApp; ClientApp in-process or Ray driver)"
ROLES: tuple[tuple[str, str], ...] = (
    ("fedsketch CLI", r"experiments\.cli|bin/fedsketch"),
    ("pre-run check", r"experiments\.preflight"),
    ("Ray head start", r"experiments\.rayhead|bin/ray start"),
    ("flwr run", r"bin/flwr run"),
    ("SuperLink", r"flower-superlink"),
    ("SuperExec", r"flower-superexec"),
    ("flwr-simulation (ServerApp; ClientApp in-process or Ray driver)", r"flwr-simulation"),
    (ONE_PROCESS, r"experiments\.flower\.one_process"),
    ("Ray GCS", r"gcs_server"),
    ("Ray raylet", r"raylet/raylet"),
    ("Ray dashboard agent", r"dashboard/agent\.py|^ray::DashboardAgent"),
    ("Ray runtime-env agent", r"runtime_env/agent/main\.py|^ray::RuntimeEnvAgent"),
    ("Ray log monitor", r"log_monitor\.py"),
    ("Ray autoscaler monitor", r"autoscaler/_private/monitor\.py"),
    ("Ray dashboard server", r"dashboard/dashboard\.py"),
    ("Ray client server", r"ray\.util\.client\.server"),
    ("Ray worker (ClientApp)", r"^ray::|default_worker\.py"),
    ("pfl", r"peer_pfl\.py"),
)
"""Role names by a pattern of the command line; the first match wins, anything else is ``other (command)``."""
NAMED = {"fedsketch-sim": ONE_PROCESS}
"""Role names by process name, before the command line: a process forked from another keeps its command line
(:data:`experiments.flower.spare_child.NAME`)."""


def tag_env(env: dict[str, str] | None = None) -> tuple[dict[str, str], str]:
    """A copy of ``env`` (default: this process's) with a fresh tag that every descendant inherits."""
    tag = uuid.uuid4().hex
    return {**(os.environ if env is None else env), TAG: tag}, tag


PARTS = ("Pss", "Pss_Anon", "Pss_File", "Pss_Shmem")
"""The PSS and its anonymous (heap, stacks), file-backed (libraries, mapped data) and shared-memory parts."""


def pss_kb(pid: int) -> tuple[int, ...]:
    """The process's :data:`PARTS` in KiB (zeros if it is gone)."""
    values = dict.fromkeys(PARTS, 0)
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            key = line.split(":")[0]
            if key in values:
                values[key] = int(line.split()[1])
    except (OSError, ValueError):
        pass
    return tuple(values.values())


def role(pid: int) -> str:
    """What the process is, from its command line (Ray renames its workers ``ray::...``)."""
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        name = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "gone"
    if name in NAMED:
        return NAMED[name]
    for name, pattern in ROLES:
        if re.search(pattern, cmd):
            return name
    return f"other ({cmd[:60].strip()})"


@dataclass
class TreeSampler:
    """Samples the tagged tree every ``interval_s`` in a thread: peak total PSS, the roles at the peak, first sightings."""

    tag: str
    key: str = TAG  # the environment variable that carries the tag (e.g. a run's private FLWR_HOME)
    start: float = field(default_factory=time.time)
    interval_s: float = 0.2
    peak_mb: float = 0.0
    at_peak: dict[str, list[float]] = field(default_factory=dict)  # role -> PARTS in MB
    first_seen: dict[str, float] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _known: dict[int, tuple[int, str]] = field(default_factory=dict)  # pid -> (start time, role)

    def __enter__(self) -> Self:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _members(self) -> list[int]:
        """Tagged processes, processes seen before that still run, and their descendants."""
        members = set(procs.processes_with_env(self.key, self.tag))
        members |= {p for p, (start, _) in self._known.items() if procs.start_time(p) == start}
        members |= procs.descendants(members)
        alive = []
        for pid in members:
            start = procs.start_time(pid)
            if start is None:
                continue
            if pid not in self._known or self._known[pid][0] != start:
                self._known[pid] = (start, role(pid))
            alive.append(pid)
        return sorted(alive)

    def _run(self) -> None:
        while not self._stop.is_set():
            by_role: dict[str, list[float]] = {}
            for pid in self._members():
                name = self._known[pid][1]
                self.first_seen.setdefault(name, time.time() - self.start)
                sums = by_role.setdefault(name, [0.0] * len(PARTS))
                for i, kb in enumerate(pss_kb(pid)):
                    sums[i] += kb / 1024
            total = sum(parts[0] for parts in by_role.values())
            if total > self.peak_mb:
                self.peak_mb, self.at_peak = total, by_role
            self._stop.wait(self.interval_s)
