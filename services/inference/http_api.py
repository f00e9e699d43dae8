"""What the HTTP edge mounts of inference: its one public module for the edge (STYLE §11). The
review routes and their part of the OpenAPI document."""

from services.inference.review import schemas as review_schemas
from services.inference.review.api import review_routes

__all__ = ["review_routes", "review_schemas"]
