"""Acceptance: the HTTP edge that accepts work durably, and the outbox relay that hands it on."""
