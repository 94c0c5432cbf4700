"""Whether a device's SuperNode has joined the SuperLink, and why it did not.

A ``flower-supernode`` (Flower 1.41) opens its local Runtime API at once, then
connects to the SuperLink, retrying for as long as the SuperLink cannot be
reached (``--max-retries``: no limit by default). Once the SuperLink has
accepted it (with SuperNode authentication: its public key is registered and
not already online) it logs ``SuperNode ID: N``. The launcher
(:mod:`clients.launcher`) forks the SuperNode; :func:`report_joining` in that
fork writes the node id to a pipe when that line is logged, so that the
launcher says it is ready only when the device can take part in rounds.

When the SuperLink refuses the node, the SuperNode logs Flower's exit code
(``Exit Code: 305``) and exits with status 1; its message names only the
symptom, and the reason is in the SuperLink's log. :func:`exit_hint` gives the
device side the likely causes (``docs/deployment.md``, "When a device is
refused").
"""

from __future__ import annotations

import logging
import os
import re
import select
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

JOINED_LOG = "SuperNode ID: %s"  # what flower-supernode logs once the SuperLink has accepted it (Flower 1.41)
EXIT_LOG = re.compile(r"Exit Code: (\d+)")  # how flwr_exit's message starts; the process itself exits with 1
KEY_INVALID = 302  # Flower's ExitCode.SUPERNODE_NODE_AUTH_KEY_INVALID
CONNECTION_ERROR = 305  # Flower's ExitCode.SUPERNODE_CONNECTION_ERROR


@dataclass(frozen=True)
class Joining:
    """How the SuperNode's start ended: the node id it got, or the Flower exit code it logged (or neither)."""

    node: int | None = None
    flower_exit: int | None = None


class _Reporter(logging.Handler):
    """Writes ``joined ID`` or ``exit CODE`` lines to ``fd`` as the SuperNode logs them."""

    def __init__(self, fd: int) -> None:
        super().__init__(logging.INFO)
        self.fd = fd

    def emit(self, record: logging.LogRecord) -> None:
        if self.fd < 0:
            return
        if record.msg == JOINED_LOG and isinstance(record.args, tuple) and record.args:
            line = f"joined {record.args[0]}\n"
        elif isinstance(record.msg, str) and (match := EXIT_LOG.match(record.msg)):
            line = f"exit {match[1]}\n"
        else:
            return
        try:
            os.write(self.fd, line.encode())
        except OSError:  # the launcher no longer listens: nothing more to tell
            self.fd = -1


def report_joining(fd: int) -> logging.Handler:
    """In the SuperNode's process: report to ``fd`` when the SuperLink accepts it, or with what code it gives up."""
    handler = _Reporter(fd)
    logging.getLogger("flwr").addHandler(handler)
    return handler


def wait_joined(
    fd: int, waiting: Callable[[], bool], patience_s: float, on_slow: Callable[[], None], poll_s: float = 0.2
) -> Joining:
    """Block until the SuperNode reports its node id on ``fd``; ``on_slow()`` once after ``patience_s`` without it.

    Returns without a node id when the pipe closes (the SuperNode exited), or
    when nothing is left to read and ``waiting()`` is false; what the SuperNode
    wrote before it exited is read first.
    """
    deadline, slow, buffer, code = time.monotonic() + patience_s, False, b"", None
    while True:
        if select.select([fd], [], [], poll_s)[0]:
            chunk = os.read(fd, 256)
            if not chunk:
                break
            *lines, buffer = (buffer + chunk).split(b"\n")
            for kind, _, value in (line.decode(errors="replace").partition(" ") for line in lines):
                if kind == "joined" and value.isdigit():
                    return Joining(node=int(value))
                if kind == "exit" and value.isdigit():
                    code = int(value)
        elif not waiting():
            break
        elif not slow and time.monotonic() > deadline:
            on_slow()
            slow = True
    return Joining(flower_exit=code)


def superlink_of(supernode: Sequence[str]) -> str:
    """The SuperLink address in a ``flower-supernode`` command line (``--superlink HOST:PORT``)."""
    for i, arg in enumerate(supernode):
        if arg == "--superlink" and i + 1 < len(supernode):
            return supernode[i + 1]
        if arg.startswith("--superlink="):
            return arg.split("=", 1)[1]
    return "flower-supernode's default address"


def exit_hint(code: int, superlink: str) -> str | None:
    """What a Flower exit code of the SuperNode most likely means on a device, and what to do; ``None``: nothing to add."""
    if code == KEY_INVALID:
        return ("the key given with --auth-supernode-private-key cannot be read: Flower needs an elliptic curve "
                "private key (P-384 here) in OpenSSH format. A PEM key from openssl converts in place with "
                '`ssh-keygen -p -N "" -f KEY` (docs/deployment.md, "Your own CA, server certificate and keys")')  # fmt: skip
    if code == CONNECTION_ERROR:
        return (f"the SuperLink at {superlink} refused this SuperNode; the SuperLink's log says why. "
                "'No SuperNode found with the given public key': register this device's public key on the "
                "SuperLink first (flwr supernode register KEY.pub CONNECTION). 'could not be activated': this key "
                "is still online from an earlier start that did not stop cleanly; it lapses within a minute, "
                "then start again (the systemd unit retries by itself)")  # fmt: skip
    return None
