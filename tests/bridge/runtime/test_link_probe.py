"""Whether the SuperLink a device cannot reach speaks TLS (bridge/runtime/link_probe.py), asked of real servers on
loopback, and what the launcher tells the operator after failed attempts."""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from bridge.runtime.link_probe import attempts_hint, host_port, speaks_tls
from experiments.deployment.pki import make_certificates
from experiments.flower.flower_procs import free_port


def test_attempts_that_fail_against_nothing_ask_whether_the_superlink_runs_and_uses_tls() -> None:
    """Nothing listens at the address: the launcher cannot tell a mismatch, and asks both questions."""
    hint = attempts_hint(f"127.0.0.1:{free_port()}", device_tls=False, attempts=3)
    assert "3 attempts to reach the SuperLink" in hint and "is the SuperLink using TLS?" in hint
    assert "It is" not in hint and "This device connects in plain text (--insecure)" in hint


@contextmanager
def _server(tls_folder: Path | None) -> Iterator[str]:
    """A server on loopback for one connection: a TLS one with a fresh certificate, or one that answers in plain
    text; its address."""
    listener = socket.create_server(("127.0.0.1", 0))
    context = None
    if tls_folder is not None:
        certs = make_certificates(tls_folder)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(certs.server_cert, certs.server_key)

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            if context is None:
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
                return
            try:
                with context.wrap_socket(conn, server_side=True) as tls:
                    tls.recv(1)
            except OSError:  # the test's own connection below, that asks nothing
                pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    address = f"127.0.0.1:{listener.getsockname()[1]}"
    try:
        yield address
    finally:
        if thread.is_alive():  # nobody asked: release the server
            socket.create_connection(host_port(address) or ("", 0), timeout=5).close()
        thread.join(timeout=10)
        listener.close()


def test_an_address_splits_at_its_last_colon_and_needs_a_port() -> None:
    assert host_port("10.0.0.1:8000") == ("10.0.0.1", 8000)
    assert host_port("[::1]:8000") == ("::1", 8000) and host_port("[fe80::1]:9") == ("fe80::1", 9)
    assert host_port("XBOX:1") == ("XBOX", 1)
    for bad in ("10.0.0.1", "host:", "host:80a", ":x"):
        assert host_port(bad) is None, bad


def test_a_tls_server_a_plain_one_and_nothing_are_told_apart(tmp_path: Path) -> None:
    with _server(tmp_path) as address:
        assert speaks_tls(address) is True
    with _server(None) as address:
        assert speaks_tls(address) is False
    assert speaks_tls(f"127.0.0.1:{free_port()}") is None and speaks_tls("127.0.0.1") is None
    silent = socket.create_server(("127.0.0.1", 0))  # connects (the backlog), never answers
    reset = threading.Timer(3.0, silent.close)  # then resets the connection: a probe that would wait for ever ends
    reset.start()
    try:
        start = time.monotonic()
        assert speaks_tls(f"127.0.0.1:{silent.getsockname()[1]}", timeout=0.2) is None
        assert time.monotonic() - start < 2.5  # its own timeout ended it
    finally:
        reset.cancel()
        silent.close()


def test_a_plain_text_device_against_a_tls_superlink_is_told_to_use_the_ca(tmp_path: Path) -> None:
    with _server(tmp_path) as address:
        assert attempts_hint(address, device_tls=False, attempts=3) == (
            f"launcher: 3 attempts to reach the SuperLink at {address} failed. Is the SuperLink using TLS? It is (it "
            "answers a TLS handshake), and this device connects in plain text (--insecure): give the SuperNode the "
            "CA certificate that signed the SuperLink's (--root-certificates ca.crt) instead of --insecure "
            '(docs/deployment.md, "When a device is refused")'
        )


@pytest.mark.parametrize(("device_tls", "mode"), [(True, "TLS"), (False, "plain text (--insecure)")])
def test_otherwise_both_questions_are_asked_naming_how_the_device_connects(
    tmp_path: Path, device_tls: bool, mode: str
) -> None:
    with _server(tmp_path if device_tls else None) as address:  # a TLS device asks no server whether it speaks TLS
        hint = attempts_hint(address, device_tls=device_tls, attempts=4)
    assert hint == (
        f"launcher: 4 attempts to reach the SuperLink at {address} failed; the SuperNode goes on retrying. Is the "
        f"SuperLink running at that address, and is the SuperLink using TLS? This device connects in {mode}"
    )
