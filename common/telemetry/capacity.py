"""Usage beside capacity: each pool or bound a process has, exported as a gauge of what is in use and
a ``_limit`` gauge of how much there is, read when Prometheus scrapes (docs/operations.md, "Metrics").

Alerts then divide one by the other (deploy/prometheus/rules.yml: saturation above 90 %) and
need no threshold that must follow the configuration. The values are read on the scrape's thread
from counters the pools keep themselves: a length or an integer, never a lock taken or an I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import Gauge

DB_IN_USE = Gauge(
    "versus_db_pool_connections_in_use",
    "PostgreSQL connections checked out of the pool, by service.",
    ["service"],
)
DB_LIMIT = Gauge(
    "versus_db_pool_connections_limit",
    "Most PostgreSQL connections the pool opens (size plus overflow).",
    ["service"],
)
REDIS_IN_USE = Gauge(
    "versus_redis_pool_connections_in_use", "Redis connections in use, by service.", ["service"]
)
REDIS_LIMIT = Gauge(
    "versus_redis_pool_connections_limit", "Most Redis connections the pool opens, by service.", ["service"]
)
GRPC_IN_FLIGHT = Gauge(
    "versus_grpc_calls_in_flight",
    "Calls in flight on a bounded gRPC path, by service and path (the router's Exchange streams: "
    "calls running; the gateway's link to the router: calls waiting for an answer).",
    ["service", "path"],
)
GRPC_LIMIT = Gauge(
    "versus_grpc_calls_in_flight_limit", "Most calls in flight the path admits, by service and path.",
    ["service", "path"],
)  # fmt: skip


def watch(
    usage: Gauge, limit: Gauge, labels: tuple[str, ...], used: Callable[[], float], most: Callable[[], float]
) -> None:
    """Export ``used()`` and ``most()`` under ``labels``, read at each scrape."""
    usage.labels(*labels).set_function(used)
    limit.labels(*labels).set_function(most)


def watch_db(service: str, engine: Any) -> None:
    """An SQLAlchemy engine's pool (``QueuePool``: size plus overflow; a pool without a bound
    exports no limit)."""
    pool = engine.pool
    if not hasattr(pool, "checkedout"):
        return
    most = pool.size() + max(getattr(pool, "_max_overflow", 0), 0)
    watch(DB_IN_USE, DB_LIMIT, (service,), lambda: float(pool.checkedout()), lambda: float(most))


def watch_redis(service: str, client: Any) -> None:
    """A redis-py asyncio client's connection pool."""
    pool = client.connection_pool
    # redis-py keeps the connections handed out in this set; it has no public count of them.
    watch(
        REDIS_IN_USE, REDIS_LIMIT, (service,),
        lambda: float(len(getattr(pool, "_in_use_connections", ()))), lambda: float(pool.max_connections),
    )  # fmt: skip
