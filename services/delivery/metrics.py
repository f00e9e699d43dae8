"""Prometheus metrics of the delivery service (labels are bounded: never an id)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

OUTCOMES = Counter("fatura_delivery_outcomes_total", "Delivery attempts by resulting state", ["state"])
DELIVERIES_CREATED = Counter("fatura_deliveries_created_total", "Deliveries created (event x endpoint)")
POSTPONED = Counter("fatura_delivery_postponed_total", "Due deliveries that waited, by cause", ["cause"])
STALE = Counter("fatura_delivery_stale_outcomes_total", "Outcomes discarded because the claim was lost")
BREAKER_OPENED = Counter("fatura_delivery_breaker_opened_total", "Endpoint circuit breakers opened")
AUTH_ALARMS = Counter(
    "fatura_delivery_auth_alarms_total", "Endpoints disabled after repeated 401/403 (configuration alarm)"
)
ENDPOINTS_DISABLED = Counter("fatura_delivery_endpoints_disabled_total", "Endpoints disabled", ["cause"])
POST_SECONDS = Histogram(
    "fatura_delivery_post_seconds",
    "Webhook POST latency",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
LEASES_EXPIRED = Counter("fatura_delivery_leases_expired_total", "Claims of dead senders taken back")
WAKEUPS = Counter("fatura_delivery_wakeups_total", "Deliveries the scheduler sent wake-ups for")
BATCH_GIVEN_BACK = Counter(
    "fatura_delivery_batch_given_back_total",
    "Claimed deliveries a batch gave back unsent because its send window closed (a slow receiver)",
)
WAKEUPS_DROPPED = Counter(
    "fatura_delivery_wakeups_dropped_total",
    "Wake-ups dropped without a query: their delivery was already sent in another one's batch",
)
PENDING = Gauge("fatura_delivery_pending", "Deliveries waiting to be sent")
# What KEDA scales the delivery workers on (deploy/k8s): pending deliveries whose time has come, not
# those waiting out a retry delay.
DUE = Gauge("fatura_delivery_due", "Pending deliveries whose next attempt is due now")
OLDEST_DUE_AGE = Gauge("fatura_delivery_oldest_due_age_seconds", "Age of the oldest due delivery")
UNACKNOWLEDGED = Gauge(
    "fatura_deliveries_unacknowledged",
    "Deliveries received longer ago than FATURA_ERP_ACK_WINDOW_SECONDS and not acknowledged by the ERP "
    "(counted up to 10000 by the delivery scheduler)",
)
ENDPOINTS = Gauge(
    "fatura_delivery_endpoints",
    "Webhook endpoints by breaker state (closed, open, disabled); per-endpoint health is in the "
    "operator API, never a label",
    ["state"],
)
