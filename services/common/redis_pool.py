"""The blocking Redis client every service builds the same way: fail fast, retry a stale
connection once.

Short socket timeouts and one immediate retry, because a pooled connection is stale after Redis
restarted; a caller beyond ``max_connections`` waits up to ``timeout_s`` for a free connection
instead of failing "Too many connections". Callers only run scripts that are safe to run twice.
"""

from __future__ import annotations

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry


def connect(url: str, *, timeout_s: float, max_connections: int) -> redis.Redis:
    pool = redis.BlockingConnectionPool.from_url(
        url,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        max_connections=max_connections,
        timeout=timeout_s,
        retry=Retry(NoBackoff(), 1),
    )
    return redis.Redis(connection_pool=pool)
