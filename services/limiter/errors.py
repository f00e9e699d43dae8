"""The limiter's error hierarchy: Redis and gRPC failures are translated into these at the edges.

The servicer maps each class to one gRPC status (``STATUS_BY_ERROR``) and the client maps the
status back (``ERROR_BY_STATUS``), so both sides agree on what a caller may retry.
"""

from __future__ import annotations


class LimiterError(Exception):
    """Base class: every error the limiter raises on purpose."""


class InvalidArgument(LimiterError):
    """The request is malformed or asks for something no configuration could grant. Nothing changed."""


class UnknownPool(InvalidArgument):
    """The pool is not in the limiter's configuration."""


class NeverAdmittable(InvalidArgument):
    """The reservation is bigger than a whole dimension of the pool (its TPM, or a local pool's KV
    token capacity): no amount of waiting could grant it. Nothing changed."""


class PermitNotFound(LimiterError):
    """No permit with this id exists (never granted, or its record was retired after the retention time)."""


class PermitNotHeld(LimiterError):
    """The permit exists but is no longer held: it was released, or its lease expired."""


class RequestKeyConflict(LimiterError):
    """The request_key was already used for an Acquire with different tenant or token figures."""


class BackendUnavailable(LimiterError):
    """Redis cannot be reached or answered too slowly; the caller may retry later."""


class BackendError(LimiterError):
    """Redis answered with an error the limiter did not expect (a bug, not a transient condition)."""


class LimiterUnavailable(LimiterError):
    """Client side: the limiter service did not answer within the deadline, or answered UNAVAILABLE."""


class LimiterUnauthenticated(LimiterError):
    """The limiter refused the caller's credentials (no token, a wrong token): a configuration error
    to fix, never a reason to fall back to the emergency quota. Nothing changed."""
