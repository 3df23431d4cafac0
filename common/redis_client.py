"""Redis client construction and connectivity checks."""

from __future__ import annotations

from urllib.parse import urlsplit

import redis
import redis.asyncio as aioredis

from common.errors import Unavailable
from common.redaction import redact_url

SOCKET_TIMEOUT_S = 5.0


# Connections per process. redis-py's default pool opens one more connection whenever every
# pooled one is busy, without limit: 10,000 collectors claiming at once made the router open
# thousands and hit the server's own limit (maxclients, 10,000). Commands take microseconds,
# so a bounded pool where callers wait their turn serves the same load.
MAX_CONNECTIONS = 128
# How long a caller waits for a pooled connection before the call fails (503, redis_unavailable).
POOL_WAIT_S = 5.0


def create_async(url: str) -> aioredis.Redis:
    """Async client with explicit timeouts and a bounded pool; a dead Redis fails calls instead of
    hanging them."""
    pool = aioredis.BlockingConnectionPool.from_url(
        url,
        max_connections=MAX_CONNECTIONS,
        timeout=POOL_WAIT_S,
        socket_timeout=SOCKET_TIMEOUT_S,
        socket_connect_timeout=SOCKET_TIMEOUT_S,
        health_check_interval=30,
    )
    return aioredis.Redis.from_pool(pool)  # the client owns the pool: aclose() closes it


def describe(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return parts.path
    return redact_url(f"{parts.hostname}:{parts.port or 6379}")


def check_reachable(url: str) -> None:
    """PING once; raise :class:`Unavailable` with a one-line reason."""
    client = redis.Redis.from_url(
        url, socket_timeout=SOCKET_TIMEOUT_S, socket_connect_timeout=SOCKET_TIMEOUT_S
    )
    try:
        client.ping()
    except redis.RedisError as exc:
        raise Unavailable(f"cannot connect to Redis at {describe(url)}: {redact_url(str(exc))}") from None
    finally:
        client.close()
