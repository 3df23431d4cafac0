"""A Task Router on real PostgreSQL and Redis, plus helpers to add collectors and submit tasks."""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from sqlalchemy import insert, select
from sqlalchemy.dialects.postgresql import insert as pg_insert

from common.db import engine as db_engine
from common.db.schema import collectors, sites, task_transitions
from common.envelope.verify import VerifyContext, verify
from common.trust.keys import KeyPurpose, KeySet, trusted
from router.dispatch.service import Router
from router.dispatch.submit import SubmitRequest
from tests.support.collector_key import PUBLIC_DER

KEYS = KeySet.create(KeyPurpose.DISPATCH, int(time.time()))

OPS: dict[str, dict[str, Any]] = {
    "echo": {"name": "echo", "op_class": "read"},
    "set": {"name": "set", "op_class": "mutate_terminal"},
    "apply": {"name": "apply", "op_class": "mutate_reconcilable", "reconcile_operation": "apply.check"},
    "apply.check": {"name": "apply.check", "op_class": "read"},
    "tag": {"name": "tag", "op_class": "mutate_terminal", "parallel_safe": True},
}


def manifest(max_concurrency: int = 8, ops: tuple[str, ...] = tuple(OPS)) -> dict[str, Any]:
    return {"providers": {"stub": {"max_concurrency": max_concurrency, "operations": [OPS[o] for o in ops]}}}


@dataclass
class RouterEnv:
    router: Router
    site_id: str = "site-r"
    tenant_id: str = "tenant-r"

    async def add_collector(
        self,
        collector_id: str,
        *,
        max_concurrency: int = 8,
        live: bool = True,
        ops: tuple[str, ...] = tuple(OPS),
    ) -> None:
        async with self.router.engine.begin() as conn:
            await conn.execute(
                pg_insert(sites)
                .values(site_id=self.site_id, name=self.site_id, tenant_id=self.tenant_id)
                .on_conflict_do_nothing()
            )
            await conn.execute(
                insert(collectors).values(
                    collector_id=collector_id, site_id=self.site_id, tenant_id=self.tenant_id,
                    status="active",
                    public_key_der=PUBLIC_DER, public_key_sha256=b"h", cert_pem="", cert_serial="1",
                    cert_not_after=dt.datetime.now(dt.UTC) + dt.timedelta(days=90),
                )
            )  # fmt: skip
        if live:
            await self.router.liveness.touch(collector_id, time.time())
        await self.router.publish_capabilities(collector_id, 1, manifest(max_concurrency, ops), False, "1.0")

    def request(
        self, operation: str = "echo", target: str = "dev-1", key: str | None = None, **kw: Any
    ) -> SubmitRequest:
        op_class = OPS[operation]["op_class"]
        base: dict[str, Any] = {
            "provider": "stub", "operation": operation, "op_class": op_class, "target_ref": target,
            "site_id": self.site_id, "tenant_id": self.tenant_id, "params": b'{"x":1}',
            "idempotency_key": key or f"idem-{operation}-{target}-{time.monotonic_ns()}",
            "deadline": dt.datetime.now(dt.UTC) + dt.timedelta(minutes=10),
        }  # fmt: skip
        base.update(kw)
        return SubmitRequest(**base)

    async def history(self, task_id: str) -> list[tuple[str, str]]:
        async with self.router.engine.connect() as conn:
            rows = await conn.execute(
                select(task_transitions.c.from_state, task_transitions.c.to_state)
                .where(task_transitions.c.task_id == task_id)
                .order_by(task_transitions.c.id)
            )
            return [(r[0], r[1]) for r in rows]


class NoJournal:
    def lookup(self, idempotency_key: str) -> Mapping[str, Any] | None:
        return None


def open_envelope(raw: bytes, collector_id: str, keys: KeySet = KEYS) -> dict[str, Any]:
    """Verify an envelope as a collector holding ``keys`` would and return its wire JSON."""
    ctx = VerifyContext(
        collector_id, int(time.time()), trusted(keys.public_keys(int(time.time()))), set(), NoJournal()
    )
    verify(raw, ctx)
    result: dict[str, Any] = json.loads(raw)
    return result


def make_router(
    database_url: str, redis_url: str, keys: Callable[[], KeySet] = lambda: KEYS, **kw: Any
) -> Router:
    engine = db_engine.create_async(database_url, pool_size=20, max_overflow=20)
    router = Router(engine, aioredis.Redis.from_url(redis_url), keys, **kw)
    router.start()
    return router


async def make_silent(env: RouterEnv, collector_id: str) -> None:
    """Make ``collector_id`` look silent for longer than the liveness window, in a Redis that has
    tracked the fleet for longer still (so the sweeper may conclude it is silent, not unknown)."""
    long_ago = time.time() - env.router.liveness.window_s - 60
    run_id = (await env.router.redis.info("server"))["run_id"]
    await env.router.redis.set("versus:live:since", f"{run_id}:{long_ago}")
    await env.router.redis.zadd("versus:live", {collector_id: long_ago})
