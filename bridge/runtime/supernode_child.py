"""The launcher's SuperNode: a fork of the launcher, watched until it has joined the SuperLink, started again.

The launcher (:mod:`bridge.runtime.launcher`) forks Flower's ``flower-supernode`` entry point
(:func:`bridge.runtime.forked.run_supernode`) and learns through a pipe whether the SuperLink
accepted it (:mod:`bridge.runtime.joining`). While it waits it says so, and after
:data:`bridge.runtime.link_probe.ATTEMPTS` failed connection attempts it says what may be wrong
(:func:`bridge.runtime.link_probe.attempts_hint`: a plain-text device against a TLS SuperLink is
named). Once joined, a SuperNode that exits (Flower's exits with code 0 when a restarted SuperLink no
longer knows it, and with 1 when it is refused) is started again by the launcher after
:meth:`Restarts.next` seconds (2, 4, 8, ... up to a minute): a device keeps trying to rejoin for as
long as it runs, as a supervisor would make it.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

from bridge.runtime.forked import run_supernode
from bridge.runtime.joining import Joining, superlink_of, wait_joined
from bridge.runtime.link_probe import ATTEMPTS, attempts_hint

JOIN_PATIENCE_S = 2.0  # after warming up: how long the SuperNode may take to join before we say we wait
RESTART_FIRST_S, RESTART_CAP_S = 2.0, 60.0  # the first wait before a restart, and the longest
Fork = Callable[..., int]  # runs a function in a forked child, returns its pid (the launcher's ``_fork``)


@dataclass
class Restarts:
    """The waits before starting a SuperNode again: :data:`RESTART_FIRST_S`, doubling after each start that did
    not join, up to :data:`RESTART_CAP_S`."""

    wait: float = RESTART_FIRST_S

    def next(self) -> float:
        """The wait before this restart (the next one waits twice as long)."""
        wait, self.wait = self.wait, min(RESTART_CAP_S, self.wait * 2)
        return wait

    def joined(self) -> None:
        """The SuperNode joined: a later restart waits :data:`RESTART_FIRST_S` again."""
        self.wait = RESTART_FIRST_S


class SuperNodeChild:
    """One forked SuperNode at a time: its pid and, once it has ended, its exit code."""

    def __init__(self, command: list[str], backoff: bool, port: int, fork: Fork) -> None:
        self.command, self.backoff, self.port, self.fork = command, backoff, port, fork
        self.superlink = superlink_of(command)
        self.pid = 0
        self.returncode: int | None = None
        self._joined_fd = -1

    def start(self) -> None:
        """Fork a SuperNode; :meth:`join` then waits for it to join."""
        read, write = os.pipe()
        self.pid, self.returncode = self.fork(run_supernode, self.command, write, self.backoff), None
        os.close(write)  # the SuperNode holds the only writer: its exit ends the pipe
        self._joined_fd = read

    def alive(self) -> bool:
        """Whether the SuperNode still runs (its exit code is kept once it has ended)."""
        if self.returncode is None and self.pid:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                pid, status = self.pid, 0
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode is None

    def join(self, waiting: Callable[[], bool]) -> Joining:
        """Wait until the SuperNode has joined the SuperLink, exited, or ``waiting()`` turns false.

        Says "waiting for the SuperLink" when it takes a while, and what may be wrong after a few failed
        attempts to reach it.
        """
        self._wait_listening(waiting)
        line = f"launcher: waiting for the SuperLink at {self.superlink} (the SuperNode retries until it connects)"
        device_tls, said = "--insecure" not in self.command, False

        def on_slow() -> None:
            nonlocal said
            if not said:
                print(line, flush=True)
                said = True

        def on_retry(attempts: int) -> None:
            if attempts == ATTEMPTS:
                on_slow()
                print(attempts_hint(self.superlink, device_tls, attempts), flush=True)

        joining = wait_joined(self._joined_fd, waiting, JOIN_PATIENCE_S, on_slow, on_retry=on_retry)
        os.close(self._joined_fd)
        return joining

    def _wait_listening(self, waiting: Callable[[], bool]) -> None:
        """Until the SuperNode's Runtime API accepts connections (or it exits, or ``waiting()`` turns false)."""
        while waiting():
            with socket.socket() as s:  # TCP over IPv4
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.1)
