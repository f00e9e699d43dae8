"""Inference: Dramatiq actors that claim jobs from the database under a lease and fence, ask the
limiter for a permit, call the provider gateway, validate the output and record the outcome."""
