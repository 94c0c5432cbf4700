"""Whether a device's SuperNode joined the SuperLink (bridge/runtime/joining.py): what the SuperNode's log is
reported as through a pipe, how the launcher waits on it, and the hint for each way a SuperNode gives up."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from logging import ERROR, INFO
from typing import Any

import pytest
from flwr.common.logger import log as flower_log

from bridge.runtime.joining import RETRY_LOG, Joining, exit_hint, report_joining, superlink_of, wait_joined


@contextmanager
def _reporting() -> Iterator[int]:
    """The read end of a pipe that the SuperNode's reporter writes to while the block logs; the write end is
    closed on the way out, as when the SuperNode exits."""
    read, write = os.pipe()
    reporter = report_joining(write)
    try:
        yield read
    finally:
        logging.getLogger("flwr").removeHandler(reporter)
        os.close(write)


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        ([(INFO, "Starting Flower SuperNode"), (INFO, "SuperNode ID: %s", 42)], Joining(node=42)),
        (
            [(ERROR, "Exit Code: 305\n[code: 2004] Failed")],
            Joining(flower_exit=305, message="Exit Code: 305\n[code: 2004] Failed"),
        ),
        ([(INFO, "SuperNode terminated gracefully.")], Joining()),
    ],
)
def test_the_launcher_learns_from_the_supernodes_log_whether_it_joined(
    lines: list[tuple[Any, ...]], expected: Joining
) -> None:
    with _reporting() as read:
        for line in lines:
            flower_log(*line)
    assert wait_joined(read, lambda: True, 60.0, lambda: None) == expected
    os.close(read)


def test_a_refused_supernode_gets_a_hint_naming_the_likely_cause() -> None:
    assert superlink_of(["flower-supernode", "--superlink", "10.0.0.1:8000"]) == "10.0.0.1:8000"
    assert superlink_of(["flower-supernode", "--superlink=h:1"]) == "h:1"
    assert "ssh-keygen -p" in str(exit_hint(Joining(flower_exit=302), "h:1"))
    refused = str(exit_hint(Joining(flower_exit=305, message="Exit Code: 305\n[code: 2004] Failed to activate"), "h:1"))
    assert "flwr supernode register" in refused and "h:1" in refused
    tls = Joining(flower_exit=305, message="[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed")
    assert "subjectAltName must name h (an IP: or DNS: entry)" in str(exit_hint(tls, "h:1"))
    assert exit_hint(Joining(flower_exit=1), "h:1") is None and exit_hint(Joining(), "h:1") is None


def test_a_tls_device_against_a_plain_text_superlink_gets_a_hint_naming_it() -> None:
    joining = Joining(flower_exit=305, message="Exit Code: 305\n[SSL: WRONG_VERSION_NUMBER] wrong version number")
    hint = exit_hint(joining, "10.0.0.1:8000")
    assert hint is not None and "does not answer in TLS, and this device connects with TLS" in hint


def _reports(*lines: tuple[Any, ...]) -> list[dict[str, Any]]:
    """What the SuperNode's process reports for ``lines`` logged through Flower's logger."""
    with _reporting() as read:
        for line in lines:
            flower_log(*line)
    return _read_reports(read)


def _read_reports(read: int) -> list[dict[str, Any]]:
    with os.fdopen(read) as f:
        return [json.loads(line) for line in f]


def test_the_node_id_an_exit_code_and_each_retry_are_reported_and_nothing_else() -> None:
    exit_line = "Exit Code: 305\n" + "x" * 3000
    assert (
        _reports(
            (INFO, "SuperNode ID: %s", "42"),
            (INFO, RETRY_LOG, 1.5),
            (ERROR, exit_line),
            (INFO, "SuperNode ID: %s"),  # no id given
            (INFO, "Starting Flower SuperNode"),
            (INFO, "Exit Code 305"),
        )
        == [{"node": 42}, {"retry": True}, {"flower_exit": 305, "message": exit_line[:2000]}]
    )


def test_only_flowers_logger_is_heard() -> None:
    with _reporting() as read:
        logging.getLogger("elsewhere").warning("SuperNode ID: %s", 9)  # not Flower's: whatever it says
        flower_log(INFO, "SuperNode ID: %s", 4)
    assert _read_reports(read) == [{"node": 4}]


def test_a_reporter_whose_reader_is_gone_stops_reporting_without_an_error() -> None:
    read, write = os.pipe()
    reporter = report_joining(write)
    try:
        os.close(read)
        flower_log(INFO, "SuperNode ID: %s", 7)  # EPIPE: the launcher no longer listens
        assert reporter.fd is None  # type: ignore[attr-defined]
        flower_log(INFO, "SuperNode ID: %s", 8)
    finally:
        logging.getLogger("flwr").removeHandler(reporter)
        os.close(write)


@contextmanager
def _gone_after(write: int, seconds: float) -> Iterator[None]:
    """The pipe's write end closed on the way out, or after ``seconds`` (the SuperNode gone): a wait that would
    never look at ``waiting()`` ends then, rather than hang the test."""
    closed = threading.Event()

    def gone() -> None:
        os.close(write)
        closed.set()

    timer = threading.Timer(seconds, gone)
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        timer.join()
        if not closed.is_set():
            os.close(write)


def test_the_wait_counts_retries_reads_split_lines_and_returns_the_node_at_once() -> None:
    read, write = os.pipe()
    retries: list[int] = []
    os.write(write, b'{"retry": true}\n{"retry": true}\n{"flower_exit": 305, "mess')
    os.write(write, b'age": "m"}\n{"node": 5}\n{"node": 6}\n')
    with _gone_after(write, 3.0):
        joined = wait_joined(read, lambda: True, 60.0, lambda: None, poll_s=0.01, on_retry=retries.append)
    assert joined == Joining(node=5) and retries == [1, 2]
    os.close(read)


def test_the_wait_ends_when_the_supernode_is_gone_and_says_once_that_it_is_slow() -> None:
    read, write = os.pipe()
    os.write(write, b'{"flower_exit": 305, "message": "refused"}\n')
    slow: list[float] = []
    start = time.monotonic()

    def waiting() -> bool:
        return time.monotonic() - start < 1.0

    with _gone_after(write, 5.0):
        joined = wait_joined(read, waiting, 0.05, lambda: slow.append(time.monotonic() - start), poll_s=0.01)
        assert joined == Joining(flower_exit=305, message="refused")  # the last report, read before it gave up
        assert len(slow) == 1 and 0.05 <= slow[0] < 1.0 and 1.0 <= time.monotonic() - start < 4.5
    assert wait_joined(read, lambda: True, 60.0, lambda: None, poll_s=0.01) == Joining()  # closed: nothing more
    os.close(read)


def test_the_superlinks_address_is_read_from_the_supernodes_command() -> None:
    assert superlink_of(["flower-supernode", "--insecure", "--superlink", "h:2", "--superlink=x:3"]) == "h:2"
    assert superlink_of(["flower-supernode", "--insecure", "--superlink=x:3", "--superlink", "h:2"]) == "x:3"
    assert superlink_of(["flower-supernode", "--superlink"]) == "flower-supernode's default address"
    assert superlink_of(["flower-supernode", "--superlink=a=b:1"]) == "a=b:1"


def test_each_way_of_giving_up_gets_its_whole_hint() -> None:
    assert exit_hint(Joining(flower_exit=302), "h:1") == (
        "the key given with --auth-supernode-private-key cannot be read: Flower needs an elliptic curve private "
        "key (P-384 here) in OpenSSH format. A PEM key from openssl converts in place with "
        '`ssh-keygen -p -N "" -f KEY` (docs/deployment.md, "Your own CA, server certificate and keys")'
    )
    refused = Joining(flower_exit=305, message="Exit Code: 305\n[code: 2004] Failed to activate")
    assert exit_hint(refused, "h:1") == (
        "the SuperLink at h:1 refused this SuperNode; the SuperLink's log says why. 'No SuperNode found with the "
        "given public key': register this device's public key on the SuperLink first (flwr supernode register "
        "KEY.pub CONNECTION). 'could not be activated': this key is still online from an earlier start that did "
        "not stop cleanly; it lapses within a minute, then start again (the systemd unit retries by itself)"
    )
    for sign in ("WRONG_VERSION_NUMBER", "record layer failure", "packet length too long"):
        assert exit_hint(Joining(flower_exit=305, message=f"[SSL] {sign}"), "h:1") == (
            "the SuperLink at h:1 does not answer in TLS, and this device connects with TLS (--root-certificates): "
            "the SuperLink may run with --insecure. Start it with its certificates, or (on a trusted network only) "
            "start the device with --insecure"
        )
    tls = Joining(flower_exit=305, message="[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed")
    assert "must name XBOX (an IP" in str(exit_hint(tls, "XBOX:8000"))
    assert exit_hint(tls, "[::1]:8000") == (
        "the SuperLink's certificate was not accepted: the CA certificate given with --root-certificates must be "
        "the one that signed it, and the certificate's subjectAltName must name ::1 (an IP: or DNS: entry)"
    )
    assert exit_hint(Joining(flower_exit=305, message="Exit Code: 305"), "h:1") == (
        "the SuperNode could not join the SuperLink at h:1; the lines above say why"
    )


def test_without_news_the_wait_asks_whether_to_go_on_five_times_a_second() -> None:
    read, write = os.pipe()
    with _gone_after(write, 3.0):
        start = time.monotonic()
        assert wait_joined(read, lambda: False, 60.0, lambda: None) == Joining()
        assert time.monotonic() - start < 1.0  # one look of 0.2 s
    os.close(read)
