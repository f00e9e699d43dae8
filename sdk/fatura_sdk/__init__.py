"""fatura-sdk: what a partner installs to call Fatura's job API and receive its signed webhooks.

``Client`` and ``AsyncClient`` submit, read, list and cancel extraction jobs and batches, follow
their events, and ``start_and_await`` a job outside any model loop; ``fatura_sdk.agent`` wraps that
as tools for an LLM agent.

``verify`` checks a webhook; ``Receiver`` adds the durable inbox that turns at-least-once delivery
into exactly one effect; ``Completions`` runs the step after a job's completion once, however often
and however it is seen; ``acknowledge`` (or ``ack_request``) tells Fatura the business outcome of a
delivery, signed with the same secret.
"""

from fatura_sdk._async_client import AsyncClient
from fatura_sdk._client import Client
from fatura_sdk._polling import AwaitResult, Outcome, PollPolicy
from fatura_sdk._retry import RetryPolicy
from fatura_sdk._sse import ServerEvent
from fatura_sdk.acks import AckRequest, AckResponse, AckUnreachable, ack_request, acknowledge
from fatura_sdk.completions import Completions, completion_key
from fatura_sdk.errors import (
    ApiError,
    BadRequest,
    Conflict,
    FaturaError,
    Forbidden,
    NotFound,
    PayloadTooLarge,
    RateLimited,
    ServerError,
    ServiceUnavailable,
    TransportError,
    Unauthorized,
    UnexpectedAnswer,
    UnsupportedMediaType,
    ValidationError,
)
from fatura_sdk.models import (
    Accepted,
    Batch,
    BatchItem,
    BatchItemsPage,
    JobPage,
    JobStatus,
    JobSummary,
    StoredDocument,
)
from fatura_sdk.receiver import Apply, Event, InvalidEvent, Receiver, Response, payload_digest
from fatura_sdk.webhooks import (
    BadSignatureError,
    FutureTimestampError,
    InvalidSecretError,
    MalformedHeaderError,
    MalformedPayloadError,
    MissingHeaderError,
    StaleTimestampError,
    TimestampOutOfWindowError,
    WebhookVerificationError,
    generate_secret,
    sign_headers,
    signature,
    verify,
    verify_signature,
)

__all__ = [
    "Accepted",
    "AckRequest",
    "AckResponse",
    "AckUnreachable",
    "ApiError",
    "Apply",
    "AsyncClient",
    "AwaitResult",
    "BadRequest",
    "BadSignatureError",
    "Batch",
    "BatchItem",
    "BatchItemsPage",
    "Client",
    "Completions",
    "Conflict",
    "Event",
    "FaturaError",
    "Forbidden",
    "FutureTimestampError",
    "InvalidEvent",
    "InvalidSecretError",
    "JobPage",
    "JobStatus",
    "JobSummary",
    "MalformedHeaderError",
    "MalformedPayloadError",
    "MissingHeaderError",
    "NotFound",
    "Outcome",
    "PayloadTooLarge",
    "PollPolicy",
    "RateLimited",
    "Receiver",
    "Response",
    "RetryPolicy",
    "ServerError",
    "ServerEvent",
    "ServiceUnavailable",
    "StaleTimestampError",
    "StoredDocument",
    "TimestampOutOfWindowError",
    "TransportError",
    "Unauthorized",
    "UnexpectedAnswer",
    "UnsupportedMediaType",
    "ValidationError",
    "WebhookVerificationError",
    "ack_request",
    "acknowledge",
    "completion_key",
    "generate_secret",
    "payload_digest",
    "sign_headers",
    "signature",
    "verify",
    "verify_signature",
]
