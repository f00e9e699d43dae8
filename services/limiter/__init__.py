"""Limiter service: atomic multi-dimensional permits for provider pools, kept in Redis (DESIGN §5.5)."""
