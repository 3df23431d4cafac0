"""Live updates: a server-sent event stream that tells an open page its data changed.

A page that shows fleet state (the Collectors list, a collector's detail, the dispatch queue,
the Tasks list and a task's page)
opens ``GET /live?path=<its path and query>``. The console reads that page's data again every
:data:`POLL_S` seconds over gRPC, as the signed-in operator (so RBAC and tenant scope apply to
the stream exactly as to the page), and sends ``event: changed`` when what the page shows is
different; ``static/live.js`` then fetches the page and swaps its ``<main>``. Nothing is pushed
that the page would not show on a reload, and without JavaScript the pages still read and act.

Polling the services (instead of a change feed) keeps the console a plain gRPC client; the
cost is one list or detail call per open page every two seconds, bounded by
:data:`MAX_STREAMS`. A stream ends after :data:`MAX_STREAM_S` (the browser reconnects), when
the session ends (``event: signedout``) or when the console stops.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from common.errors import VersusError
from console.queue_views import OUTCOMES
from console.sessions import COOKIE
from console.task_pages import PAGE_SIZE as TASK_PAGE_SIZE
from console.task_views import FilterInvalid, TaskFilters
from console.views import CollectorFilters

# As many as a collector's page shows (console/app.py).
RECENT_WORK = 20

if TYPE_CHECKING:
    from console.backend import Backend
    from console.pages import Console
    from console.sessions import Session

POLL_S = 2.0
KEEPALIVE_S = 15.0
MAX_STREAM_S = 600.0
# Open streams per console process; beyond it a page gets 503 and simply stays static.
MAX_STREAMS = 200
RETRY_MS = 3000

Reader = Callable[[], Awaitable[Any]]


def reader(backend: Backend, token: str, target: str) -> Reader | None:
    """What the page at ``target`` (a path and query) shows, as a function to call again; None for
    a page that is not live."""
    parts = urlsplit(target)
    path, query = parts.path, {k: v[0] for k, v in parse_qs(parts.query).items()}
    page = query.get("page", "")[:500]
    if path == "/collectors":
        filters = CollectorFilters.parse(query)

        async def collectors() -> Any:
            listed = await backend.collectors(token, filters, page)
            return [listed.outdated_count, [asdict(c) for c in listed.collectors]]

        return collectors
    if path.startswith("/collectors/") and path.count("/") == 2:
        collector_id = path.removeprefix("/collectors/")

        async def collector() -> Any:
            # The heartbeat's age changes every second: the session state says what matters.
            work = await backend.dispatches(token, "all", "", collector_id, "", page_size=RECENT_WORK)
            shown = {**asdict(await backend.collector(token, collector_id)), "heartbeat_age": ""}
            return [shown, [asdict(d) for d in work.dispatches]]

        return collector
    if path == "/queue":
        outcome = query.get("outcome", "all")
        if outcome not in OUTCOMES:
            return None
        site, collector_id = query.get("site", "")[:200], query.get("collector", "")[:200]

        async def dispatches() -> Any:
            listed = await backend.dispatches(token, outcome, site, collector_id, page)
            return [asdict(d) for d in listed.dispatches]

        return dispatches
    if path == "/":

        async def overview() -> Any:
            # A new sample alone is not a change; what it counts is.
            got = await backend.fleet_health(token)
            got.ClearField("sampled_at")
            return got.SerializeToString(deterministic=True).hex()

        return overview
    if path == "/tasks":
        return _tasks_reader(backend, token, query, page)
    if path.startswith("/tasks/") and path.count("/") == 2:
        task_id = path.removeprefix("/tasks/")

        async def task() -> Any:
            # Elapsed time ticks by itself; a state change, an attempt or more output is a change.
            detail = await backend.task(token, task_id, dt.datetime.now(dt.UTC))
            return [asdict(detail.row) | {"elapsed": ""}, detail.output_length, len(detail.attempts)]

        return task
    return None


def _tasks_reader(backend: Backend, token: str, query: dict[str, str], page: str) -> Reader | None:
    try:
        filters = TaskFilters.parse(query)
    except FilterInvalid:
        return None

    async def tasks() -> Any:
        now = dt.datetime.now(dt.UTC)
        listed = await backend.tasks(token, filters, page, TASK_PAGE_SIZE, now)
        return [asdict(t) | {"elapsed": ""} for t in listed.tasks]

    return tasks


def fingerprint(shown: Any) -> str:
    """A digest of what a page shows (views are dataclasses of plain values)."""
    return hashlib.sha256(json.dumps(shown, sort_keys=True, default=str).encode()).hexdigest()


class Streams:
    """The open streams of this process, bounded."""

    def __init__(self, limit: int = MAX_STREAMS):
        self.limit = limit
        self.open = 0


def routes(console: Console, stopping: Callable[[], bool]) -> list[Route]:
    streams = Streams()

    async def live(request: Request) -> Response:
        session = await console.session(request)
        if session is None:
            return console.refusal(401, "session_missing", "sign in first")
        read = reader(console.backend, session.token, request.query_params.get("path", "")[:1000])
        if read is None:
            return console.refusal(404, "not_live", "that page has no live updates", session)
        if streams.open >= streams.limit:
            return console.refusal(503, "live_busy", "too many live pages are open: reload to see changes")
        return StreamingResponse(
            _events(console, request, read, streams, stopping),
            media_type="text/event-stream",
            headers={"x-accel-buffering": "no"},  # a proxy in front must not hold the events back
        )

    return [Route("/live", live)]


async def _events(
    console: Console, request: Request, read: Reader, streams: Streams, stopping: Callable[[], bool]
) -> AsyncIterator[str]:
    streams.open += 1
    try:
        yield f"retry: {RETRY_MS}\n\n"
        last = await _read(read)
        started = quiet_since = time.monotonic()
        while not stopping() and time.monotonic() - started < MAX_STREAM_S:
            await asyncio.sleep(POLL_S)
            if not await _still_signed_in(console, request):
                yield "event: signedout\ndata: \n\n"
                return
            now = await _read(read)
            if now is not None and last is not None and now != last:
                yield "event: changed\ndata: \n\n"
                quiet_since = time.monotonic()
            elif time.monotonic() - quiet_since >= KEEPALIVE_S:
                yield ": keepalive\n\n"
                quiet_since = time.monotonic()
            last = now if now is not None else last
    finally:
        streams.open -= 1


async def _read(read: Reader) -> str | None:
    """The page's fingerprint now, or None while the services cannot say (the next tick retries)."""
    try:
        return fingerprint(await read())
    except VersusError:
        return None


async def _still_signed_in(console: Console, request: Request) -> Session | None:
    # Not a page view: the stream must not keep an idle session alive by itself.
    return await console.sessions.load(request.cookies.get(COOKIE), refresh=False)
