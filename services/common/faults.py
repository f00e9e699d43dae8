"""Fault points: ``FATURA_FAULTS=name,...`` kills this process at a named protocol boundary.

Tests and the chaos suite use these to crash a process at the exact moment the design worries
about (for example between a publish confirm and the ``published_at`` update).
"""

from __future__ import annotations

import logging
import os
import signal

from services.common.settings import SettingsError

log = logging.getLogger(__name__)

CRASH_AFTER_PUBLISH_CONFIRM = "crash_after_publish_confirm"
# Delivery worker: the webhook POST was answered, its outcome not yet recorded.
CRASH_AFTER_WEBHOOK_POST = "crash_after_webhook_post"

# Inference worker: the provider answered, the completion is not yet committed.
CRASH_AFTER_PROVIDER_RESPONSE = "crash_after_provider_response"
# Inference ingest: the inbox row is committed, the broker message not yet acked.
CRASH_AFTER_INBOX_COMMIT = "crash_after_inbox_commit"
# Kafka ingress: the job and its inbox row are committed, the record's offset not yet.
CRASH_AFTER_INGRESS_INBOX_COMMIT = "crash_after_ingress_inbox_commit"

KNOWN_FAULTS = frozenset(
    {
        CRASH_AFTER_PUBLISH_CONFIRM,
        CRASH_AFTER_WEBHOOK_POST,
        CRASH_AFTER_PROVIDER_RESPONSE,
        CRASH_AFTER_INBOX_COMMIT,
        CRASH_AFTER_INGRESS_INBOX_COMMIT,
    }
)


def check(faults: frozenset[str]) -> None:
    """Reject unknown fault names at start-up, so a typo does not silently test nothing."""
    unknown = faults - KNOWN_FAULTS
    if unknown:
        raise SettingsError(f"FATURA_FAULTS names unknown fault points: {sorted(unknown)}")


def point(faults: frozenset[str], name: str) -> None:
    """Die here, as abruptly as SIGKILL, when ``name`` is among the configured faults."""
    if name in faults:
        log.warning("fault point %s reached: killing process %d", name, os.getpid())
        logging.shutdown()
        os.kill(os.getpid(), signal.SIGKILL)
