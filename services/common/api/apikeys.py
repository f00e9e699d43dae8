"""API keys: ``fat_<prefix>_<secret>``. Only the SHA-256 of the whole key is stored.

The secret is 32 random bytes, so a fast hash is the right tool (unlike a password, it cannot be
guessed from a dictionary); the prefix finds the row without scanning.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass

# Key scopes (DESIGN §6): a tenant's own resources, one tenant's reviews, cross-tenant operations.
TENANT = "tenant"
REVIEWER = "reviewer"
OPERATOR = "operator"
SCOPES = (TENANT, REVIEWER, OPERATOR)

_KEY = re.compile(r"^fat_([a-z0-9]{12})_([A-Za-z0-9_-]{43})$")


@dataclass(frozen=True)
class NewKey:
    plaintext: str
    prefix: str
    secret_hash: bytes


def generate() -> NewKey:
    prefix = "".join(secrets.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(12))
    plaintext = f"fat_{prefix}_{secrets.token_urlsafe(32)}"
    return NewKey(plaintext, prefix, digest(plaintext))


def digest(plaintext: str) -> bytes:
    return hashlib.sha256(plaintext.encode("ascii")).digest()


def parse(plaintext: str) -> str | None:
    """The key's prefix, or None when the string is not shaped like one of our keys."""
    match = _KEY.match(plaintext)
    return match.group(1) if match else None


def matches(plaintext: str, stored_hash: bytes) -> bool:
    return hmac.compare_digest(digest(plaintext), stored_hash)
