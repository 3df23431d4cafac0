"""Collector upgrades: each collector's target, administrator approvals, and supervisor reports.

A collector's target (router/releases/update_policy.py) is recomputed from PostgreSQL - the
site's policy and channel, the releases not yanked, the approval, what the collector runs and
what its supervisor last reported - and stored in ``collector_updates.target_version``. A change
bumps the collector's config version, so the next claim (a held one is woken) is answered with
the signed config, which names the target release (router/trust/collector_docs.py): the target rides
the claim, signed with a dispatch key the collector holds, and an edge in between cannot change
it. The collector's supervisor acts on it (docs/upgrades.md).

Recomputed after every change this router makes (publish, yank, approve, cancel, a supervisor
report) and every :data:`RECONCILE_INTERVAL_S` for the changes made elsewhere (a site's policy
is the enrollment service's; a release's soak time passing; a collector starting a new version).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import RowMapping
from sqlalchemy.ext.asyncio import AsyncEngine

from common.errors import FailedPrecondition, InvalidArgument, NotFound
from common.telemetry import tracing
from common.telemetry.logs import get_logger
from router.core import audit, store
from router.releases import store as release_store
from router.releases import update_policy
from router.releases.update_policy import CollectorFacts, ReleaseFacts

log = get_logger("versus.router.updates")

RECONCILE_INTERVAL_S = 10.0
# How long a release without the security flag waits before auto sites take it (VERSUS_UPDATE_SOAK_S).
DEFAULT_SOAK = dt.timedelta(hours=1)
UPDATE_STATES = ("updating", "updated", "rolled_back", "failed")
MAX_DETAIL_CHARS = 500
# One reconcile at a time across routers: both would compute the same targets, but each would bump.
_LOCK_KEY = 0x76657273_75706400  # "versupd\0"


@dataclass(frozen=True, slots=True)
class Report:
    """What a collector's supervisor says about an upgrade (it rides the claim)."""

    state: str
    version: str
    detail: str
    at: float


def release_facts(
    rows: Sequence[Mapping[str, Any]] | Sequence[RowMapping], os: str, arch: str
) -> list[ReleaseFacts]:
    return [
        ReleaseFacts(r["version"], r["channel"], bool(r["security_fix"]), r["published_at"])
        for r in rows
        if r["os"] == os and r["arch"] == arch
    ]


def collector_facts(row: Mapping[str, Any] | RowMapping) -> CollectorFacts:
    return CollectorFacts(
        policy=row["update_policy"] or "manual",
        channel=row["update_channel"] or "stable",
        pinned_version=row["pinned_version"],
        approved_version=row["approved_version"],
        running_version=row["running"] or "",
        state=row["state"] or "",
        state_version=row["state_version"],
        state_detail=row.get("detail") or "",
    )


class Updates:
    def __init__(
        self,
        engine: AsyncEngine,
        wake: Callable[[str], Awaitable[None]],
        soak: dt.timedelta = DEFAULT_SOAK,
        clock: Callable[[], float] = time.time,
    ):
        self.engine = engine
        self.wake = wake
        self.soak = soak
        self.clock = clock
        self._lock = asyncio.Lock()
        # Last report stored per collector, so a claim that repeats it costs no SQL.
        self._reported: dict[str, Report] = {}

    def _now(self) -> dt.datetime:
        return dt.datetime.fromtimestamp(self.clock(), dt.UTC)

    async def reconcile(self, collector_ids: Sequence[str] | None = None) -> int:
        """Recompute targets (of every active collector, or those named); returns how many changed."""
        async with self._lock, self.engine.begin() as conn:
            await conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _LOCK_KEY})
            releases = await release_store.live_releases(conn)
            # With nothing published no collector has a target: only stale ones need clearing.
            rows = await release_store.policy_rows(conn, collector_ids, targeted_only=not releases)
            now = self._now()
            changes: dict[str, str | None] = {}
            for row in rows:
                wanted = update_policy.target(
                    collector_facts(row), release_facts(releases, row["os"], row["arch"]), now, self.soak
                )
                if wanted != row["target_version"]:
                    changes[row["collector_id"]] = wanted
            await release_store.set_targets(conn, changes)
        for collector_id, version in changes.items():
            log.info("update target changed", collector_id=collector_id, target=version or "(stay)")
            await self.wake(collector_id)
        return len(changes)

    async def run(self, stop: asyncio.Event, interval_s: float = RECONCILE_INTERVAL_S) -> None:
        while not stop.is_set():
            try:
                await self.reconcile()
            except Exception:
                log.exception("recomputing update targets failed; retrying next interval")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval_s):
                    await stop.wait()

    # --- administrator actions -----------------------------------------------------------------
    async def apply(self, collector_id: str, version: str, actor: str) -> str:
        """Approve the upgrade of one collector (manual policy) to ``version`` (empty: the latest on
        its site's channel); returns the approved version."""
        async with self.engine.begin() as conn:
            found = await release_store.policy_rows(conn, [collector_id])
            if not found:
                await store.require_collector(conn, collector_id)
                raise FailedPrecondition(
                    "only an active collector can be updated", code="collector_not_active"
                )
            row = found[0]
            if row["update_policy"] != "manual":
                raise FailedPrecondition(
                    f"the site's update policy is {row['update_policy']}: only manual sites take approvals",
                    code="update_policy_not_manual",
                )
            platform = release_facts(await release_store.live_releases(conn), row["os"], row["arch"])
            if version:
                update_policy.parse_version(version)
                if version not in {r.version for r in platform}:
                    raise NotFound(
                        f"no release {version} for {row['os']}/{row['arch']} (or it was yanked)",
                        code="release_not_found",
                    )
            else:
                newest = update_policy.latest(platform, row["update_channel"])
                if newest is None:
                    raise NotFound(
                        f"nothing is published for {row['os']}/{row['arch']} on {row['update_channel']}",
                        code="release_not_found",
                    )
                version = newest.version
            if version == (row["running"] or ""):
                raise FailedPrecondition(f"the collector already runs {version}", code="update_not_needed")
            before = await release_store.get_update(conn, collector_id, lock=True)
            values: dict[str, Any] = {
                "approved_version": version, "approved_by": actor, "approved_at": self._now(),
            }  # fmt: skip
            if before is not None and before["state_version"] == version:
                values.update(state="", state_version=None, detail="")  # an explicit retry
            await release_store.upsert_update(conn, collector_id, values)
            await audit.record(
                conn, actor, "collector.update_apply", "collector", collector_id,
                {"before": {"approved_version": before["approved_version"] if before else None},
                 "after": {"approved_version": version}},
            )  # fmt: skip
        await self.reconcile([collector_id])
        return version

    async def cancel(self, collector_id: str, actor: str) -> None:
        """Withdraw an approval the collector has not applied yet."""
        async with self.engine.begin() as conn:
            await store.require_collector(conn, collector_id)
            before = await release_store.get_update(conn, collector_id, lock=True)
            if before is None or not before["approved_version"]:
                raise FailedPrecondition(
                    "no update is approved for this collector", code="update_not_approved"
                )
            if before["state"] == "updating" and before["state_version"] == before["approved_version"]:
                raise FailedPrecondition(
                    f"the collector is already installing {before['approved_version']}",
                    code="update_in_progress",
                )
            await release_store.upsert_update(
                conn, collector_id, {"approved_version": None, "approved_by": None, "approved_at": None}
            )
            await audit.record(
                conn, actor, "collector.update_cancel", "collector", collector_id,
                {"before": {"approved_version": before["approved_version"]},
                 "after": {"approved_version": None}},
            )  # fmt: skip
        await self.reconcile([collector_id])

    # --- supervisor reports --------------------------------------------------------------------
    async def record(self, collector_id: str, report: Report) -> None:
        """Store a report from the claim when it says something new; failures are audited."""
        if self._reported.get(collector_id) == report:
            return
        attributes = {"versus.collector_id": collector_id, "versus.update.state": report.state,
                      "versus.update.version": report.version[:64]}  # fmt: skip
        with tracing.span("versus.update.report", root=True, attributes=attributes):
            await self._record(collector_id, report)

    async def _record(self, collector_id: str, report: Report) -> None:
        if report.state not in UPDATE_STATES:
            raise InvalidArgument(
                f"update_status.state must be one of {', '.join(UPDATE_STATES)}", code="update_status_invalid"
            )
        detail = report.detail[:MAX_DETAIL_CHARS]
        try:
            at = dt.datetime.fromtimestamp(report.at, dt.UTC) if report.at > 0 else self._now()
        except (OverflowError, OSError, ValueError):  # a clock far off: the router's time instead
            at = self._now()
        async with self.engine.begin() as conn:
            before = await release_store.record_state(
                conn, collector_id, report.state, report.version[:64], detail, at
            )
            new = before is None or (before["state"], before["state_version"], before["detail"]) != (
                report.state, report.version[:64], detail,
            )  # fmt: skip
            if new and report.state in ("rolled_back", "failed", "updated"):
                await audit.record(
                    conn, f"collector:{collector_id}", f"collector.update_{report.state}", "collector",
                    collector_id, {"version": report.version[:64], "detail": detail},
                )  # fmt: skip
        self._reported[collector_id] = report
        if new:
            log.info("collector update report", collector_id=collector_id, state=report.state,
                     version=report.version, detail=detail)  # fmt: skip
            await self.reconcile([collector_id])
