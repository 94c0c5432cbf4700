"""A simulation process started before its run is known, so that its imports overlap the command's checks.

``fedsketch run`` checks every run and runs each one's forecast round
(:mod:`experiments.running.forecast`) before the first run starts, and a
simulation process (:mod:`experiments.flower.one_process`) started then spends
seconds importing torch, Flower's simulation runtime and the app before its
round 1 (docs/simulation.md, "Start-up"). :func:`start` forks the command once it
has imported torch; the child (:mod:`experiments.flower.spare_child`) imports
the rest while the command checks and forecasts, then waits on a pipe for its
run. torch's pages stay shared between the two until the command replaces
itself, so the overlap costs little memory
(a second process importing torch afresh would hold its own 290 MB).
:func:`take` hands the child to the first run of the same backend, which writes
the run (its settings file, log file, environment and federation) down the
pipe. A spare nobody takes reads the end of its input and exits: when the
command fails, finds nothing to run, or ends, the pipe closes with it, and
:func:`release` stops it.

The command replaces itself (``exec``, the same pid) with ``run-plan``; the
spare stays its child, and :func:`hand_over` / :func:`adopt` carry its pid and
pipe across in :data:`ENV`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from experiments.flower.flower_procs import Child, stop_group
from experiments.flower.spare_child import Order, be_the_spare

ENV = "FEDSKETCH_SPARE_SIMULATION"
"""Where the command tells its own ``run-plan`` (after ``exec``) of the spare: its pid, pipe and federation."""


class Adopted:
    """A child this process image did not start (it was started before an ``exec``), as a :class:`Child`."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # already reaped elsewhere: it has ended
                self.returncode = -1
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0.0)
            time.sleep(0.02)
        return int(self.returncode or 0)


@dataclass
class Spare:
    """A started spare: the process, the write end of its input, what it was started for (app and backend)."""

    child: Child
    order_fd: int
    started_for: list[str]

    def give(self, order: Order) -> Child:
        """Send the spare its run; from here on it is the run's simulation process."""
        try:
            os.write(self.order_fd, (json.dumps(order) + "\n").encode())
        finally:
            os.close(self.order_fd)
        return self.child

    def release(self) -> None:
        """Close its input and stop it: it has run nothing."""
        try:
            os.close(self.order_fd)
        except OSError:
            pass
        stop_group(self.child, grace_s=2.0)


_waiting: Spare | None = None


def start(started_for: list[str], warm_up: Callable[[], None], serve: Callable[[Order], None]) -> None:
    """Fork the spare: it calls ``warm_up``, waits for its :data:`Order` and calls ``serve`` with it (one spare at a
    time: a waiting one is released first)."""
    global _waiting
    release()
    read_fd, write_fd = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        be_the_spare(read_fd, write_fd, warm_up, serve)
    os.close(read_fd)
    _waiting = Spare(Adopted(pid), write_fd, started_for)


def take(started_for: list[str]) -> Spare | None:
    """The waiting spare if it was started for the same app and backend and still runs; else ``None`` (and it is
    released)."""
    global _waiting
    spare, _waiting = _waiting, None
    if spare is None:
        return None
    if spare.started_for == started_for and spare.child.poll() is None:
        return spare
    spare.release()
    return None


def release() -> None:
    """Let a spare nobody took go."""
    global _waiting
    spare, _waiting = _waiting, None
    if spare is not None:
        spare.release()


def waiting_pid() -> int | None:
    """The waiting spare's pid, if there is one."""
    return None if _waiting is None else _waiting.child.pid


def hand_over() -> None:
    """Before ``exec``: keep the spare's pipe open across it and say where it is in :data:`ENV`."""
    if _waiting is None:
        os.environ.pop(ENV, None)
        return
    os.set_inheritable(_waiting.order_fd, True)
    os.environ[ENV] = json.dumps([_waiting.child.pid, _waiting.order_fd, _waiting.started_for])


def adopt() -> None:
    """After ``exec``: the spare :func:`hand_over` described, as this process's waiting spare."""
    global _waiting
    described = os.environ.pop(ENV, None)
    if described is None:
        return
    pid, order_fd, started_for = json.loads(described)
    os.set_inheritable(int(order_fd), False)
    _waiting = Spare(Adopted(int(pid)), int(order_fd), [str(x) for x in started_for])
