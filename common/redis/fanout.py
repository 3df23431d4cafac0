"""One Redis subscription per process, fanned out to local waiters by key.

Used for the router's wake-ups (work routed to a collector, a task changed
state) and the gateway's revocation broadcast. Waiters register *before* they
look at the state they wait on, so a message between the look and the wait is
not lost. Redis is never the source of truth here: if the subscription drops,
waiters fall back to their own timeouts and it is re-established.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from redis.asyncio import Redis

from common.telemetry.logs import get_logger

log = get_logger("versus.fanout")

# How many times, and how long each, stop() waits for the subscription task to end.
STOP_ATTEMPTS = 10
STOP_ATTEMPT_S = 0.2


class Wake(asyncio.Event):
    """An event that also keeps the payloads of the messages that set it since it was cleared."""

    def __init__(self) -> None:
        super().__init__()
        self.payloads: set[str] = set()

    def clear(self) -> None:
        super().clear()
        self.payloads = set()


class CallbackWake:
    """A listener that calls ``callback`` (on the event loop, in the fanout's task) instead of
    waking a waiting task: what an open socket with no task of its own registers. It keeps no
    payloads and no waiters: one per socket, at tens of thousands of sockets."""

    __slots__ = ("_callback",)

    def __init__(self, callback: Callable[[], None]) -> None:
        self._callback = callback

    @property
    def payloads(self) -> set[str]:
        return set()  # not kept: what is added to it is dropped

    def set(self) -> None:
        self._callback()


class Fanout:
    """Subscribe to ``channel`` (or ``pattern``) and set the events registered under ``key_of(message)``."""

    def __init__(
        self,
        redis: Redis,
        *,
        key_of: Callable[[dict[str, Any]], str],
        channel: str | None = None,
        pattern: str | None = None,
    ):
        self.redis = redis
        self._key_of = key_of
        self._channel = channel
        self._pattern = pattern
        self._waiters: dict[str, set[Wake | CallbackWake]] = defaultdict(set)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._listen())

    async def stop(self) -> None:
        if self._task is None:
            return
        task, self._task = self._task, None
        # redis-py can swallow a cancellation that lands while it is inside its own read timeout
        # (seen at shutdown right after start), which left shutdown waiting forever: cancel again
        # until the task ends, and give up with a warning after a bound.
        for _ in range(STOP_ATTEMPTS):
            task.cancel()
            await asyncio.wait({task}, timeout=STOP_ATTEMPT_S)
            if task.done():
                if not task.cancelled() and task.exception() is not None:
                    log.warning("subscription task failed", exc_info=task.exception())
                return
        log.warning("subscription task did not stop", channel=self._channel or self._pattern)

    @contextlib.contextmanager
    def listener(self, key: str) -> Iterator[Wake]:
        """An event set whenever a message for ``key`` arrives while the block runs."""
        event = Wake()
        self.add(key, event)
        try:
            yield event
        finally:
            self.discard(key, event)

    def add(self, key: str, event: Wake | CallbackWake) -> None:
        """Set ``event`` whenever a message for ``key`` arrives, until :meth:`discard`: for a
        listener with no task of its own (a :class:`CallbackWake`)."""
        self._waiters[key].add(event)

    def discard(self, key: str, event: Wake | CallbackWake) -> None:
        waiters = self._waiters.get(key)
        if waiters is not None:
            waiters.discard(event)
            if not waiters:
                del self._waiters[key]

    def keys(self) -> list[str]:
        """The keys someone in this process is listening for right now."""
        return list(self._waiters)

    def wake(self, key: str, payload: str = "") -> None:
        """Set the events of ``key``'s listeners in this process, as a message for ``key`` would."""
        # A copy: a callback may end its socket's registration while this runs.
        for event in list(self._waiters.get(key, ())):
            event.payloads.add(payload)
            event.set()

    async def _listen(self) -> None:
        while True:
            try:
                async with self.redis.pubsub() as pubsub:
                    if self._pattern is not None:
                        await pubsub.psubscribe(self._pattern)
                    else:
                        await pubsub.subscribe(self._channel)
                    async for message in pubsub.listen():
                        if message.get("type") not in ("message", "pmessage"):
                            continue
                        self.wake(self._key_of(message), text(message.get("data", b"")))
            except asyncio.CancelledError:
                raise
            except Exception:  # Redis went away: waiters fall back to their timeouts; resubscribe shortly
                log.warning(
                    "subscription lost; retrying", channel=self._channel or self._pattern, exc_info=True
                )
                await asyncio.sleep(1.0)


def text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# How long entering a listener waits for Redis to confirm its subscription; past it the waiter
# goes on and relies on its own timeout (Redis is away or slow; it is never the source of truth).
SUBSCRIBE_WAIT_S = 2.0
# How often subscriptions nobody listens to any more are dropped (in one UNSUBSCRIBE).
UNSUBSCRIBE_EVERY_S = 1.0


class KeyedFanout(Fanout):
    """Like :class:`Fanout`, but subscribed only to the keys someone in this process listens to.

    Each key is its own channel (``prefix + key``). Entering :meth:`listening` subscribes to the
    key's channel and returns once Redis confirmed it, so a message published after that point is
    delivered; when the last listener of a key leaves, its channel is dropped within
    :data:`UNSUBSCRIBE_EVERY_S`. A process thus hears only what concerns the work it holds:
    with several router replicas each hears the wake-ups of the claims it holds, not every one.
    ``always`` keys stay subscribed for the process's life (broadcasts every replica needs).

    Confirmations are matched to subscriptions by order: a channel is unsubscribed only once its
    subscription was confirmed, so the next ``subscribe`` reply for it confirms the newest request.
    """

    def __init__(self, redis: Redis, *, prefix: str, always: tuple[str, ...] = ()):
        super().__init__(redis, key_of=lambda m: text(m["channel"]).removeprefix(prefix), channel=None)
        self.prefix = prefix
        self.always = always
        self._pubsub: Any = None
        # Keys subscribed (or asked for) on the current connection, each with its confirmation.
        self._confirmed: dict[str, asyncio.Future[None]] = {}
        self.received = 0  # messages this process received (a gauge of how much it hears)

    @contextlib.asynccontextmanager
    async def listening(self, key: str) -> AsyncIterator[Wake]:
        """An event set whenever a message for ``key`` arrives while the block runs; the
        subscription is in place (or Redis did not answer in time) when the block starts."""
        with self.listener(key) as event:
            await self._subscribed(key)
            yield event

    async def _subscribed(self, key: str) -> None:
        if self._task is None:
            return  # not started (or stopped): nothing to wait for, local wake-ups still work
        confirmed = self._confirmed.get(key)
        if confirmed is None:
            confirmed = self._confirmed[key] = asyncio.get_running_loop().create_future()
            # Not connected: the listen loop subscribes every key in _confirmed when it connects.
            if self._pubsub is not None:
                try:
                    await self._pubsub.subscribe(self.prefix + key)
                except Exception:  # the connection broke: the listen loop resubscribes
                    log.debug("subscribe failed; the listen loop resubscribes", key=key)
        # asyncio.timeout, not wait_for: Python 3.11's wait_for returns the result when a cancel
        # lands in the turn the confirmation arrives, and the cancel is lost.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(SUBSCRIBE_WAIT_S):
                await asyncio.shield(confirmed)

    def subscribed_now(self, key: str) -> asyncio.Future[None] | None:
        """The confirmation of ``key``'s subscription on the current connection, when it came.

        A waiter that keeps it may compare it later: another object (or None) means the
        connection was replaced since, and messages of the gap may have been missed."""
        confirmed = self._confirmed.get(key)
        if self._pubsub is None or confirmed is None or not confirmed.done() or confirmed.cancelled():
            return None
        return confirmed

    def connection_lost(self) -> None:
        """Called when the subscription's connection broke: messages may have been missed from
        here until it is re-established. Nothing to do for waiters that fall back to their own
        timeouts; a subclass whose waiters must not miss one wakes them here."""

    def _on_reply(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        if kind == "message":
            self.received += 1
            self.wake(self._key_of(message), text(message.get("data", b"")))
        elif kind == "subscribe":
            confirmed = self._confirmed.get(self._key_of(message))
            if confirmed is not None and not confirmed.done():
                confirmed.set_result(None)

    async def _listen(self) -> None:
        pruner = asyncio.create_task(self._prune())
        try:
            while True:
                try:
                    async with self.redis.pubsub() as pubsub:
                        await pubsub.connect()
                        # From here on, listeners subscribe on this connection themselves; the
                        # keys asked for so far (waiters may be waiting on them) are subscribed
                        # now. listen() ends when nothing is subscribed: the always keys keep it.
                        loop = asyncio.get_running_loop()
                        waiting = {k: f for k, f in self._confirmed.items() if not f.done()}
                        wanted = {*self.always, *self.keys(), *waiting}
                        self._confirmed = {k: waiting.get(k) or loop.create_future() for k in wanted}
                        self._pubsub = pubsub
                        await pubsub.subscribe(*(self.prefix + key for key in wanted))
                        async for message in pubsub.listen():
                            self._on_reply(message)
                except asyncio.CancelledError:
                    raise
                except Exception:  # Redis went away: waiters fall back to their timeouts
                    log.warning("subscription lost; retrying", prefix=self.prefix, exc_info=True)
                self._pubsub = None
                self.connection_lost()
                await asyncio.sleep(1.0)
        finally:
            self._pubsub = None
            pruner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pruner

    async def _prune(self) -> None:
        while True:
            await asyncio.sleep(UNSUBSCRIBE_EVERY_S)
            listened = {*self.always, *self.keys()}
            idle = [
                key for key, confirmed in self._confirmed.items() if key not in listened and confirmed.done()
            ]
            if not idle or self._pubsub is None:
                continue
            for key in idle:
                del self._confirmed[key]
            try:
                await self._pubsub.unsubscribe(*(self.prefix + key for key in idle))
            except Exception:  # the connection broke; the next one subscribes only what is listened
                log.debug("unsubscribe failed", exc_info=True)
