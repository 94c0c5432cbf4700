"""Certificates and SuperNode keys for a Flower deployment, made with ``cryptography``.

Flower's deployment runtime (SuperLink and SuperNodes, Flower 1.41 and 1.42) secures its
one HTTP endpoint with TLS: the SuperLink presents a server certificate signed
by a CA that every SuperNode and every ``flwr`` command trusts. The server
certificate must name every address clients dial as a subjectAltName (an
``IP:127.0.0.1`` entry for loopback), or the TLS handshake fails.

SuperNode authentication is separate from TLS: each SuperNode holds an elliptic
curve key pair (a NIST curve; P-384 here, as in Flower's docs) in OpenSSH
format; its public key is registered with ``flwr supernode register`` and the
SuperLink, started with ``--enable-supernode-auth``, refuses any node whose key
was not registered.

This module only writes files; nothing here knows Flower.
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALID_DAYS = 365


@dataclass(frozen=True)
class ServerCertificates:
    """PEM files for ``flower-superlink --ssl-ca-certfile/--ssl-certfile/--ssl-keyfile``."""

    ca_cert: Path
    server_cert: Path
    server_key: Path


@dataclass(frozen=True)
class NodeKeys:
    """One SuperNode's OpenSSH key pair (private key stays on the device)."""

    private: Path
    public: Path


def make_certificates(folder: Path, hosts: Sequence[str] = ("127.0.0.1", "localhost")) -> ServerCertificates:
    """Write a self-signed CA and a server certificate for ``hosts`` into ``folder``.

    Each entry of ``hosts`` becomes a subjectAltName: an IP address entry when it
    parses as one, a DNS entry otherwise. The CA key is written too
    (``ca.key``) so that more server certificates can be signed later; keep it
    off the server.

    Raises
    ------
    ValueError
        If ``hosts`` is empty.
    """
    if not hosts:
        raise ValueError("a server certificate needs at least one host name or IP address")
    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fedsketch deployment CA")])
    ca_cert = (
        _builder(ca_name, ca_name, ca_key.public_key(), now)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(cert_sign=True), critical=True)
        .sign(ca_key, hashes.SHA384())
    )
    server_key = ec.generate_private_key(ec.SECP384R1())
    server_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])])
    server_cert = (
        _builder(server_name, ca_name, server_key.public_key(), now)
        .add_extension(x509.SubjectAlternativeName([_general_name(h) for h in hosts]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(cert_sign=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA384())
    )
    out = ServerCertificates(folder / "ca.crt", folder / "server.pem", folder / "server.key")
    _write(out.ca_cert, ca_cert.public_bytes(serialization.Encoding.PEM))
    _write(folder / "ca.key", _pem_key(ca_key), private=True)
    _write(out.server_cert, server_cert.public_bytes(serialization.Encoding.PEM))
    _write(out.server_key, _pem_key(server_key), private=True)
    return out


def make_node_keys(folder: Path, name: str) -> NodeKeys:
    """Write ``NAME`` (private) and ``NAME.pub`` (public), an OpenSSH P-384 key pair."""
    folder.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP384R1())
    out = NodeKeys(folder / name, folder / f"{name}.pub")
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    )
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    _write(out.private, private, private=True)
    _write(out.public, public + f" {name}\n".encode())
    return out


def _builder(
    subject: x509.Name, issuer: x509.Name, key: ec.EllipticCurvePublicKey, now: datetime.datetime
) -> x509.CertificateBuilder:
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))  # tolerate small clock skew
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
    )


def _key_usage(cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=not cert_sign,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def _general_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _write(path: Path, data: bytes, private: bool = False) -> None:
    path.write_bytes(data)
    if private:
        path.chmod(0o600)
