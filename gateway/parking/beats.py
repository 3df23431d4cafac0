"""Heartbeats of parked claims, written to Redis in batches (at most one round trip per interval).

A claim is the collector's heartbeat. One the router answers records it itself
(router/core/live.py, with the session's adoption and what it must take); one the gateway
parks only refreshes what the router recorded last: the time of the last claim (the live set
placement and the sweeper read) and the claim number in the session hash. The script refuses,
per collector, a beat it cannot record as given: the session hash is gone (Redis flushed or
restarted empty), another session is current, the session said goodbye, or the collector was
not live within the window (the router treats a return as news). Those collectors' next claims
go to the router (gateway/parking/decide.py ``LIVENESS``), which records them in full.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from redis.asyncio import Redis

from common.redis.fanout import text
from common.redis.keys import LIVE, SESSION, SESSION_TTL_S
from common.runtime.tasks import cancel_and_wait
from common.telemetry.logs import get_logger

log = get_logger("versus.gateway.parking")

# How often the batch is written; a parked claim's heartbeat reaches Redis within this.
BEAT_EVERY_S = 1.0
# Collectors per script call: bounds how long one call holds Redis (~2 µs per collector).
BEAT_CHUNK = 500


@dataclass(frozen=True, slots=True)
class Beat:
    """One parked claim's heartbeat."""

    session_id: str
    claim_seq: int
    at: float  # unix seconds, when the claim arrived


# KEYS: live set. ARGV: session prefix, liveness window (s), session ttl (s), then
# (collector id, session id, claim seq, time) per beat. Returns the collectors not recorded.
_TOUCH = """
local refused = {}
local window = tonumber(ARGV[2])
for i = 4, #ARGV, 4 do
  local cid, sid, seq, at = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  local key = ARGV[1] .. cid
  local session = redis.call('HMGET', key, 'session_id', 'bye_at')
  local previous = redis.call('ZSCORE', KEYS[1], cid)
  if redis.call('EXISTS', key) == 0 or session[2] or (sid ~= '' and session[1] ~= sid)
      or not previous or tonumber(at) - tonumber(previous) > window then
    refused[#refused + 1] = cid
  else
    redis.call('ZADD', KEYS[1], 'GT', at, cid)
    redis.call('HSET', key, 'last_claim', at, 'claim_seq', seq)
    redis.call('EXPIRE', key, ARGV[3])
  end
end
return refused
"""


async def record(redis: Redis, beats: dict[str, Beat], window_s: float) -> set[str]:
    """Record ``beats`` (collector id -> beat); returns the collectors whose beat was refused."""
    refused: set[str] = set()
    items = list(beats.items())
    for start in range(0, len(items), BEAT_CHUNK):
        args: list[str] = [SESSION, str(window_s), str(SESSION_TTL_S)]
        for cid, beat in items[start : start + BEAT_CHUNK]:
            args += [cid, beat.session_id, str(beat.claim_seq), repr(beat.at)]
        reply = await redis.eval(_TOUCH, 1, LIVE, *args)
        refused.update(text(cid) for cid in reply)
    return refused


class BeatWriter:
    """Collects parked claims' heartbeats and writes them every :data:`BEAT_EVERY_S`.

    ``refused`` is called with the collectors whose beat Redis did not record, or with every
    collector of the batch when the write failed (Redis away): their next claims go to the router.
    """

    def __init__(
        self,
        redis: Redis,
        window_s: float,
        refused: Callable[[Iterable[str]], None],
        every_s: float = BEAT_EVERY_S,
    ):
        self.redis = redis
        self.window_s = window_s
        self._refused = refused
        self.every_s = every_s
        self._due: dict[str, Beat] = {}
        self._task: asyncio.Task[None] | None = None
        self.written = 0  # beats recorded by this process (a gauge of the parked load)

    def add(self, collector_id: str, beat: Beat) -> None:
        self._due[collector_id] = beat

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None
        await self.flush()  # what was parked last is still recorded

    async def flush(self) -> None:
        due, self._due = self._due, {}
        if not due:
            return
        try:
            refused = await record(self.redis, due, self.window_s)
        except Exception:  # Redis away: the router records these collectors' next claims instead
            log.warning("parked heartbeats not recorded; their next claims go to the router",
                        collectors=len(due), exc_info=True)  # fmt: skip
            self._refused(due)
            return
        self.written += len(due) - len(refused)
        if refused:
            self._refused(refused)

    async def _run(self) -> None:
        me = asyncio.current_task()
        # Ends on a cancel request even if redis-py swallowed it inside a read (router/trust/fleet_news.py).
        while me is None or not me.cancelling():
            await asyncio.sleep(self.every_s)
            await self.flush()
