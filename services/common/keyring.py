"""Webhook secrets at rest: the master keys (``FATURA_SECRETS_KEY``, ``FATURA_SECRETS_OLD_KEYS``) and
AES-256-GCM sealing of each secret under one of them.

A webhook secret is itself a key (the HMAC key of Standard Webhooks signatures); it is stored sealed
under a master key, with the master key's id, a fresh 96-bit nonce and the ciphertext (which ends in
the GCM tag). The associated data binds a ciphertext to its row, the endpoint id and the secret's
key id, and to the master key id, so a ciphertext copied into another row, or relabelled with
another master key id, does not open. Rows sealed under an old master key still open while that key
is listed in ``FATURA_SECRETS_OLD_KEYS``; ``fatura secrets rewrap`` moves them to the current one.

Only the processes that sign or register webhooks hold a key; this module knows no service and
does no I/O except what ``services/common/migrate.py`` asks of it.
"""

from __future__ import annotations

import base64
import os
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from services.common.settings import SettingsError

KEY_BYTES = 32
NONCE_BYTES = 12
_KEY_ID = re.compile(r"^[A-Za-z0-9_.-]{1,32}$")
_AAD_PREFIX = b"fatura/webhook-secret/v1"

# The key `fatura up`, `fatura demo` and the tests use when none is set. Everybody can read it here,
# so it protects nothing: a deployment sets its own FATURA_SECRETS_KEY.
DEVELOPMENT_KEY_ID = "local-dev"
DEVELOPMENT_KEY = DEVELOPMENT_KEY_ID + ":" + base64.b64encode(b"fatura local development key 32b").decode()

GENERATE_HINT = (
    "make one with `fatura secrets new-key`, or: python -c "
    "\"import base64, os; print('k1:' + base64.b64encode(os.urandom(32)).decode())\""
)


class KeyringError(ValueError):
    """A sealed secret that does not open: its master key is not held, or it was altered or moved."""


@dataclass(frozen=True)
class MasterKey:
    id: str
    key: bytes = field(repr=False)


@dataclass(frozen=True)
class Sealed:
    """What a ``webhook_secrets`` row stores instead of the secret."""

    master_key_id: str
    nonce: bytes
    ciphertext: bytes


def parse_key(spec: str, name: str) -> MasterKey:
    """``ID:BASE64`` (32 random bytes, standard base64) into a master key; ``name`` is the setting."""
    key_id, sep, encoded = spec.strip().partition(":")
    if not sep or not _KEY_ID.match(key_id):
        raise SettingsError(
            f"{name}: a key is written ID:BASE64, its id 1-32 letters, digits, '.', '_' or '-'; "
            + GENERATE_HINT
        )
    try:
        key = base64.b64decode(encoded.strip(), validate=True)
    except ValueError:
        raise SettingsError(f"{name}: the key {key_id!r} is not valid base64") from None
    if len(key) != KEY_BYTES:
        raise SettingsError(f"{name}: the key {key_id!r} holds {len(key)} bytes, not {KEY_BYTES}")
    return MasterKey(key_id, key)


def _aad(endpoint_id: uuid.UUID, key_id: str, master_key_id: str) -> bytes:
    # Fixed-size endpoint id, then two ids that cannot hold the separator.
    return b"|".join((_AAD_PREFIX, endpoint_id.bytes, key_id.encode(), master_key_id.encode()))


@dataclass(frozen=True)
class Keyring:
    """The current master key (seals) and the old ones (still open what they sealed)."""

    current: MasterKey
    old: tuple[MasterKey, ...] = ()

    def __post_init__(self) -> None:
        ids = [self.current.id, *(k.id for k in self.old)]
        if len(set(ids)) != len(ids):
            raise SettingsError(
                "FATURA_SECRETS_OLD_KEYS: each master key id may appear once (current included)"
            )

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Keyring | None:
        """The keyring the environment names, None when ``FATURA_SECRETS_KEY`` is unset."""
        env = os.environ if env is None else env
        current = (env.get("FATURA_SECRETS_KEY") or "").strip()
        old_raw = (env.get("FATURA_SECRETS_OLD_KEYS") or "").strip()
        if not current:
            if old_raw:
                raise SettingsError("FATURA_SECRETS_OLD_KEYS is set but FATURA_SECRETS_KEY is not")
            return None
        old = tuple(parse_key(s, "FATURA_SECRETS_OLD_KEYS") for s in old_raw.split(",") if s.strip())
        return cls(parse_key(current, "FATURA_SECRETS_KEY"), old)

    @property
    def is_development(self) -> bool:
        return self.current.id == DEVELOPMENT_KEY_ID

    def _key(self, master_key_id: str) -> MasterKey:
        for k in (self.current, *self.old):
            if k.id == master_key_id:
                return k
        raise KeyringError(
            f"sealed under master key {master_key_id!r}, which this process does not hold "
            "(add it to FATURA_SECRETS_OLD_KEYS)"
        )

    def seal(self, endpoint_id: uuid.UUID, key_id: str, secret: str) -> Sealed:
        nonce = os.urandom(NONCE_BYTES)
        k = self.current
        ciphertext = AESGCM(k.key).encrypt(nonce, secret.encode("utf-8"), _aad(endpoint_id, key_id, k.id))
        return Sealed(k.id, nonce, ciphertext)

    def open(self, endpoint_id: uuid.UUID, key_id: str, sealed: Sealed) -> str:
        k = self._key(sealed.master_key_id)
        try:
            plain = AESGCM(k.key).decrypt(
                sealed.nonce, sealed.ciphertext, _aad(endpoint_id, key_id, sealed.master_key_id)
            )
        except (InvalidTag, ValueError):
            raise KeyringError(
                f"the secret {key_id} of endpoint {endpoint_id} does not open under master key "
                f"{sealed.master_key_id!r}: it was altered, moved from another row, or sealed under "
                "another key of that id"
            ) from None
        return plain.decode("utf-8")


def new_key_spec(key_id: str) -> str:
    """A fresh ``ID:BASE64`` master key, for ``fatura secrets new-key``."""
    spec = f"{key_id}:{base64.b64encode(os.urandom(KEY_BYTES)).decode()}"
    parse_key(spec, "key id")  # checks the id
    return spec
