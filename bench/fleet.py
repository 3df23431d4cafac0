"""A simulated idle fleet for the benchmarks (bench/idle.py, bench/storm.py): identities straight in
PostgreSQL, and one loop per collector that keeps a claim held as the reference collector does —
reconnecting after a jittered backoff when a handshake or a claim fails.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import ssl
import time
from collections import Counter

import httpx
import psutil
import websockets
from cryptography.hazmat.primitives import serialization
from sqlalchemy import insert

from bench.stack import HOLD_S, SOCKET_HOLD_S, SimCollector, Stack
from collector.agent_state import backoff
from common.db import engine as db_engine
from common.db.schema import collectors as collectors_table
from common.db.schema import sites
from gateway.tls_buffer import share_tls_read_buffer


async def make_fleet(
    database_url: str, gateway_url: str, context: ssl.SSLContext, count: int, tag: str
) -> list[SimCollector]:
    """``count`` collectors of a new site ``site-idle-<tag>``, active, straight in PostgreSQL (each
    with a fresh P-256 key; no certificate: bearer tokens are checked against the key)."""
    fleet = [SimCollector(f"idle-{tag}-{i:05d}", gateway_url, context) for i in range(count)]
    engine = db_engine.create_async(database_url, pool_size=1)
    site_id = f"site-idle-{tag}"
    async with engine.begin() as conn:
        await conn.execute(insert(sites).values(site_id=site_id, name=site_id, tenant_id="bench"))
        rows = []
        for c in fleet:
            der = c.key.public_key().public_bytes(
                serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
            )
            rows.append(
                {
                    "collector_id": c.collector_id,
                    "site_id": site_id,
                    "tenant_id": "bench",
                    "status": "active",
                    "public_key_der": der,
                    "public_key_sha256": hashlib.sha256(der).digest(),
                    "cert_pem": "",
                    "cert_serial": "0",
                    "cert_not_after": dt.datetime.now(dt.UTC) + dt.timedelta(days=1),
                }
            )
        await conn.execute(insert(collectors_table), rows)
    await engine.dispose()
    return fleet


class IdleFleet:
    """One loop per collector holding a claim at all times, over WSS or HTTPS long-poll.

    ``online`` holds the collectors with a claim sent on a live connection; ``back_at`` records,
    for each collector, when it last came online (a storm measures from the kill).
    """

    def __init__(
        self,
        fleet: list[SimCollector],
        wss: bool,
        claim_deadline_s: float | None = None,
        hold_s: float | None = None,
    ) -> None:
        """``claim_deadline_s``: a claim unanswered this long is given up, its socket closed, and the
        collector comes back after a backoff (docs/protocol.md, "The client contract"); None: a
        claim is waited for however long it takes."""
        # One process holds every collector's TLS connection: asyncio's default read buffer of
        # 256 KiB per connection put the load generator at 6.3 GiB and a full core during a
        # 10,000 storm (old and new connections side by side); they share one, as in the gateway.
        share_tls_read_buffer()
        self.fleet = fleet
        self.wss = wss
        self.stop = asyncio.Event()
        self.online: set[str] = set()
        self.back_at: dict[str, float] = {}
        self.claim_deadline_s = claim_deadline_s
        # What each claim asks for: an idle reference collector's hold on its transport.
        self.hold_s = hold_s if hold_s is not None else SOCKET_HOLD_S if wss else HOLD_S
        self.counts = {"connect_retries": 0, "drops": 0, "claim_errors": 0, "claim_timeouts": 0}
        # Seconds past the hold at which each claim answered with nothing (a 204) was answered.
        self.late_s: list[float] = []
        self.errors: Counter[str] = Counter()
        self.all_online = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    def _mark(self, c: SimCollector, up: bool) -> None:
        if up:
            if c.collector_id not in self.online:
                self.back_at[c.collector_id] = time.monotonic()
            self.online.add(c.collector_id)
            if len(self.online) == len(self.fleet):
                self.all_online.set()
        elif c.collector_id in self.online:
            self.online.discard(c.collector_id)
            self.all_online.clear()
            self.counts["drops"] += 1

    async def _loop(self, c: SimCollector) -> None:
        attempt = 0
        while not self.stop.is_set():
            if self.wss and not c.ws_open:
                # As the reference collector: a refused or failed handshake (the gateway sheds
                # handshakes during a storm) is retried after a jittered exponential backoff.
                try:
                    await c.open_ws()
                except (OSError, websockets.WebSocketException, TimeoutError) as exc:
                    self.counts["connect_retries"] += 1
                    self.errors[type(exc).__name__] += 1
                    await asyncio.sleep(backoff(attempt, base=0.5))
                    attempt += 1
                    continue
                attempt = 0
            claim = c.claim_ws(self.hold_s) if self.wss else c.claim_https(self.hold_s)
            self._mark(c, True)
            sent = time.monotonic()
            try:
                got = await asyncio.wait_for(claim, self.claim_deadline_s)
            except TimeoutError:
                self._mark(c, False)
                self.counts["claim_timeouts"] += 1
                if self.wss:
                    await c.drop_ws()
                await asyncio.sleep(backoff(attempt, base=0.5))
                attempt += 1
                continue
            except (ConnectionError, websockets.WebSocketException):
                self._mark(c, False)
            except (OSError, httpx.HTTPError) as exc:
                # A connect or read that failed under the storm (a timed-out handshake, say): as a
                # collector does, back off and claim again.
                self._mark(c, False)
                self.counts["claim_errors"] += 1
                self.errors[type(exc).__name__] += 1
                await asyncio.sleep(backoff(attempt, base=0.5))
                attempt += 1
            else:
                attempt = 0
                if got is None:
                    self.late_s.append(time.monotonic() - sent - self.hold_s)

    async def ramp(self, batch: int = 250, pause_s: float = 0.5) -> None:
        """Start every collector's loop, ``batch`` at a time, and wait until all are online."""
        await self.start(batch, pause_s)
        await self.all_online.wait()

    async def start(self, batch: int, pause_s: float) -> None:
        """Start every collector's loop, ``batch`` every ``pause_s``."""
        for start in range(0, len(self.fleet), batch):
            self._tasks += [asyncio.create_task(self._loop(c)) for c in self.fleet[start : start + batch]]
            await asyncio.sleep(pause_s)

    async def back_since(self, since: float, within_s: float) -> list[float]:
        """Wait until every collector came online again after ``since`` (a monotonic time), or
        ``within_s`` passed; the seconds after ``since`` each one that did came back, sorted."""
        deadline = since + within_s
        while time.monotonic() < deadline:
            back = sum(1 for cid, at in self.back_at.items() if at > since and cid in self.online)
            if back == len(self.fleet):
                break
            await asyncio.sleep(0.25)
        return sorted(at - since for at in self.back_at.values() if at > since)

    async def close(self) -> None:
        self.stop.set()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.gather(*(c.close() for c in self.fleet), return_exceptions=True)


def inbound(gateway: psutil.Process, port: int) -> int:
    """Established connections to the gateway's listening port: the collectors it holds."""
    return sum(
        1
        for c in gateway.net_connections(kind="tcp")
        if c.laddr and c.laddr.port == port and c.status == psutil.CONN_ESTABLISHED
    )


def cpu_s(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return float(times.user + times.system)


def service_process(stack: Stack, name: str) -> psutil.Process:
    for child in psutil.Process(stack.cp.proc.pid).children(recursive=True):
        if " ".join(child.cmdline()).endswith(f"versus_cp {name}"):
            return child
    raise RuntimeError(f"no {name} process")
