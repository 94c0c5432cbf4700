"""Stopping ``fedsketch run`` / ``deploy``, and every process it started.

Flower 1.41 and 1.42 detach ``flower-superexec``, and through it the simulation
process and Ray (``gcs_server``, ``raylet``, its agents, the ``ClientAppActor``
workers), into sessions of their own, so a process group does not reach them.
Every process a command starts inherits one token in its environment
(:data:`TOKEN_VAR`), the way CI's ``FEDSKETCH_CI_TOKEN`` reaches them; the
command stops them by that token:

- SIGINT, SIGTERM (and SIGHUP, unless started under ``nohup``): SIGTERM to
  every process carrying the token, SIGKILL to what is left after
  :data:`GRACE_S`; the current run is marked interrupted, later runs are not
  started, and the command exits with 128 + the signal's number (130, 143).
  A second one SIGKILLs everything at once and exits at once.
- SIGUSR1: stop only the current run, mark it skipped, go on with the next.
- SIGKILL cannot be caught: the token and the command's pid are recorded under
  :func:`state_dir`, and the next command stops what a dead one left.

See ``docs/stopping.md``.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, Self

from experiments.flower import procs
from fedsketch.server import runlog

TOKEN_VAR = "FEDSKETCH_RUN_TOKEN"
STATE_VAR = "FEDSKETCH_STATE_DIR"
GRACE_S = 3.0
"""How long the processes get to exit on SIGTERM before they are SIGKILLed."""
SKIP_SIGNAL = signal.SIGUSR1


class Stop(BaseException):
    """Ends the current run (raised in the command's main thread; not an ``Exception``, so nothing swallows it)."""

    state = "stopped"
    cause = "?"


class Interrupted(Stop):
    """The command was told to stop: the current run and every later one."""

    state = "interrupted"

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.cause = signal.Signals(signum).name

    @property
    def exit_code(self) -> int:
        """128 + the signal's number, as a shell reports a command a signal ended: 130 for SIGINT, 143 for SIGTERM."""
        return 128 + self.signum


class Skipped(Stop):
    """The current run was skipped on request (:data:`SKIP_SIGNAL`); the command goes on."""

    state = "skipped"
    cause = SKIP_SIGNAL.name


def state_dir() -> Path:
    """Where commands record their tokens: ``$FEDSKETCH_STATE_DIR``, else ``$XDG_STATE_HOME/fedsketch``."""
    if os.environ.get(STATE_VAR):
        return Path(os.environ[STATE_VAR])
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "fedsketch"


def stop_token(
    token: str, grace_s: float = GRACE_S, first: int = signal.SIGTERM, also: procs.Seen | None = None
) -> int:
    """SIGTERM every process carrying ``token`` (and those in ``also``, with what they started), SIGKILL those
    left after ``grace_s``; returns how many there were.

    Returns once none is left (``first=SIGKILL``: kill at once). A process once
    found stays tracked until it is gone (:func:`experiments.flower.procs.carrying`).
    """
    return procs.stop_carrying(TOKEN_VAR, token, grace_s, first, seen=dict(also or {}))


def checked(poll: Callable[[], None]) -> Callable[[], None]:
    """``poll`` that also raises :class:`Skipped` once :data:`SKIP_SIGNAL` has asked to skip the current run."""

    def check() -> None:
        if _active is not None and _active.skip_requested:
            _active.skip_requested = False
            raise Skipped(SKIP_SIGNAL.name)
        poll()

    return check


def note_run(path: Path, num_rounds: int) -> None:
    """The run in ``path`` starts now: a forced stop, or the command after a SIGKILL, marks it."""
    if _active is not None:
        _active.start_run(path, num_rounds)


def record(path: Path, num_rounds: int, stop: Stop) -> str:
    """Mark the run in ``path`` as stopped by ``stop`` (unless it had finished); returns the outcome to print."""
    if _last_round(path) >= num_rounds:
        return "finished"
    return runlog.status_note(runlog.write_status(path, stop.state, stop.cause, num_rounds))


def _last_round(path: Path) -> int:
    rows = runlog.read_metrics(path)
    return int(rows[-1]["round"]) if rows else 0


_active: Invocation | None = None


class Invocation:
    """One ``fedsketch run`` or ``deploy`` while it starts processes: its token, record and signal handlers.

    Entering stops what dead commands left (one line each), puts the token in
    ``os.environ`` (every process started from here on inherits it), records
    it, and installs the handlers; leaving stops every process carrying the
    token, whatever happened, and undoes the rest.
    """

    def __init__(self, command: str, state: Path | None = None, grace_s: float = GRACE_S) -> None:
        self.command, self.grace_s = command, grace_s
        self.entry = (state or state_dir()) / "invocations" / f"{os.getpid()}-{secrets.token_hex(6)}.json"
        self.token = f"fedsketch-{self.entry.stem}"
        self.stopped_by: Interrupted | None = None
        self.skip_requested = False
        self.run: tuple[Path, int] | None = None
        self._handlers: dict[int, Any] = {}
        self._env: str | None = None
        self.also: procs.Seen = {}

    def __enter__(self) -> Self:
        global _active
        for line in reap(self.entry.parent, self.grace_s):
            print(line, flush=True)
        self._env = os.environ.get(TOKEN_VAR)
        os.environ[TOKEN_VAR] = self.token
        self._save()
        self._install()
        _active = self
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        global _active
        try:
            stop_token(self.token, self.grace_s, also=self.also)
        finally:
            for sig, handler in self._handlers.items():
                signal.signal(sig, handler)
            if self._env is None:
                os.environ.pop(TOKEN_VAR, None)
            else:
                os.environ[TOKEN_VAR] = self._env
            self.entry.unlink(missing_ok=True)
            _active = None

    def track(self, pid: int) -> None:
        """Stop ``pid`` (and what it starts) with this command's processes though it does not carry the token: a
        process forked before the command had one (:mod:`experiments.flower.spare`)."""
        self.also[pid] = procs.start_time(pid)
        self._save()

    def start_run(self, path: Path, num_rounds: int) -> None:
        """Remember the current run, here and in the record; a skip asked for before it started is dropped."""
        self.run, self.skip_requested = (path, num_rounds), False
        self._save()

    # ------------------------------------------------------------ signals
    def _install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be set from the main thread
        # Installed even where the signal was ignored at start (a script's ``cmd &`` ignores SIGINT),
        # so that ``kill -INT`` stops the command; a hangup is left ignored under ``nohup``.
        hangup = [] if signal.getsignal(signal.SIGHUP) == signal.SIG_IGN else [signal.SIGHUP]
        for sig in (signal.SIGINT, signal.SIGTERM, *hangup):
            self._handlers[sig] = signal.signal(sig, self._on_stop)
        self._handlers[SKIP_SIGNAL] = signal.signal(SKIP_SIGNAL, self._on_skip)

    def _on_stop(self, signum: int, frame: FrameType | None) -> None:
        if self.stopped_by is not None:
            os._exit(self._force())
        self.stopped_by = Interrupted(signum)
        _say(f"fedsketch: {self.stopped_by.cause}: stopping every process this command started (again to force)")
        stop_token(self.token, self.grace_s, also=self.also)
        raise self.stopped_by

    def _on_skip(self, signum: int, frame: FrameType | None) -> None:
        self.skip_requested = True
        _say(f"fedsketch: {SKIP_SIGNAL.name}: skipping the current run")

    def _force(self) -> int:
        """SIGKILL every process at once and mark the current run; the code to exit with, at once."""
        assert self.stopped_by is not None
        stop_token(self.token, grace_s=0.0, first=signal.SIGKILL, also=self.also)
        if self.run is not None:
            record(*self.run, self.stopped_by)
        self.entry.unlink(missing_ok=True)
        _say("fedsketch: forced: every process it started was killed")
        return self.stopped_by.exit_code

    def _save(self) -> None:
        run = None if self.run is None else [str(self.run[0]), self.run[1]]
        entry = {
            "token": self.token,
            "pid": os.getpid(),
            "pid-start": procs.start_time(os.getpid()),
            "command": self.command,
            "run": run,
            "also": {str(pid): start for pid, start in self.also.items()},
        }
        self.entry.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.entry.with_suffix(".tmp")
        tmp.write_text(json.dumps(entry) + "\n", encoding="utf-8")
        os.replace(tmp, self.entry)


def reap(records: Path, grace_s: float = GRACE_S) -> list[str]:
    """Stop the processes of every recorded command that is gone; one line for each that left some.

    A run such a command was in the middle of is marked interrupted (unless it
    had finished), as if it had been stopped by a signal it could catch.
    """
    lines = []
    for file in sorted(records.glob("*.json")):  # none where no command has recorded one
        try:
            entry = json.loads(file.read_text(encoding="utf-8"))
        except (OSError, ValueError):  # half-written by a command killed at that moment
            file.unlink(missing_ok=True)
            continue
        if procs.start_time(entry["pid"]) == entry["pid-start"]:
            continue  # still running (or another live command): not ours to stop
        also = {int(pid): start for pid, start in entry.get("also", {}).items()}
        count = stop_token(entry["token"], grace_s, also=also)
        note = ""
        if entry.get("run") and Path(entry["run"][0]).is_dir():
            path, num_rounds = Path(entry["run"][0]), int(entry["run"][1])
            if _last_round(path) < num_rounds and runlog.read_status(path) is None:
                runlog.write_status(path, "interrupted", "killed", num_rounds)
                note = f"; its run {path} is marked interrupted"
        file.unlink(missing_ok=True)
        if count or note:
            lines.append(
                f"fedsketch: stopped {count} processes left by `fedsketch {entry['command']}` "
                f"(pid {entry['pid']}), which ended without stopping them{note}"
            )
    return lines


def _say(text: str) -> None:
    """One line on stderr from a signal handler: a plain write, never re-entering a buffered ``print``."""
    try:
        os.write(2, (text + "\n").encode())
    except OSError:
        pass
