"""Extraction batches: many documents under one Idempotency-Key, each item an ordinary extraction
job, with counts, per-item results and one ``batch.completed.v1`` event when every item is final.

The public surface, shared by the HTTP routes and any other transport (the gRPC JobService):
``BatchService`` (submit, get, items), the parsed request ``CreateBatch`` of ``BatchItem``s, and
``BatchParser`` that makes one from a JSON body.
"""

from services.acceptance.batches.requests import BatchItem, BatchParser, CreateBatch, item_key
from services.acceptance.batches.service import BatchAccepted, BatchService
from services.acceptance.batches.sweep import close_finished_batches

__all__ = [
    "BatchAccepted",
    "BatchItem",
    "BatchParser",
    "BatchService",
    "CreateBatch",
    "close_finished_batches",
    "item_key",
]
