"""Claims parked in the gateway that holds the collector's connection.

One Redis subscription per gateway process (common/redis/fanout.py :class:`KeyedFanout`) to the
wake-up channel of every collector it has seen claim within :data:`LINGER_S` (a *watch*), and to
the fleet-news broadcast. A watch is subscribed before the claim that created it is forwarded,
and stays subscribed between claims, so everything the router announces for the collector after
a forwarded claim began is heard here: such a claim goes to the router, any other waits out its
hold in this process (gateway/parking/decide.py says which), with its heartbeat batched to Redis
(gateway/parking/beats.py). An idle fleet thus costs the router nothing per claim.

A parked claim is woken by a wake-up for its collector and then forwarded with what is left of
its hold; by a newer claim of the same collector (it ends empty: its collector gave up on it);
and when the subscription's connection breaks (forwarded: a wake-up may be lost in the gap).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio import Redis

from common.redis.fanout import KeyedFanout, Wake
from common.redis.keys import FLEET_NEWS, WAKE
from common.runtime.tasks import cancel_and_wait
from gateway.metrics import CLAIMS_FORWARDED, CLAIMS_PARKED, PARKING_WATCHES
from gateway.parking.beats import BEAT_EVERY_S, Beat, BeatWriter
from gateway.parking.decide import ClaimNews, Forward, ParkState, forward_reason

# The router's liveness window (router/core/fleet_state.py DEAD_AFTER_S; a unit test checks).
LIVENESS_WINDOW_S = 180.0
# A watch outlives its collector's last claim by this much: a collector claims again at once
# after an answer (HTTPS reconnects, WSS sends the next frame), so only a gone one lapses.
LINGER_S = 60.0
# A claim goes to the router at least this often per collector, whatever else: the bound on how
# long anything not announced by a wake-up (nothing known today) could stay unseen.
REFRESH_S = 300.0
# A claim parked on the control socket has its heartbeat written again this often (the router
# calls a collector stale after 60 s without one: router/core/fleet_state.py STALE_AFTER_S) ...
BEAT_REFRESH_S = 20.0
# ... while its socket was heard from this recently: the gateway pings every 20 s and gives a pong
# 20 s (gateway/server.py), so a live collector is heard at least every ~20 s plus a round trip.
HEARD_WITHIN_S = 45.0
# Local payload that ends a parked claim because a newer claim of its collector arrived.
NEWER_CLAIM = "newer-claim"
# Local payload that forwards parked claims: the subscription broke, or a heartbeat was refused.
RECHECK = "recheck"


@dataclass(slots=True)
class _Watch:
    state: ParkState = field(default_factory=ParkState)
    # The subscription confirmation this watch relies on (KeyedFanout.subscribed_now).
    confirmed: asyncio.Future[None] | None = None
    claims: int = 0  # claims of the collector in progress here
    last_used: float = 0.0  # monotonic
    newest: object | None = None  # the newest claim in progress


@dataclass(frozen=True, slots=True)
class Parked:
    """What a claim may do: wait here (``forward`` None) or go to the router, and why."""

    forward: Forward | None
    watch: _Watch
    token: object
    woken: Wake


class ClaimParking(KeyedFanout):
    """The gateway's watches, parked claims and their batched heartbeats."""

    def __init__(
        self,
        redis: Redis,
        *,
        refresh_s: float = REFRESH_S,
        linger_s: float = LINGER_S,
        beat_every_s: float = BEAT_EVERY_S,
        window_s: float = LIVENESS_WINDOW_S,
        beat_refresh_s: float = BEAT_REFRESH_S,
    ):
        super().__init__(redis, prefix=WAKE, always=(FLEET_NEWS,))
        self.refresh_s = refresh_s
        self.linger_s = linger_s
        self.beat_refresh_s = beat_refresh_s
        self._watches: dict[str, _Watch] = {}
        self.beats = BeatWriter(redis, window_s, self._refused, beat_every_s)
        self._reaper: asyncio.Task[None] | None = None

    # --- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        super().start()
        self.beats.start()
        if self._reaper is None:
            self._reaper = asyncio.create_task(self._reap())

    async def stop(self) -> None:
        await cancel_and_wait(self._reaper)
        self._reaper = None
        await self.beats.stop()
        await super().stop()

    # --- what the fanout hears ---------------------------------------------------------------
    def keys(self) -> list[str]:
        # Watched collectors stay subscribed between their claims.
        return list({*self._waiters, *self._watches})

    def wake(self, key: str, payload: str = "") -> None:
        if key == FLEET_NEWS:
            for cid, watch in self._watches.items():
                watch.state.mark(Forward.WOKEN)
                super().wake(cid, payload)
            return
        watched = self._watches.get(key)
        if watched is not None and payload != NEWER_CLAIM:
            watched.state.mark(Forward.WOKEN)
        super().wake(key, payload)

    def connection_lost(self) -> None:
        for cid, watch in self._watches.items():
            watch.state.mark(Forward.UNSUBSCRIBED)
            super().wake(cid, RECHECK)

    def _refused(self, collector_ids: Iterable[str]) -> None:
        for cid in collector_ids:
            watch = self._watches.get(cid)
            if watch is not None:
                watch.state.mark(Forward.LIVENESS)
                super().wake(cid, RECHECK)

    # --- claims ------------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def claim(
        self, collector_id: str, news: ClaimNews, *, resume: bool, hold_s: float
    ) -> AsyncIterator[Parked]:
        """Decide one claim's course; the block runs it (parked or forwarded) and the watch lingers."""
        watch = self._watches.get(collector_id)
        if watch is None:
            watch = self._watches[collector_id] = _Watch()
            PARKING_WATCHES.set(len(self._watches))
        watch.claims += 1
        token = object()
        previous, watch.newest = watch.newest, token
        if previous is not None:
            # Collectors claim one at a time: an older claim still here was given up on.
            super().wake(collector_id, NEWER_CLAIM)
        try:
            with self.listener(collector_id) as woken:
                if watch.confirmed is None or self.subscribed_now(collector_id) is not watch.confirmed:
                    # New, or the subscription was replaced: wake-ups of the gap may be lost.
                    watch.state.forget()
                    await self._subscribed(collector_id)
                    watch.confirmed = self.subscribed_now(collector_id)
                why = forward_reason(
                    watch.state, news, time.monotonic(),
                    subscribed=watch.confirmed is not None, resume=resume, refresh_s=self.refresh_s,
                    hold_s=hold_s,
                )  # fmt: skip
                woken.clear()  # what woke it before now is in the decision (state.pending)
                yield Parked(why, watch, token, woken)
        finally:
            watch.claims -= 1
            watch.last_used = time.monotonic()
            if watch.newest is token:
                watch.newest = None

    async def park(
        self,
        parked: Parked,
        collector_id: str,
        beat: Beat,
        hold_s: float,
        heard_at: Callable[[], float] | None = None,
    ) -> bool:
        """Wait out a parked claim; True when it must now go to the router (woken), False when it
        ends empty (its hold ran out, or a newer claim of the collector replaced it).

        ``heard_at`` (monotonic time the collector's connection last delivered anything) is given
        for a claim on the control socket, whose hold outlasts the router's staleness bound: every
        :data:`BEAT_REFRESH_S` the claim's heartbeat is written again, as long as the socket was
        heard from within :data:`HEARD_WITHIN_S` (the gateway's pings get answers)."""
        CLAIMS_PARKED.inc()
        self.beats.add(collector_id, beat)
        deadline = time.monotonic() + hold_s
        while (left := deadline - time.monotonic()) > 0:
            slice_s = left if heard_at is None else min(left, self.beat_refresh_s)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(slice_s):
                    while True:
                        await parked.woken.wait()
                        if parked.watch.newest is not parked.token:
                            return False
                        if parked.woken.payloads - {NEWER_CLAIM}:
                            return True
                        parked.woken.clear()
            if heard_at is not None and time.monotonic() - heard_at() <= HEARD_WITHIN_S:
                self.beats.add(collector_id, Beat(beat.session_id, beat.claim_seq, time.time()))
        return False

    def forwarding(self, parked: Parked) -> None:
        """The claim goes to the router now (called once the subscription is in place)."""
        CLAIMS_FORWARDED.labels((parked.forward or Forward.WOKEN).value).inc()
        parked.watch.state.forwarding(time.monotonic())

    @staticmethod
    def answered(parked: Parked, news: ClaimNews, empty: bool) -> None:
        parked.watch.state.answered(news, empty)

    def watched(self) -> int:
        return len(self._watches)

    async def _reap(self) -> None:
        while True:
            await asyncio.sleep(max(self.linger_s / 4, 0.05))
            cutoff = time.monotonic() - self.linger_s
            gone = [c for c, w in self._watches.items() if w.claims == 0 and w.last_used < cutoff]
            for cid in gone:
                del self._watches[cid]  # its channel is dropped by the fanout's pruning
            if gone:
                PARKING_WATCHES.set(len(self._watches))


def news_of(body: Any, transport: str, settled: int) -> ClaimNews:
    """A claim body's news (gateway/collector_bodies.py ClaimBody), as plain values."""
    status = body.update_status
    return ClaimNews(
        session_id=body.session_id,
        transport=transport,
        protocol=settled,
        draining=body.draining,
        agent_version=body.agent_version,
        vault_mode=body.vault_mode,
        config_version=body.config_version,
        max_tasks=body.max_tasks,
        key_versions=tuple(sorted((str(k), int(v)) for k, v in body.key_versions.items())),
        free_slots=tuple(sorted((str(k), max(int(v), 0)) for k, v in body.capacity.items())),
        held_task_ids=tuple(sorted(body.held_task_ids)),
        update_status=()
        if status is None
        else tuple(sorted((str(k), str(v)) for k, v in status.model_dump().items())),
    )
