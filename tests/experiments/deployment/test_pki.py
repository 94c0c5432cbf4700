"""Certificates and SuperNode keys (experiments/deployment/pki.py): what TLS clients and Flower check in them."""

from __future__ import annotations

import datetime
import ipaddress
import os
import stat
import time
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from experiments.deployment.pki import VALID_DAYS, make_certificates, make_node_keys


def _load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def _extension(cert: x509.Certificate, kind: type) -> x509.Extension:
    return cert.extensions.get_extension_for_class(kind)


def test_the_ca_signs_certificates_and_nothing_below_it_can(tmp_path: Path) -> None:
    certs = make_certificates(tmp_path / "server")
    ca = _load(certs.ca_cert)
    assert ca.subject == ca.issuer and ca.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == (
        "fedsketch deployment CA"
    )
    ca.verify_directly_issued_by(ca)
    constraints = _extension(ca, x509.BasicConstraints)
    assert constraints.critical and constraints.value.ca and constraints.value.path_length == 0
    usage = _extension(ca, x509.KeyUsage)
    assert usage.critical and usage.value.key_cert_sign and usage.value.crl_sign and not usage.value.key_agreement


def test_the_server_certificate_names_every_host_and_serves_tls_only(tmp_path: Path) -> None:
    certs = make_certificates(tmp_path, hosts=("edge.example.org", "192.168.1.10", "::1"))
    assert (certs.ca_cert.name, certs.server_cert.name, certs.server_key.name) == ("ca.crt", "server.pem", "server.key")
    ca, server = _load(certs.ca_cert), _load(certs.server_cert)
    server.verify_directly_issued_by(ca)
    assert server.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "edge.example.org"
    names = _extension(server, x509.SubjectAlternativeName)
    assert not names.critical
    assert names.value.get_values_for_type(x509.DNSName) == ["edge.example.org"]
    assert names.value.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address(a) for a in ("192.168.1.10", "::1")]
    constraints = _extension(server, x509.BasicConstraints)
    assert constraints.critical and not constraints.value.ca
    usage = _extension(server, x509.KeyUsage)
    assert usage.critical and usage.value.digital_signature and usage.value.key_agreement
    assert not usage.value.key_cert_sign and not usage.value.crl_sign
    purposes = _extension(server, x509.ExtendedKeyUsage)
    assert not purposes.critical and list(purposes.value) == [ExtendedKeyUsageOID.SERVER_AUTH]
    key = serialization.load_pem_private_key(certs.server_key.read_bytes(), None)
    assert isinstance(key, ec.EllipticCurvePrivateKey) and key.public_key() == server.public_key()
    ca_key = serialization.load_pem_private_key((tmp_path / "ca.key").read_bytes(), None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey) and ca_key.public_key() == ca.public_key()
    for private in (certs.server_key, tmp_path / "ca.key"):
        assert stat.S_IMODE(private.stat().st_mode) == 0o600
    for public in (certs.ca_cert, certs.server_cert):  # certificates are for everyone to read
        assert stat.S_IMODE(public.stat().st_mode) != 0o600


def test_certificates_are_valid_from_now_whatever_the_machines_time_zone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TZ", "Asia/Tokyo")  # UTC+9: a local clock read as UTC would start validity in the future
    time.tzset()
    try:
        certs = make_certificates(tmp_path)
    finally:
        monkeypatch.undo()
        time.tzset()
    now = datetime.datetime.now(datetime.UTC)
    for cert in (_load(certs.ca_cert), _load(certs.server_cert)):
        assert now - datetime.timedelta(minutes=6) < cert.not_valid_before_utc <= now - datetime.timedelta(minutes=4)
        assert cert.not_valid_after_utc - cert.not_valid_before_utc == datetime.timedelta(days=VALID_DAYS, minutes=5)


def test_certificates_go_into_an_existing_folder_and_need_a_host(tmp_path: Path) -> None:
    (tmp_path / "server").mkdir()
    make_certificates(tmp_path / "server")
    assert sorted(p.name for p in (tmp_path / "server").iterdir()) == ["ca.crt", "ca.key", "server.key", "server.pem"]
    with pytest.raises(ValueError, match="^a server certificate needs at least one host name or IP address$"):
        make_certificates(tmp_path / "none", hosts=())
    assert not (tmp_path / "none").exists()


def test_a_node_key_pair_is_openssh_p384_and_its_private_half_is_the_owners_only(tmp_path: Path) -> None:
    (tmp_path / "node").mkdir()
    keys = make_node_keys(tmp_path / "node", "node-7")
    assert (keys.private.name, keys.public.name) == ("node-7", "node-7.pub")
    private = serialization.load_ssh_private_key(keys.private.read_bytes(), None)
    text = keys.public.read_text()
    assert text.endswith(" node-7\n") and text.startswith("ecdsa-sha2-nistp384 ")
    public = serialization.load_ssh_public_key(text.encode())
    assert isinstance(private, ec.EllipticCurvePrivateKey) and private.public_key() == public
    assert stat.S_IMODE(keys.private.stat().st_mode) == 0o600 and os.access(keys.public, os.R_OK)


def test_the_keys_are_used_for_what_each_certificate_is_for(tmp_path: Path) -> None:
    certs = make_certificates(tmp_path)
    ca = _extension(_load(certs.ca_cert), x509.KeyUsage).value
    server = _extension(_load(certs.server_cert), x509.KeyUsage).value
    for usage in (ca, server):
        assert usage.digital_signature and not usage.content_commitment
        assert not usage.key_encipherment and not usage.data_encipherment
    assert (ca.key_cert_sign, ca.crl_sign, ca.key_agreement) == (True, True, False)
    assert (server.key_cert_sign, server.crl_sign, server.key_agreement) == (False, False, True)
    assert not server.encipher_only and not server.decipher_only
