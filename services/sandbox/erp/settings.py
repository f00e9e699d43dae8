"""Settings of the reference ERP receiver, read once from ``FATURA_ERP_*`` (and the common ones)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from fatura_sdk.webhooks import InvalidSecretError, decode_secret
from services.common import faults
from services.common.settings import CommonSettings, SettingsError, env_int, env_str

ROOT = Path(__file__).resolve().parents[3]
ERP_CRASH_AFTER_COMMIT = "erp_crash_after_commit"
# Its own name: the inference worker has a crash_after_inbox_commit, and one FATURA_FAULTS may reach both.
ERP_FAULTS = frozenset({ERP_CRASH_AFTER_COMMIT})


@dataclass(frozen=True)
class ErpSettings:
    common: CommonSettings = field(default_factory=CommonSettings)
    host: str = "127.0.0.1"
    port: int = 8091
    db_path: Path = ROOT / "out" / "erp" / "erp.sqlite"
    secrets: tuple[str, ...] = ()
    # Fatura's API (the edge's base URL): after its ledger commit the ERP acknowledges each result
    # there, posted or rejected (POST /v1/deliveries/{id}:ack). None: it does not acknowledge.
    ack_url: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ErpSettings:
        env = os.environ if env is None else env
        common = CommonSettings.from_env(env)
        unknown = common.faults - faults.KNOWN_FAULTS - ERP_FAULTS
        if unknown:
            raise SettingsError(f"FATURA_FAULTS names unknown fault points: {sorted(unknown)}")
        raw_secrets = env_str(env, "FATURA_ERP_SECRETS", "")
        secrets = tuple(s.strip() for s in raw_secrets.split(",") if s.strip())
        for position, secret in enumerate(secrets, start=1):
            try:
                decode_secret(secret)
            except InvalidSecretError:
                # Never echo a secret into a log, even a broken one.
                raise SettingsError(f"FATURA_ERP_SECRETS: secret #{position} is not whsec_<base64>") from None
        db = Path(env_str(env, "FATURA_ERP_DB", str(cls.db_path)))
        ack_url = env_str(env, "FATURA_ERP_ACK_URL", "").strip().rstrip("/") or None
        if ack_url is not None and not ack_url.startswith(("http://", "https://")):
            raise SettingsError(f"FATURA_ERP_ACK_URL={ack_url!r} is not an http(s) URL (the edge's base URL)")
        return cls(
            common=common,
            host=env_str(env, "FATURA_ERP_HOST", cls.host),
            port=env_int(env, "FATURA_ERP_PORT", cls.port, lo=1, hi=65535),
            db_path=db if db.is_absolute() else ROOT / db,
            secrets=secrets,
            ack_url=ack_url,
        )


def ready_url() -> str:
    erp = ErpSettings.from_env()
    return f"http://{erp.host}:{erp.port}/readyz"
