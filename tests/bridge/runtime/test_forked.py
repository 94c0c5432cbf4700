"""bridge/runtime/forked.py: the SuperNode's signals in the launcher's fork.

Each case forks this process (Flower is imported), sets the SuperNode's signal handlers as
``run_supernode`` does, then as Flower's ``start_client_internal`` does, and signals itself.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable

from flwr.supercore.exit import register_signal_handlers
from flwr.supercore.telemetry import EventType

from bridge.runtime import forked


def _in_a_fork(body: Callable[[int], None]) -> tuple[bytes, int]:
    """What ``body(fd)`` wrote to ``fd`` in a fork, and the fork's exit code (its SystemExit's, 0 if none)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover -- the fork
        os.close(read)
        os.environ["FLWR_TELEMETRY_ENABLED"] = "0"
        code: object = 0
        try:
            body(write)
        except SystemExit as exc:
            code = exc.code
        except BaseException:  # noqa: BLE001
            code = 99
        os._exit(code if isinstance(code, int) else 98)
    os.close(write)
    _, status = os.waitpid(pid, 0)
    with os.fdopen(read, "rb") as said:
        return said.read(), os.waitstatus_to_exitcode(status)


def _a_supernode_told_twice(fd: int) -> None:
    forked._one_goodbye()
    register_signal_handlers(event_type=EventType.RUN_SUPERNODE_LEAVE, exit_message="leaving")
    try:
        os.kill(os.getpid(), signal.SIGTERM)  # Ctrl-C or ``kill`` of the group: Flower's graceful exit begins
        time.sleep(5)
    finally:  # where Flower's connection says goodbye (DeactivateNode)
        os.kill(os.getpid(), signal.SIGTERM)  # the stopping launcher's own SIGTERM to its SuperNode
        time.sleep(0.05)
        os.write(fd, b"goodbye")


def test_a_second_signal_does_not_cut_the_supernodes_goodbye_short() -> None:
    """Flower puts back the handlers it found; ``SIG_DFL`` there killed the node before it told the SuperLink."""
    assert _in_a_fork(_a_supernode_told_twice) == (b"goodbye", 0)


def _a_supernode_told_before_flower_listens(fd: int) -> None:
    forked._one_goodbye()
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(5)
    os.write(fd, b"went on")


def test_a_signal_before_flowers_handlers_ends_the_fork_at_once() -> None:
    start = time.monotonic()
    assert _in_a_fork(_a_supernode_told_before_flower_listens) == (b"", 128 + signal.SIGINT)
    assert time.monotonic() - start < 4
