"""Whether the SuperLink a device cannot reach speaks TLS: the one mismatch Flower's SuperNode does not name.

A ``flower-supernode --insecure`` (plain text) that dials a SuperLink serving TLS sends HTTP into a TLS
handshake; the SuperLink closes the connection without a word, logs nothing, and the SuperNode
retries for ever ("Connection attempt failed"), as it would for a SuperLink that is down (Flower 1.42).
The other way round, a TLS device against a plain-text SuperLink, the handshake fails at once and the
SuperNode gives up with the SSL error (``WRONG_VERSION_NUMBER``), which :func:`bridge.runtime.joining.exit_hint`
turns into advice.

After :data:`ATTEMPTS` failed attempts the launcher (:mod:`bridge.runtime.launcher`) asks
:func:`attempts_hint`: it opens one TLS handshake to the SuperLink's address (no certificate check: it
only asks whether TLS answers) and names the mismatch when it finds one, else asks whether the
SuperLink is running there and whether it uses TLS.
"""

from __future__ import annotations

import socket
import ssl

ATTEMPTS = 3
"""Failed connection attempts (Flower's, a few seconds apart) before the launcher says what may be wrong."""
PROBE_TIMEOUT_S = 3.0


def host_port(address: str) -> tuple[str, int] | None:
    """``HOST:PORT`` or ``[V6]:PORT`` split; ``None`` if it has no port."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def speaks_tls(address: str, timeout: float = PROBE_TIMEOUT_S) -> bool | None:
    """Whether a TLS handshake with ``address`` succeeds (``None``: nothing answers there, or no port given)."""
    where = host_port(address)
    if where is None:
        return None
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE  # only whether TLS answers, not whom
    try:
        with socket.create_connection(where, timeout=timeout) as raw, context.wrap_socket(raw) as tls:
            return tls.version() is not None
    except ssl.SSLError:
        return False  # something answered, not in TLS
    except OSError:
        return None


def attempts_hint(superlink: str, device_tls: bool, attempts: int) -> str:
    """What to tell the operator after ``attempts`` failed attempts to reach ``superlink``."""
    said = f"launcher: {attempts} attempts to reach the SuperLink at {superlink} failed"
    if not device_tls and speaks_tls(superlink):
        return (
            f"{said}. Is the SuperLink using TLS? It is (it answers a TLS handshake), and this device connects "
            "in plain text (--insecure): give the SuperNode the CA certificate that signed the SuperLink's "
            '(--root-certificates ca.crt) instead of --insecure (docs/deployment.md, "When a device is refused")'
        )
    mode = "TLS" if device_tls else "plain text (--insecure)"
    return (
        f"{said}; the SuperNode goes on retrying. Is the SuperLink running at that address, and is the SuperLink "
        f"using TLS? This device connects in {mode}"
    )
