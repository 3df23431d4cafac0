"""Redis client construction and connectivity checks."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import redis
import redis.asyncio as aioredis
import redis.asyncio.sentinel as async_sentinel
import redis.sentinel as sync_sentinel
from redis.asyncio.sentinel import SentinelConnectionPool

from common.errors import Unavailable
from common.redis import sentinel as redis_sentinel
from common.telemetry.redaction import redact_url

SOCKET_TIMEOUT_S = 5.0


# Connections per process. redis-py's default pool opens one more connection whenever every
# pooled one is busy, without limit: 10,000 collectors claiming at once made the router open
# thousands and hit the server's own limit (maxclients, 10,000). Commands take microseconds,
# so a bounded pool where callers wait their turn serves the same load.
MAX_CONNECTIONS = 128
# How long a caller waits for a pooled connection before the call fails (503, redis_unavailable).
POOL_WAIT_S = 5.0


class _BlockingSentinelPool(SentinelConnectionPool, aioredis.BlockingConnectionPool):
    """The Sentinel group's master, with the same bounded, waiting pool as a plain URL."""


class _SentinelRedis(aioredis.Redis):
    """A client of a Sentinel group's master whose ``aclose`` also closes its connections to the
    sentinels (redis-py leaves those open)."""

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        manager = getattr(self.connection_pool, "sentinel_manager", None)
        await super().aclose(close_connection_pool)
        for client in getattr(manager, "sentinels", ()):
            await client.aclose()


def _timeouts() -> dict[str, Any]:
    return {"socket_timeout": SOCKET_TIMEOUT_S, "socket_connect_timeout": SOCKET_TIMEOUT_S}


def _sentinel(parts: redis_sentinel.SentinelUrl, module: Any) -> Any:
    sentinel_kwargs: dict[str, Any] = {**_timeouts(), "ssl": parts.tls}
    if parts.sentinel_password:
        sentinel_kwargs["password"] = parts.sentinel_password
    return module.Sentinel(list(parts.sentinels), sentinel_kwargs=sentinel_kwargs, **_timeouts())


def _master_kwargs(parts: redis_sentinel.SentinelUrl) -> dict[str, Any]:
    return {"db": parts.db, "username": parts.username, "password": parts.password, "ssl": parts.tls}


def create_async(url: str) -> aioredis.Redis:
    """Async client with explicit timeouts and a bounded pool; a dead Redis fails calls instead of
    hanging them. A ``redis+sentinel://`` URL follows its group's master (common/redis/sentinel.py)."""
    if redis_sentinel.is_sentinel(url):
        parts = redis_sentinel.parse(url)
        client: aioredis.Redis = _sentinel(parts, async_sentinel).master_for(
            parts.service,
            redis_class=_SentinelRedis,
            connection_pool_class=_BlockingSentinelPool,
            max_connections=MAX_CONNECTIONS,
            timeout=POOL_WAIT_S,
            health_check_interval=30,
            **_master_kwargs(parts),
        )
        return client
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
    if redis_sentinel.is_sentinel(url):
        group = redis_sentinel.parse(url)
        hosts = ",".join(f"{h}:{p}" for h, p in group.sentinels)
        return f"Sentinel group {group.service} at {hosts}"
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return parts.path
    return redact_url(f"{parts.hostname}:{parts.port or 6379}")


def check_reachable(url: str) -> None:
    """PING once; raise :class:`Unavailable` with a one-line reason."""
    if redis_sentinel.is_sentinel(url):
        parts = redis_sentinel.parse(url)
        client = _sentinel(parts, sync_sentinel).master_for(parts.service, **_master_kwargs(parts))
    else:
        client = redis.Redis.from_url(url, **_timeouts())
    try:
        client.ping()
    except redis.RedisError as exc:
        raise Unavailable(f"cannot connect to Redis at {describe(url)}: {redact_url(str(exc))}") from None
    finally:
        client.close()
