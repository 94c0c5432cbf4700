"""The launcher's watch over its SuperNode (bridge/runtime/supernode_child.py), in this process.

The fork it is given (the launcher's ``_fork``) is one that forks this process into a child playing the
SuperNode's part: it opens the Runtime API's port on loopback and writes the reports a real SuperNode's
log gives (:mod:`bridge.runtime.joining`). A real SuperNode under the launcher is in test_launcher.py.
"""

from __future__ import annotations

import io
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from bridge.runtime.forked import run_supernode
from bridge.runtime.joining import Joining
from bridge.runtime.link_probe import ATTEMPTS, attempts_hint
from bridge.runtime.supernode_child import JOIN_PATIENCE_S, Restarts, SuperNodeChild
from experiments.flower.flower_procs import free_port

RETRY = b'{"retry": true}\n'


def test_restarts_wait_2_s_doubling_up_to_a_minute_and_2_s_again_once_joined() -> None:
    restarts = Restarts()
    assert [restarts.next() for _ in range(7)] == [2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0]
    restarts.joined()
    assert [restarts.next() for _ in range(2)] == [2.0, 4.0]


@pytest.fixture
def children() -> Iterator[list[int]]:
    """The pids of the children the test forked, killed and reaped on the way out whatever the test did."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass


def _playing(part: Callable[[int, socket.socket | None], None], port: int, forks: list[Any], pids: list[int]) -> Any:
    """A fork whose child opens ``port`` on loopback (unless ``port`` is 0) and runs ``part(report_fd, listener)``."""

    def fork(target: Callable[..., Any], command: list[str], report_fd: int, backoff: bool) -> int:
        forks.append((target, command, backoff))
        pid = os.fork()
        if pid == 0:  # pragma: no cover -- the child
            code = 0
            for sig in (signal.SIGINT, signal.SIGTERM):  # as the launcher's fork: not the handlers of the test's runner
                signal.signal(sig, signal.SIG_DFL)
            try:
                listener = socket.create_server(("127.0.0.1", port)) if port else None
                part(report_fd, listener)
            except BaseException:  # noqa: BLE001
                code = 99
            os._exit(code)
        pids.append(pid)
        return pid

    return fork


class _File(io.RawIOBase):
    """A log file: what reached it, as bytes."""

    def __init__(self) -> None:
        super().__init__()
        self.data = bytearray()

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        self.data += bytes(b)
        return len(b)


def _logged(monkeypatch: pytest.MonkeyPatch) -> _File:
    """The launcher's standard output as a supervisor's log gets it: buffered, so only what is flushed arrives
    (set in the test's body: pytest puts its own capture back after the fixtures)."""
    file = _File()
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(io.BufferedWriter(file), encoding="utf-8"))
    return file


def _within_10_s() -> Callable[[], bool]:
    """A launcher waits as long as its SuperNode lives; a test, 10 s."""
    deadline = time.monotonic() + 10
    return lambda: time.monotonic() < deadline


def _command(superlink: str) -> list[str]:
    return ["flower-supernode", "--insecure", "--superlink", superlink]


def _silent_then_joins(report_fd: int, listener: socket.socket | None) -> None:
    time.sleep(JOIN_PATIENCE_S + 0.5)  # past the patience: the launcher says it waits
    os.write(report_fd, RETRY * ATTEMPTS + b'{"node": 7}\n')  # after the attempts: not said a second time
    time.sleep(60)


def test_a_supernode_that_joins_after_retries_is_said_to_be_waited_for_once_and_the_likely_cause(
    monkeypatch: pytest.MonkeyPatch, children: list[int]
) -> None:
    port, superlink, forks, logged = free_port(), f"127.0.0.1:{free_port()}", [], _logged(monkeypatch)
    node = SuperNodeChild(_command(superlink), True, port, _playing(_silent_then_joins, port, forks, children))
    assert node.superlink == superlink and node.alive()
    node.start()
    assert forks == [(run_supernode, _command(superlink), True)] and node.pid == children[0]
    within, seen = _within_10_s(), []

    def waiting() -> bool:
        seen.append(logged.data.decode())
        return within()

    assert node.join(waiting) == Joining(node=7)
    line = f"launcher: waiting for the SuperLink at {superlink} (the SuperNode retries until it connects)\n"
    assert line in seen  # in the log while the SuperNode was still silent
    assert logged.data.decode() == f"{line}{attempts_hint(superlink, False, ATTEMPTS)}\n"
    assert "plain text (--insecure)" in attempts_hint(superlink, False, ATTEMPTS)
    with pytest.raises(OSError):
        os.fstat(node._joined_fd)  # closed: the next start opens its own pipe
    assert node.alive() and node.returncode is None
    os.kill(node.pid, signal.SIGTERM)
    assert _ended(node) == -signal.SIGTERM


def _retries_then_joins_at_once(report_fd: int, listener: socket.socket | None) -> None:
    os.write(report_fd, RETRY * ATTEMPTS + b'{"node": 8}\n')
    time.sleep(60)


def test_a_device_on_tls_is_told_so_after_its_failed_attempts(
    monkeypatch: pytest.MonkeyPatch, children: list[int]
) -> None:
    port, superlink, logged = free_port(), f"127.0.0.1:{free_port()}", _logged(monkeypatch)
    command = ["flower-supernode", "--root-certificates", "ca.crt", "--superlink", superlink]
    node = SuperNodeChild(command, False, port, _playing(_retries_then_joins_at_once, port, [], children))
    node.start()
    assert node.join(_within_10_s()) == Joining(node=8)
    hint = attempts_hint(superlink, True, ATTEMPTS)
    assert "This device connects in TLS" in hint and logged.data.decode().splitlines()[1] == hint


def _gives_up(report_fd: int, listener: socket.socket | None) -> None:
    os.write(report_fd, b'{"flower_exit": 302, "message": "Exit Code: 302"}\n')
    os._exit(1)


def test_a_supernode_that_gives_up_is_reported_with_flowers_code_and_its_exit(
    capsys: pytest.CaptureFixture[str], children: list[int]
) -> None:
    port, forks = free_port(), []
    node = SuperNodeChild(_command("127.0.0.1:9092"), False, port, _playing(_gives_up, port, forks, children))
    node.start()
    assert forks == [(run_supernode, _command("127.0.0.1:9092"), False)]
    assert node.join(node.alive) == Joining(flower_exit=302, message="Exit Code: 302")  # as the launcher waits
    assert capsys.readouterr().out == ""
    assert _ended(node) == 1


def _ended(node: SuperNodeChild) -> int | None:
    """The node's exit code once :meth:`SuperNodeChild.alive` has seen it end (within 10 s)."""
    deadline = time.monotonic() + 10
    while node.alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    return node.returncode


def _exits(report_fd: int, listener: socket.socket | None) -> None:
    os._exit(3)


def test_a_supernode_that_exits_has_its_code_kept(children: list[int]) -> None:
    port = free_port()
    node = SuperNodeChild(_command("127.0.0.1:9092"), False, port, _playing(_exits, 0, [], children))
    node.start()
    assert _ended(node) == 3
    assert not node.alive() and node.returncode == 3  # asked again: reaped already, the code stays


def test_a_supernode_reaped_elsewhere_counts_as_ended_with_0(children: list[int]) -> None:
    node = SuperNodeChild(_command("127.0.0.1:9092"), False, free_port(), _playing(_exits, 0, [], children))
    node.start()
    os.waitpid(node.pid, 0)
    assert not node.alive() and node.returncode == 0


def _silent(report_fd: int, listener: socket.socket | None) -> None:
    time.sleep(60)


@pytest.mark.parametrize("listening", [False, True])
def test_the_wait_ends_when_the_launcher_stops_waiting(listening: bool, children: list[int]) -> None:
    """Before the Runtime API listens, or after, while the SuperNode says nothing: ``waiting()`` turning false
    ends the wait with no node."""
    port, looks = free_port(), []

    def waiting() -> bool:
        looks.append(time.monotonic())
        return len(looks) < 4

    node = SuperNodeChild(
        _command("127.0.0.1:9092"), False, port, _playing(_silent, port if listening else 0, [], children)
    )
    node.start()
    start = time.monotonic()
    assert node.join(waiting) == Joining()
    # listening: one look finds the port open and three wait for a report; else four at the port, one at the pipe
    assert len(looks) == (4 if listening else 5) and time.monotonic() - start < 3
    assert node.alive()
