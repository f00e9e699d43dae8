"""Who may call the limiter, both sides: the shared bearer token (sent as call metadata by the
client, compared in constant time by the server's interceptor) and the TLS credentials, built from
LimiterSettings. The client imports this module, so it holds nothing server-only."""

from __future__ import annotations

import hmac
from pathlib import Path
from typing import Any

import grpc

from services.common.settings import SettingsError
from services.limiter.settings import LimiterSettings

AUTHORIZATION = "authorization"


def bearer_metadata(token: str | None) -> tuple[tuple[str, str], ...] | None:
    """Call metadata carrying the token, or None when no token is configured."""
    return None if token is None else ((AUTHORIZATION, f"Bearer {token}"),)


def token_matches(metadata: Any, expected: str) -> bool:
    """Exactly one ``authorization: Bearer <token>`` entry, compared in constant time."""
    values = [value for key, value in (metadata or ()) if key == AUTHORIZATION]
    if len(values) != 1 or not isinstance(values[0], str):
        return False
    scheme, _, presented = values[0].partition(" ")
    # compare_digest always runs, so a wrong scheme costs what a wrong token costs.
    same = hmac.compare_digest(presented.strip().encode(), expected.encode())
    return same and scheme.lower() == "bearer"


def read_pem(name: str, path: Path) -> bytes:
    """The file named by setting ``name``, read once at start; a missing or non-PEM file is a
    settings error naming the variable."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise SettingsError(f"{name}={path} cannot be read: {exc.strerror}") from None
    if b"-----BEGIN " not in data:
        raise SettingsError(f"{name}={path} is not a PEM file")
    return data


def server_credentials(settings: LimiterSettings) -> Any:
    """``grpc.ServerCredentials`` for TLS (client certificates required when a client CA is set),
    or None for a plaintext port."""
    if settings.tls_cert is None or settings.tls_key is None:
        return None
    key = read_pem("FATURA_LIMITER_TLS_KEY", settings.tls_key)
    cert = read_pem("FATURA_LIMITER_TLS_CERT", settings.tls_cert)
    client_ca = (
        None
        if settings.tls_client_ca is None
        else read_pem("FATURA_LIMITER_TLS_CLIENT_CA", settings.tls_client_ca)
    )
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=client_ca, require_client_auth=client_ca is not None
    )


def channel_credentials(settings: LimiterSettings) -> Any:
    """``grpc.ChannelCredentials`` for a TLS channel to the limiter (with the client's certificate
    when set), or None for a plaintext channel."""
    if settings.tls_ca is None:
        return None
    ca = read_pem("FATURA_LIMITER_TLS_CA", settings.tls_ca)
    key = cert = None
    if settings.tls_client_cert is not None and settings.tls_client_key is not None:
        key = read_pem("FATURA_LIMITER_TLS_CLIENT_KEY", settings.tls_client_key)
        cert = read_pem("FATURA_LIMITER_TLS_CLIENT_CERT", settings.tls_client_cert)
    return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)
