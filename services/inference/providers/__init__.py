"""Calling the model: the interface the worker uses, and the gateway behind it."""
