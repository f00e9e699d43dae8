"""What the HTTP edge mounts of delivery: its one public module for the edge (STYLE §11). The
webhook endpoint routes and their store, settings, and the service's part of the OpenAPI document."""

from services.delivery import openapi_paths
from services.delivery.api import delivery_routes
from services.delivery.endpoints import Endpoints
from services.delivery.settings import DeliverySettings

__all__ = ["DeliverySettings", "Endpoints", "delivery_routes", "openapi_paths"]
