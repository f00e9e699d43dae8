"""Pieces every service shares: settings, the database pool and unit of work, the broker, ops endpoints."""
