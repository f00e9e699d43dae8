"""Delivery: signed, retried, deduplicated webhooks that hand each finished job to the tenant's ERP."""
