"""What the HTTP edge mounts of acceptance: its one public module for the edge (STYLE §11), as
``services.limiter`` is the limiter's for its callers. Routes, the event feed and its streams,
settings, and the service's part of the OpenAPI document."""

from services.acceptance import events_openapi, openapi_paths
from services.acceptance.feed import EventFeed
from services.acceptance.routes import acceptance_routes
from services.acceptance.settings import AcceptanceSettings, EventSettings
from services.acceptance.sse import end_streams_on_exit, event_routes

__all__ = [
    "AcceptanceSettings",
    "EventFeed",
    "EventSettings",
    "acceptance_routes",
    "end_streams_on_exit",
    "event_routes",
    "events_openapi",
    "openapi_paths",
]
