"""Calling the model: the interface the worker uses, and the gateway behind it.

``Gateway.from_settings()`` builds the process's gateway (routing chains, shared circuit breakers,
one pooled httpx client); ``Gateway.complete(request, permits)`` makes one attempt.
"""

from services.inference.providers.base import (
    ErrorClass,
    Hop,
    PermitDenied,
    PermitGranted,
    Permits,
    Provider,
    ProviderRequest,
    ProviderResult,
)
from services.inference.providers.catalog import Catalog, CatalogError, Channel, load_catalog
from services.inference.providers.gateway import Gateway
from services.inference.providers.settings import GatewaySettings

__all__ = [
    "Catalog",
    "CatalogError",
    "Channel",
    "ErrorClass",
    "Gateway",
    "GatewaySettings",
    "Hop",
    "PermitDenied",
    "PermitGranted",
    "Permits",
    "Provider",
    "ProviderRequest",
    "ProviderResult",
    "load_catalog",
]
