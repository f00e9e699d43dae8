"""A throwaway PKI for the TLS tests, made at test time with ``cryptography``: a CA, a server
certificate for 127.0.0.1/localhost, a client certificate it signed, and a client certificate from
an unrelated CA. Nothing is committed; every run makes its own keys."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    stranger_cert: Path  # signed by another CA: the limiter must refuse it
    stranger_key: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _builder(subject: str, issuer: x509.Name, key: ec.EllipticCurvePrivateKey) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
    )


def _ca(common_name: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        _builder(common_name, _name(common_name), key)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    return cert, key


def _leaf(
    common_name: str,
    ca: tuple[x509.Certificate, ec.EllipticCurvePrivateKey],
    usage: x509.ObjectIdentifier,
    names: list[x509.GeneralName] | None = None,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (
        _builder(common_name, ca[0].subject, key)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    )
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(ca[1], hashes.SHA256()), key


def make_pki(directory: Path) -> Pki:
    ca = _ca("fatura test limiter CA")
    server = _leaf(
        "fatura-limiter",
        ca,
        ExtendedKeyUsageOID.SERVER_AUTH,
        [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))],
    )
    client = _leaf("fatura-inference-worker", ca, ExtendedKeyUsageOID.CLIENT_AUTH)
    stranger = _leaf("someone-else", _ca("an unrelated CA"), ExtendedKeyUsageOID.CLIENT_AUTH)
    pki = Pki(
        ca=directory / "ca.pem",
        server_cert=directory / "server.pem",
        server_key=directory / "server-key.pem",
        client_cert=directory / "client.pem",
        client_key=directory / "client-key.pem",
        stranger_cert=directory / "stranger.pem",
        stranger_key=directory / "stranger-key.pem",
    )
    _write_cert(pki.ca, ca[0])
    _write_cert(pki.server_cert, server[0])
    _write_key(pki.server_key, server[1])
    _write_cert(pki.client_cert, client[0])
    _write_key(pki.client_key, client[1])
    _write_cert(pki.stranger_cert, stranger[0])
    _write_key(pki.stranger_key, stranger[1])
    return pki
