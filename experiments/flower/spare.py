"""A simulation process started before its run is known, so that its imports overlap the command's checks.

``fedsketch run`` checks every run and runs each one's forecast round
(:mod:`experiments.running.forecast`) before the first run starts, and a
simulation process (:mod:`experiments.flower.one_process`) started then spends
seconds importing torch, Flower's simulation runtime and the app before its
round 1 (docs/simulation.md, "Start-up"). :func:`start` forks the command once it
has imported torch; the child imports the rest while the command checks and
forecasts, then waits on a pipe for its run. torch's pages stay shared between
the two until the command replaces itself, so the overlap costs little memory
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

import ctypes
import json
import logging
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

from experiments.flower.flower_procs import Child, stop_group

NAME = "fedsketch-sim"
"""The spare's process name (``/proc/PID/comm``, what ``ps`` and ``pgrep`` show); its command line is the command's."""
PR_SET_NAME = 15
Order = dict[str, Any]
"""What a spare is given: the run's settings file, log file, environment and federation."""

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
        _be_the_spare(read_fd, write_fd, warm_up, serve)
    os.close(read_fd)
    _waiting = Spare(Adopted(pid), write_fd, started_for)


def _be_the_spare(read_fd: int, write_fd: int, warm_up: Callable[[], None], serve: Callable[[Order], None]) -> NoReturn:
    """The forked child: a session of its own, no output until its run names a log; never returns to the command."""
    code = 1
    try:
        os.close(write_fd)
        os.setsid()
        ctypes.CDLL(None).prctl(PR_SET_NAME, NAME.encode(), 0, 0, 0)
        quiet = os.open(os.devnull, os.O_RDWR)
        for fd in (1, 2):
            os.dup2(quiet, fd)
        os.close(quiet)
        before = {id(sys.stdout): 1, id(sys.stderr): 2}
        sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 -- for the process's whole life
        sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
        _log_to_the_new_streams(before)
        warm_up()
        line = _read_line(read_fd)
        if line.strip():
            order: Order = json.loads(line)
            log = os.open(order["log_file"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            os.dup2(log, 1)
            os.dup2(log, 2)
            os.close(log)
            serve(order)
        code = 0
    except BaseException:  # noqa: BLE001 -- reported to the run's log (or nowhere before it); never the command's
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _log_to_the_new_streams(before: dict[int, int]) -> None:
    """Point every logging handler that wrote to the command's ``sys.stdout`` or ``sys.stderr`` (``before``: their
    ids, and the descriptor each stands for) at this process's own, which its run's log then receives."""
    loggers = [
        logging.getLogger(),
        *(x for x in logging.Logger.manager.loggerDict.values() if isinstance(x, logging.Logger)),
    ]
    for handler in (h for logger in loggers for h in logger.handlers):
        if isinstance(handler, logging.StreamHandler) and id(handler.stream) in before:
            handler.setStream(sys.stdout if before[id(handler.stream)] == 1 else sys.stderr)


def _read_line(fd: int) -> str:
    """One line from ``fd``, or what came before its end."""
    data = b""
    while not data.endswith(b"\n"):
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        data += chunk
    return data.decode()


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
