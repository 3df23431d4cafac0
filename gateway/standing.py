"""Whether the collector behind an open socket may keep it: revocation, suspension, certificate expiry.

Three things close a socket whose collector lost its standing:

* the revocation broadcast (gateway/revocations.py) wakes that collector's
  sockets at once;
* every control frame re-reads the standing before it is served;
* one sweep per gateway process re-reads, every ``revocation_check_s``, the
  standing of every collector with an open socket in a few batched queries,
  and wakes those that lapsed: the safety net for a lost broadcast or a
  certificate that simply expires. (One query per socket per period would be
  ~170 queries/s at 10,000 sockets.)

A woken socket re-reads its own standing (PostgreSQL is the source of truth)
before it closes with 4401.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
from collections.abc import AsyncIterator
from typing import Any

from common.telemetry.logs import get_logger
from gateway.revocations import RevocationFeed
from gateway.store import GatewayStore

log = get_logger("versus.gateway.standing")

SWEEP_WAKE_PAYLOAD = "sweep"


async def standing_lapsed(state: Any, collector_id: str) -> str:
    """Wait until the collector of an open socket loses its standing; returns the close reason."""
    with state.revocations.watch(collector_id) as announced:
        while True:
            await announced.wait()
            announced.clear()
            try:
                reason = await lapsed_standing(state.store, collector_id)
            except Exception:  # a dependency failed: keep the socket; the next sweep wakes it again
                log.warning("standing check failed; the next sweep retries", exc_info=True)
                continue
            if reason is not None:
                return reason


async def lapsed_standing(store: GatewayStore, collector_id: str) -> str | None:
    """Why an open socket's collector may no longer use it (the close reason), or None while it is active."""
    standing = await store.standing(collector_id)
    if standing is None or standing.cert_not_after <= dt.datetime.now(dt.UTC):
        return "collector_not_active"
    if standing.status != "active":
        return "collector_revoked" if standing.status == "revoked" else "collector_not_active"
    return None


async def sweep_once(store: GatewayStore, feed: RevocationFeed) -> int:
    """Wake the sockets of every watched collector that lapsed; returns how many collectors."""
    watched = feed.keys()
    if not watched:
        return 0
    lapsed = await store.lapsed(watched)
    for collector_id in lapsed:
        feed.wake(collector_id, SWEEP_WAKE_PAYLOAD)
    return len(lapsed)


async def run_sweeps(state: Any) -> None:
    """The periodic sweep of one gateway process; ``state.revocation_check_s`` is read every period."""
    while True:
        await asyncio.sleep(state.revocation_check_s)
        try:
            woken = await sweep_once(state.store, state.revocations)
        except Exception:  # a dependency failed: try again next period
            log.warning("standing sweep failed; retrying next period", exc_info=True)
            continue
        if woken:
            log.info("standing sweep woke sockets", collectors=woken)


@contextlib.asynccontextmanager
async def sweeping(state: Any) -> AsyncIterator[asyncio.Task[None]]:
    """Run the sweep for the lifetime of the block."""
    task = asyncio.create_task(run_sweeps(state))
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
