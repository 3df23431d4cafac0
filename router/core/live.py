"""Redis side of the router: liveness, in-flight counters and wake-ups.

Redis is never the source of truth. Liveness is the time of each collector's
last claim; in-flight counters per collector and provider steer placement
(the authoritative capacity check is made in PostgreSQL under a lock); they
are rebuilt from PostgreSQL whenever their marker key is missing, so a Redis
restart or FLUSHALL costs a rebuild, never an over-dispatch. Wake-ups are
pub/sub messages that let a waiting claim return as soon as work is routed to
its collector, without polling the database.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from redis.asyncio import Redis

from common.redis.fanout import text
from common.redis.keys import LIVE, SESSION, SESSION_TTL_S, WORK_NOTE
from common.telemetry.logs import get_logger
from router.core.fleet_state import DEAD_AFTER_S

LIVENESS_WINDOW_S = int(DEAD_AFTER_S)  # a collector silent this long is dead: no more placement
_LIVE = LIVE
_SESSION = SESSION
# Session ids a newer session of the same collector replaced; their claims are refused.
_SUPERSEDED = "versus:superseded:"
_INFLIGHT = "versus:inflight:"
_BUILT = "versus:inflight:built"
# Dispatch ids whose cancel the collector has not been told of yet (router/dispatch/cancels.py).
_CANCELS = "versus:cancel:"
# Credential revocations the collector has not been told of yet (router/credentials/revocations.py).
_REVOKES = "versus:revoke:"

log = get_logger("versus.router.live")


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _words(value: bytes | str) -> tuple[str, ...]:
    return tuple(sorted(text(value).split()))


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """What recording a claim found.

    ``adopted`` is 1 if the session just became current in place of another, 2 if it just became
    current with none before it (nothing to supersede), 0 if it already was and -1 if a newer
    session superseded it (then nothing is recorded: a superseded process must not overwrite the
    current session's details); ``came_back`` is True when the collector had not claimed within
    the liveness window; ``cancels`` are the dispatch ids it must now be told to stop and
    ``revokes`` the credential revocations it must now be told of.
    """

    adopted: int
    came_back: bool
    cancels: tuple[str, ...] = ()
    revokes: tuple[str, ...] = ()
    # Work was announced for the collector in the last WORK_NOTE_MS (taken by this heartbeat).
    work_noted: bool = False


class Liveness:
    def __init__(self, redis: Redis, window_s: int = LIVENESS_WINDOW_S):
        self.redis = redis
        self.window_s = window_s

    async def touch(self, collector_id: str, now: float, session: Mapping[str, str] | None = None) -> bool:
        """Record a claim (and what the collector said about itself); True when it just came back."""
        beat = await self.heartbeat(collector_id, "", now, session or {})
        return beat.came_back

    async def heartbeat(
        self,
        collector_id: str,
        session_id: str,
        now: float,
        session: Mapping[str, str],
        take_cancels: bool = False,
        take_revokes: bool = False,
    ) -> Heartbeat:
        """Adopt ``session_id`` and record the claim, atomically and in one round trip; with
        ``take_cancels`` / ``take_revokes``, also take the cancels and credential revocations noted
        for the collector (:meth:`note_cancel`, :meth:`note_revoke`)."""
        fields: list[str] = ["last_claim", str(now)]
        for key, value in session.items():
            fields += [key, value]
        flags = ("c" if take_cancels else "") + ("r" if take_revokes else "")
        reply = await self.redis.eval(
            _HEARTBEAT, 6,
            _SESSION + collector_id, _SUPERSEDED + collector_id, _LIVE, _CANCELS + collector_id,
            _REVOKES + collector_id, WORK_NOTE + collector_id,
            session_id, str(now), str(SESSION_TTL_S), collector_id, flags or "-", *fields,
        )  # fmt: skip
        adopted, previous, cancels, revokes, noted = (*reply, b"")[:5]
        came_back = not previous or now - float(previous) > self.window_s
        return Heartbeat(int(adopted), came_back, _words(cancels), _words(revokes), bool(noted))

    async def note_cancel(self, collector_id: str, dispatch_id: str) -> None:
        """Remember that the collector must be told to stop ``dispatch_id`` (its next claim takes it)."""
        await self._note(_CANCELS + collector_id, dispatch_id)

    async def take_cancels(self, collector_id: str) -> tuple[str, ...]:
        """The cancels noted for the collector, removed as they are read."""
        return await self._take(_CANCELS + collector_id)

    async def note_revoke(self, collector_id: str, revocation_id: str) -> None:
        """Remember that the collector must be told of a credential revocation."""
        await self._note(_REVOKES + collector_id, revocation_id)

    async def take_revokes(self, collector_id: str) -> tuple[str, ...]:
        return await self._take(_REVOKES + collector_id)

    async def _note(self, key: str, member: str) -> None:
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.sadd(key, member)
            pipe.expire(key, SESSION_TTL_S)
            await pipe.execute()

    async def _take(self, key: str) -> tuple[str, ...]:
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.smembers(key)
            pipe.delete(key)
            members, _ = await pipe.execute()
        return tuple(sorted(text(m) for m in members))

    async def is_superseded(self, collector_id: str, session_id: str) -> bool:
        return bool(await self.redis.sismember(_SUPERSEDED + collector_id, session_id))

    async def session(self, collector_id: str) -> dict[str, str]:
        """What the collector's last claim said about its session (empty if none in the last day)."""
        raw = await self.redis.hgetall(_SESSION + collector_id)
        return {_text(k): _text(v) for k, v in raw.items()}

    async def goodbye(self, collector_id: str, session_id: str, reason: str, now: float) -> bool:
        """Record that the session said goodbye (a clean shutdown); False when it is not the
        collector's current session (nothing recorded). Until the collector claims again it
        is offline: placement passes it over and the sweeper counts it silent at once."""
        done = await self.redis.eval(
            _GOODBYE, 1, _SESSION + collector_id, session_id, str(now), reason[:200], str(SESSION_TTL_S)
        )
        return bool(done)

    async def forget(self, collector_id: str) -> None:
        """Drop the collector from the live set (it was revoked): placement and the sweeper see it dead."""
        await self.redis.zrem(_LIVE, collector_id)

    async def self_draining(self, collector_ids: Iterable[str]) -> set[str]:
        """Collectors that said on their last claim that they are draining (e.g. before an upgrade)."""
        ids = list(collector_ids)
        if not ids:
            return set()
        pipe = self.redis.pipeline(transaction=False)
        for cid in ids:
            pipe.hget(_SESSION + cid, "draining")
        flags = await pipe.execute()
        return {cid for cid, flag in zip(ids, flags, strict=True) if flag == b"1"}

    async def live(self, collector_ids: Iterable[str], now: float) -> set[str]:
        ids = list(collector_ids)
        if not ids:
            return set()
        scores = await self.redis.zmscore(_LIVE, ids)
        return {
            cid
            for cid, score in zip(ids, scores, strict=True)
            if score is not None and now - score <= self.window_s
        }

    async def silent(self, collector_ids: Iterable[str], now: float) -> set[str]:
        """Collectors known to have been silent for the whole liveness window.

        After Redis lost its data (FLUSHALL, or a restart without it) a collector missing from
        the live set is not dead but unknown: it counts as last seen when this router first
        noticed the loss (the ``since`` marker, tied to the Redis server's run id), so losing
        Redis costs at most a window of waiting and never turns a healthy holder's work into
        an unknown outcome.
        """
        ids = list(collector_ids)
        if not ids:
            return set()
        info = await self.redis.info("server")
        run_id = str(info.get("run_id", ""))
        reply = await self.redis.eval(_SILENT, 2, _LIVE, _SINCE, run_id, str(now), _SESSION, *ids)
        since = float(reply[0])
        out = set()
        for cid, score in zip(ids, reply[1:], strict=True):
            if score == b"bye":
                out.add(cid)  # it said goodbye: nothing it holds will be answered
                continue
            # Anything older than the marker was recorded by another Redis server (a restored snapshot).
            last = max(float(score), since) if score else since
            if now - last > self.window_s:
                out.add(cid)
        return out

    async def last_seen(self, collector_id: str) -> float | None:
        score = await self.redis.zscore(_LIVE, collector_id)
        return None if score is None else float(score)

    async def all_last_seen(self) -> dict[str, float]:
        """Every collector's last claim (Unix time) in one read: the fleet gauges' sample
        (router/fleet/gauges.py), a few hundred KiB for ten thousand collectors."""
        pairs = await self.redis.zrange(_LIVE, 0, -1, withscores=True)
        return {_text(pair[0]): float(pair[1]) for pair in pairs if isinstance(pair, tuple)}

    async def heard_between(self, oldest: float, newest: float) -> list[str]:
        """Collectors whose last claim was between these times (unix seconds, inclusive)."""
        members = await self.redis.zrangebyscore(_LIVE, oldest, newest)
        return [_text(m) for m in members if isinstance(m, bytes | str)]

    async def sessions(self, collector_ids: Sequence[str]) -> dict[str, tuple[float | None, dict[str, str]]]:
        """:meth:`last_seen` and :meth:`session` of many collectors in one round trip (a page)."""
        ids = list(collector_ids)
        if not ids:
            return {}
        pipe = self.redis.pipeline(transaction=False)
        pipe.zmscore(_LIVE, ids)
        for cid in ids:
            pipe.hgetall(_SESSION + cid)
        scores, *details = await pipe.execute()
        return {
            cid: (None if score is None else float(score), {_text(k): _text(v) for k, v in raw.items()})
            for cid, score, raw in zip(ids, scores, details, strict=True)
        }


# Since when the live set has been tracked by this Redis server: "<run id>:<unix time>".
_SINCE = "versus:live:since"
# KEYS: live set, since marker. ARGV: run id, now, session prefix, collector ids... -> since, then
# each score, '' (none) or 'bye' (the session said goodbye since its last claim).
_SILENT = """
local marker = redis.call('GET', KEYS[2])
local since = false
if marker then
  local sep = string.find(marker, ':', 1, true)
  if sep and string.sub(marker, 1, sep - 1) == ARGV[1] then since = string.sub(marker, sep + 1) end
end
if not since then
  since = ARGV[2]
  redis.call('SET', KEYS[2], ARGV[1] .. ':' .. ARGV[2])
end
local out = {since}
for i = 4, #ARGV do
  if redis.call('HEXISTS', ARGV[3] .. ARGV[i], 'bye_at') == 1 then
    out[#out + 1] = 'bye'
  else
    out[#out + 1] = redis.call('ZSCORE', KEYS[1], ARGV[i]) or ''
  end
end
return out
"""

# KEYS: session hash. ARGV: session id, now, reason, ttl -> 1 if recorded, 0 if not the current session.
_GOODBYE = """
local current = redis.call('HGET', KEYS[1], 'session_id')
if ARGV[1] == '' or current ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'bye_at', ARGV[2], 'bye_reason', ARGV[3])
redis.call('EXPIRE', KEYS[1], ARGV[4])
return 1
"""

# Atomic so two sessions claiming at once cannot both become current.
# KEYS: session hash, superseded set, live set, noted cancels, noted revokes. ARGV: session id
# ('' = none), now, ttl, collector id, what to take ('c' cancels, 'r' revokes, '-' nothing), then
# field/value pairs for the session hash. Returns adopted (Heartbeat says what each value means),
# the previous claim's time, and the cancels and revokes taken (space-separated).
_HEARTBEAT = """
local adopted = 0
if ARGV[1] ~= '' then
  if redis.call('SISMEMBER', KEYS[2], ARGV[1]) == 1 then return {-1, '', '', '', ''} end
  local current = redis.call('HGET', KEYS[1], 'session_id')
  if current ~= ARGV[1] then
    adopted = 2
    if current then
      redis.call('SADD', KEYS[2], current)
      redis.call('EXPIRE', KEYS[2], ARGV[3])
      adopted = 1
    end
    redis.call('HSET', KEYS[1], 'session_id', ARGV[1], 'established_at', ARGV[2])
  end
end
local previous = redis.call('ZSCORE', KEYS[3], ARGV[4]) or ''
redis.call('ZADD', KEYS[3], ARGV[2], ARGV[4])
redis.call('HDEL', KEYS[1], 'bye_at', 'bye_reason')
if #ARGV > 5 then redis.call('HSET', KEYS[1], unpack(ARGV, 6, #ARGV)) end
redis.call('EXPIRE', KEYS[1], ARGV[3])
local function take(key, wanted)
  if not string.find(ARGV[5], wanted, 1, true) then return '' end
  local noted = redis.call('SMEMBERS', key)
  if #noted == 0 then return '' end
  redis.call('DEL', key)
  return table.concat(noted, ' ')
end
local noted = redis.call('GET', KEYS[6])
if noted then redis.call('DEL', KEYS[6]) end
return {adopted, previous, take(KEYS[4], 'c'), take(KEYS[5], 'r'), noted or ''}
"""


class InFlight:
    """Per-collector, per-provider counters of leased, dispatched and running work."""

    def __init__(self, redis: Redis, load: Callable[[], Awaitable[Mapping[tuple[str, str], int]]]):
        self.redis = redis
        self._load = load
        self._lock = asyncio.Lock()

    async def ensure_built(self) -> None:
        if await self.redis.exists(_BUILT):
            return
        async with self._lock:
            if await self.redis.exists(_BUILT):
                return
            log.info("in-flight counters missing from Redis; rebuilding from PostgreSQL")
            await self.rebuild()

    async def rebuild(self) -> None:
        counts = await self._load()
        per_collector: dict[str, dict[str, int]] = defaultdict(dict)
        for (collector_id, provider), n in counts.items():
            per_collector[collector_id][provider] = n
        pipe = self.redis.pipeline(transaction=True)
        async for key in self.redis.scan_iter(match=f"{_INFLIGHT}*", count=500):
            if key != _BUILT.encode():
                pipe.delete(key)
        for collector_id, providers in per_collector.items():
            pipe.hset(_INFLIGHT + collector_id, mapping=dict(providers))  # type: ignore[arg-type]
        # The marker names the Redis server that holds the counters (see check_server).
        pipe.set(_BUILT, await self._run_id())
        await pipe.execute()
        log.debug("in-flight counters rebuilt from PostgreSQL", collectors=len(per_collector))

    async def _run_id(self) -> str:
        info = await self.redis.info("server")
        return str(info.get("run_id", "1"))

    async def check_server(self) -> bool:
        """Drop the counters' marker when another Redis server holds them now than built them (a
        Sentinel failover, a restart from a snapshot): a replica promoted to master may have missed
        the last increments, so the next read rebuilds them from PostgreSQL, as after a FLUSHALL.
        Whether the marker was dropped. The sweeper calls this on every pass."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.info("server")
        pipe.get(_BUILT)
        info, built = await pipe.execute()
        run_id = str(info.get("run_id", ""))
        if built == b"1":  # built by a release that did not record the server: adopt this one
            await self.redis.set(_BUILT, run_id, xx=True)
            return False
        if built is None or built.decode() == run_id:
            return False
        log.warning("in-flight counters were built on another Redis server; rebuilding")
        await self.redis.delete(_BUILT)
        return True

    async def add(self, collector_id: str, provider: str, delta: int) -> None:
        # No marker check here: after a flush this creates a partial counter, and the next read
        # sees the marker missing and rebuilds everything from PostgreSQL (one round trip saved).
        await self.redis.hincrby(_INFLIGHT + collector_id, provider, delta)

    async def get(self, collector_ids: Iterable[str]) -> dict[str, dict[str, int]]:
        """Counts per provider of each collector (for operators; placement uses placement_view)."""
        await self.ensure_built()
        ids = list(collector_ids)
        pipe = self.redis.pipeline(transaction=False)
        for cid in ids:
            pipe.hgetall(_INFLIGHT + cid)
        rows = await pipe.execute()
        return {
            cid: {_text(k): max(int(v), 0) for k, v in row.items()}
            for cid, row in zip(ids, rows, strict=True)
        }


@dataclass(frozen=True, slots=True)
class PlacementView:
    """What Redis says about some collectors: live ones, in-flight counts, self-declared drains and
    the protocol version settled on each one's last claim."""

    live: set[str]
    loads: dict[str, dict[str, int]]
    draining: set[str]
    protocols: dict[str, int] = field(default_factory=dict)


# One command for the whole candidate list (a pipeline of per-collector commands cost more
# in client-side packing and parsing than the placement itself). Returns false when the
# counters' marker is missing. Keys are derived from ids inside the script, so this needs a
# single Redis server, not a cluster.
# KEYS: marker, live set. ARGV: in-flight prefix, session prefix, provider, ids...
_PLACEMENT_VIEW = """
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
local out = {}
for i = 4, #ARGV do
  local cid = ARGV[i]
  local session = redis.call('HMGET', ARGV[2] .. cid, 'draining', 'bye_at', 'protocol')
  -- A collector that said goodbye and has not claimed since is offline: not live.
  out[#out + 1] = session[2] and '' or (redis.call('ZSCORE', KEYS[2], cid) or '')
  out[#out + 1] = redis.call('HGET', ARGV[1] .. cid, ARGV[3]) or '0'
  out[#out + 1] = session[1] or ''
  out[#out + 1] = session[3] or '1'
end
return out
"""


async def placement_view(
    redis: Redis, in_flight: InFlight, collector_ids: list[str], provider: str, now: float, window_s: int
) -> PlacementView:
    """Liveness, ``provider`` loads and drain flags of ``collector_ids`` in one Redis round trip.

    A missing counters' marker (Redis restarted or flushed) triggers a rebuild and one retry.
    """
    if not collector_ids:
        return PlacementView(set(), {}, set())
    args = (_INFLIGHT, _SESSION, provider, *collector_ids)
    reply = await redis.eval(_PLACEMENT_VIEW, 2, _BUILT, _LIVE, *args)
    if not reply:
        await in_flight.ensure_built()
        reply = await redis.eval(_PLACEMENT_VIEW, 2, _BUILT, _LIVE, *args) or []
    view = PlacementView(set(), {}, set())
    for i, cid in enumerate(collector_ids):
        score, load, draining, version = reply[4 * i : 4 * i + 4] or (b"", b"0", b"", b"1")
        if score and now - float(score) <= window_s:
            view.live.add(cid)
        view.loads[cid] = {provider: max(int(load), 0)}
        if draining == b"1":
            view.draining.add(cid)
        view.protocols[cid] = int(version) if version.isdigit() else 1
    return view
