"""Loading placement candidates: PostgreSQL rows, parsed manifests and Redis state.

Placement runs for every submitted task and every freed slot, inside a
transaction, over every collector of the site, so its cost per call is kept
small: a site's candidate rows are reused for a second (the collector lock
taken before leasing re-checks status, certificate and drain in PostgreSQL),
manifests are parsed once per capability version (epoch and update time),
and Redis answers for all candidates in one round trip (router/core/live.py
``placement_view``).
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncConnection

from router.core.live import InFlight, placement_view
from router.core.sql import Row
from router.dispatch import sql_collectors
from router.dispatch.placement import DEFAULT_TIMEOUT_S, Candidate, OperationCap, ProviderCap
from router.dispatch.reservations import Reservations

Providers = Mapping[str, ProviderCap]
# More collectors (or sites) than this and the oldest cached entries are dropped.
MAX_CACHED = 100_000
# How long a site's candidate rows are reused (see CandidateLoader._candidate_rows).
ROWS_TTL_S = 1.0


def parse_providers(manifest: Mapping[str, Any]) -> dict[str, ProviderCap]:
    """The placement view of a stored capability manifest."""
    return {
        name: ProviderCap(
            max_concurrency=int(p.get("max_concurrency", 1)),
            operations={
                op["name"]: OperationCap(
                    op_class=op["op_class"],
                    parallel_safe=bool(op.get("parallel_safe", False)),
                    reconcile_operation=str(op.get("reconcile_operation", "")),
                    timeout_s=int(op.get("timeout_s", DEFAULT_TIMEOUT_S)),
                )
                for op in p.get("operations", [])
            },
        )
        for name, p in manifest.get("providers", {}).items()
    }


class CandidateLoader:
    """Candidates of a site and tenant with liveness, load and drain state (see the module doc)."""

    def __init__(
        self,
        redis: Redis,
        in_flight: InFlight,
        liveness_window_s: int,
        clock: Callable[[], float] = time.time,
    ):
        self.redis = redis
        self.clock = clock
        self.in_flight = in_flight
        self.window_s = liveness_window_s
        self._manifests: dict[str, tuple[tuple[int, dt.datetime], Providers]] = {}
        self._rows: dict[tuple[str, str], tuple[float, Sequence[Row]]] = {}
        # Slots this process's placements are filling now, added to the loads Redis reports.
        self.reservations = Reservations()

    def invalidate(self) -> None:
        """Forget the cached candidate rows (a collector published capabilities, say)."""
        self._rows.clear()

    async def _candidate_rows(self, conn: AsyncConnection, site_id: str, tenant_id: str) -> Sequence[Row]:
        # Reused for ROWS_TTL_S: a collector revoked, drained or expired in that time is refused
        # by sql_collectors.lock_collector, which every placement passes before it leases.
        key = (site_id, tenant_id)
        now = time.monotonic()
        cached = self._rows.get(key)
        if cached is not None and cached[0] > now:
            return cached[1]
        rows = await sql_collectors.candidates(conn, site_id, tenant_id)
        if len(self._rows) >= MAX_CACHED:
            self._rows.clear()
        self._rows[key] = (now + ROWS_TTL_S, rows)
        return rows

    async def load(
        self, conn: AsyncConnection, site_id: str, tenant_id: str, provider: str
    ) -> list[Candidate]:
        rows = await self._candidate_rows(conn, site_id, tenant_id)
        return await self._build(conn, rows, provider)

    async def one(
        self, conn: AsyncConnection, site_id: str, tenant_id: str, provider: str, collector_id: str
    ) -> Candidate | None:
        """The candidate ``collector_id`` alone (None: not a collector of that site and tenant).

        A freed slot is offered to its own collector first, so that path costs one collector's
        Redis state, not the whole site's."""
        rows = [
            r
            for r in await self._candidate_rows(conn, site_id, tenant_id)
            if r["collector_id"] == collector_id
        ]
        built = await self._build(conn, rows, provider)
        return built[0] if built else None

    async def _build(self, conn: AsyncConnection, rows: Sequence[Row], provider: str) -> list[Candidate]:
        stale = [
            r["collector_id"]
            for r in rows
            if (cached := self._manifests.get(r["collector_id"])) is None or cached[0] != _version(r)
        ]
        if stale:
            for m in await sql_collectors.manifests(conn, stale):
                if len(self._manifests) >= MAX_CACHED:
                    self._manifests.pop(next(iter(self._manifests)))
                self._manifests[m["collector_id"]] = (
                    (int(m["epoch"]), m["updated_at"]),
                    parse_providers(m["manifest"]),
                )
        ids = [r["collector_id"] for r in rows]
        view = await placement_view(self.redis, self.in_flight, ids, provider, self.clock(), self.window_s)
        held = self.reservations.held(provider)
        out = []
        for r in rows:
            cid = r["collector_id"]
            loads = view.loads.get(cid, {})
            if cid in held:
                loads = {**loads, provider: loads.get(provider, 0) + held[cid]}
            cached = self._manifests.get(cid)
            providers: Providers = cached[1] if cached is not None else {}
            out.append(
                Candidate(
                    collector_id=cid,
                    site_id=r["site_id"],
                    tenant_id=r["tenant_id"],
                    active=r["status"] == "active",
                    draining=bool(r["draining"]) or cid in view.draining,
                    live=cid in view.live,
                    fips=bool(r["fips"]),
                    providers=providers,
                    in_flight=loads,
                    dispatch_kids=frozenset(r["dispatch_kids"]) if r["dispatch_kids"] is not None else None,
                    protocol=view.protocols.get(cid, 1),
                    relayed=r["vault_mode"] == "relayed",
                )
            )
        return out


def _version(row: Row) -> tuple[int, dt.datetime]:
    return int(row["epoch"]), row["updated_at"]
