"""Whether a device's SuperNode has joined the SuperLink, and why it did not.

A ``flower-supernode`` (Flower 1.41) opens its local Runtime API at once, then
connects to the SuperLink, retrying for as long as the SuperLink cannot be
reached (``--max-retries``: no limit by default). Once the SuperLink has
accepted it (with SuperNode authentication: its public key is registered and
not already online) it logs ``SuperNode ID: N``. The launcher
(:mod:`bridge.runtime.launcher`) forks the SuperNode; :func:`report_joining` in that
fork writes the node id to a pipe when that line is logged, so that the
launcher says it is ready only when the device can take part in rounds.

When it cannot join, the SuperNode logs Flower's exit code and a message
(``Exit Code: 305``, ``[code: 2004] Failed to activate SuperNode``) and exits
with status 1; the message names only the symptom, and the reason may be in
the SuperLink's log. :func:`exit_hint` gives the device side the likely causes
and fixes (``docs/deployment.md``, "When a device is refused").
"""

from __future__ import annotations

import json
import logging
import os
import re
import select
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

JOINED_LOG = "SuperNode ID: %s"  # what flower-supernode logs once the SuperLink has accepted it (Flower 1.41)
RETRY_LOG = "Connection attempt failed, retrying in %.2f seconds"  # Flower's retry of an unreachable SuperLink
EXIT_LOG = re.compile(r"Exit Code: (\d+)")  # how flwr_exit's message starts; the process itself exits with 1
KEY_INVALID = 302  # Flower's ExitCode.SUPERNODE_NODE_AUTH_KEY_INVALID
CONNECTION_ERROR = 305  # Flower's ExitCode.SUPERNODE_CONNECTION_ERROR
ACTIVATION_FAILED = "[code: 2004]"  # the SuperLink's API error: it would not activate this node's key
TLS_FAILED = "CERTIFICATE_VERIFY_FAILED"
NOT_TLS = ("WRONG_VERSION_NUMBER", "record layer failure", "packet length too long")  # OpenSSL: no TLS answered


@dataclass(frozen=True)
class Joining:
    """How the SuperNode's start ended: the node id it got, or the Flower exit code and message it gave up with."""

    node: int | None = None
    flower_exit: int | None = None
    message: str = ""


class _Reporter(logging.Handler):
    """Writes one JSON line to ``fd`` when the SuperNode logs its node id, one when it gives up, and one per
    failed connection attempt."""

    def __init__(self, fd: int) -> None:
        super().__init__(logging.INFO)
        self.fd: int | None = fd

    def emit(self, record: logging.LogRecord) -> None:
        if self.fd is None:
            return
        if record.msg == JOINED_LOG and isinstance(record.args, tuple) and record.args:
            report: dict[str, object] = {"node": int(str(record.args[0]))}
        elif isinstance(record.msg, str) and (match := EXIT_LOG.match(record.msg)):
            report = {"flower_exit": int(match[1]), "message": record.msg[:2000]}
        elif record.msg == RETRY_LOG:
            report = {"retry": True}
        else:
            return
        try:
            os.write(self.fd, (json.dumps(report) + "\n").encode())
        except OSError:  # the launcher no longer listens: nothing more to tell
            self.fd = None


def report_joining(fd: int) -> logging.Handler:
    """In the SuperNode's process: report to ``fd`` when the SuperLink accepts it, or how it gives up."""
    handler = _Reporter(fd)
    logging.getLogger("flwr").addHandler(handler)
    return handler


def wait_joined(
    fd: int,
    waiting: Callable[[], bool],
    patience_s: float,
    on_slow: Callable[[], None],
    poll_s: float = 0.2,
    on_retry: Callable[[int], None] = lambda attempts: None,
) -> Joining:
    """Block until the SuperNode reports its node id on ``fd``; ``on_slow()`` once after ``patience_s`` without it,
    and ``on_retry(n)`` after its ``n``-th failed connection attempt.

    Returns without a node id when the pipe closes (the SuperNode exited), or
    when nothing is left to read and ``waiting()`` is false; what the SuperNode
    wrote before it exited is read first.
    """
    deadline, slow, buffer, last, retries = time.monotonic() + patience_s, False, b"", Joining(), 0
    while True:
        if select.select([fd], [], [], poll_s)[0]:
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            *lines, buffer = (buffer + chunk).split(b"\n")
            for line in lines:
                report = json.loads(line)
                if report.pop("retry", False):
                    retries += 1
                    on_retry(retries)
                    continue
                last = Joining(**report)
                if last.node is not None:
                    return last
        elif not waiting():
            break
        elif not slow and time.monotonic() > deadline:
            on_slow()
            slow = True
    return last


def superlink_of(supernode: Sequence[str]) -> str:
    """The SuperLink address in a ``flower-supernode`` command line (``--superlink HOST:PORT``)."""
    for i, arg in enumerate(supernode):
        if arg == "--superlink" and i + 1 < len(supernode):
            return supernode[i + 1]
        if arg.startswith("--superlink="):
            return arg.split("=", 1)[1]
    return "flower-supernode's default address"


def exit_hint(joining: Joining, superlink: str) -> str | None:
    """What the way the SuperNode gave up most likely means on a device, and what to do; ``None``: nothing to add."""
    if joining.flower_exit == KEY_INVALID:
        return (
            "the key given with --auth-supernode-private-key cannot be read: Flower needs an elliptic curve "
            "private key (P-384 here) in OpenSSH format. A PEM key from openssl converts in place with "
            '`ssh-keygen -p -N "" -f KEY` (docs/deployment.md, "Your own CA, server certificate and keys")'
        )
    if joining.flower_exit != CONNECTION_ERROR:
        return None
    if ACTIVATION_FAILED in joining.message:
        return (
            f"the SuperLink at {superlink} refused this SuperNode; the SuperLink's log says why. "
            "'No SuperNode found with the given public key': register this device's public key on the "
            "SuperLink first (flwr supernode register KEY.pub CONNECTION). 'could not be activated': this key "
            "is still online from an earlier start that did not stop cleanly; it lapses within a minute, "
            "then start again (the systemd unit retries by itself)"
        )
    if any(sign in joining.message for sign in NOT_TLS):
        return (
            f"the SuperLink at {superlink} does not answer in TLS, and this device connects with TLS "
            "(--root-certificates): the SuperLink may run with --insecure. Start it with its certificates, or "
            "(on a trusted network only) start the device with --insecure"
        )
    if TLS_FAILED in joining.message:
        host = superlink.rsplit(":", 1)[0].strip("[]")
        return (
            f"the SuperLink's certificate was not accepted: the CA certificate given with --root-certificates "
            f"must be the one that signed it, and the certificate's subjectAltName must name {host} "
            "(an IP: or DNS: entry)"
        )
    return f"the SuperNode could not join the SuperLink at {superlink}; the lines above say why"
