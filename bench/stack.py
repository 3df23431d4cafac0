"""What the system benchmarks run against: real processes on real sockets, and simulated collectors.

`Stack` starts an embedded PostgreSQL and Redis itself (so peers such as pgqueuer
can use the very same PostgreSQL), then `versus-cp up` against them as external
servers: the router, enrollment and gateway run as the separate processes they
are in production, with TLS on.

`SimCollector` is a lightweight collector: it enrolls through the real HTTPS
endpoint with a real CSR, signs a fresh ES256 bearer token per request, claims
over HTTPS long-poll or the WSS control socket, verifies every envelope with
the real verifier and reports. It runs no drivers, so many fit in one process.

Pinning: on this 2-core machine the load generator (this process) is pinned to
the last CPU and the control plane's processes are left free to use both, so
the generator cannot starve the server but competes with it for one core; see
docs/benchmarks.md.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import secrets
import shutil
import ssl
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import websockets
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from collector.request_auth import SignRequests, bound_token, frame_body, frame_token, signed_report
from common import protocol
from common.embedded.postgres import EmbeddedPostgres
from common.embedded.redis import EmbeddedRedis
from common.envelope.verify import VerifyContext, verify
from common.trust.keys import PublicKey
from tests.e2e.harness import ControlPlane, run_cli, service_env

API = "/api/collector/v1"
# Collectors hold each claim for the server's full hold (25 s by default), as real ones do; an idle
# reference collector on the control socket asks for the socket's hold (120 s by default). The
# router holds a claim it is sent for at most 30 s (router/dispatch/core.py MAX_CLAIM_WAIT_S).
HOLD_S = 25.0
SOCKET_HOLD_S = 120.0
ROUTER_HOLD_S = 30.0
RETRY_S = 0.2


def _all_cpus() -> set[int]:
    return set(range(os.cpu_count() or 1))


def pin_load_generator() -> str:
    """Pin this process to the last CPU; returns a description for the report.

    Processes started from here inherit the pin: start servers inside :func:`unpinned`
    (running_stack does), or they would share the load generator's CPU.
    """
    cpus = sorted(_all_cpus())
    if len(cpus) < 2:
        return f"not pinned ({len(cpus)} CPU)"
    os.sched_setaffinity(0, {cpus[-1]})
    return f"load generator pinned to CPU {cpus[-1]} of {len(cpus)}; servers unpinned (all CPUs)"


@contextmanager
def unpinned() -> Iterator[None]:
    """Start child processes on every CPU, whatever this process is pinned to."""
    pinned = os.sched_getaffinity(0)
    os.sched_setaffinity(0, _all_cpus())
    try:
        yield
    finally:
        os.sched_setaffinity(0, pinned)


def save_report(json_path: str, pinning: str, args: Any, results: Any) -> None:
    """Write a benchmark's results with the machine facts and the arguments that produced them."""
    report = {"machine": machine(), "pinning": pinning, "args": vars(args), "results": results}
    Path(json_path).parent.mkdir(parents=True, exist_ok=True)
    Path(json_path).write_text(json.dumps(report, indent=2))


def machine() -> dict[str, Any]:
    import platform

    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "kernel": platform.release(),
    }


@dataclass
class Stack:
    """`versus-cp up` on its own embedded PostgreSQL and Redis, in a temporary directory."""

    root: Path
    postgres: EmbeddedPostgres
    redis: EmbeddedRedis
    cp: ControlPlane
    admin_token: str = ""

    @property
    def gateway_url(self) -> str:
        return self.cp.gateway_url

    @property
    def router_address(self) -> str:
        return f"127.0.0.1:{self.cp.port('router')}"

    @property
    def database_url(self) -> str:
        return self.postgres.url

    def ssl_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.cp.ca_file))

    def cli_json(self, *args: str) -> Any:
        done = run_cli([*args, "--json"], self.cp.env)
        if done.returncode != 0:
            raise RuntimeError(done.stderr)
        return json.loads(done.stdout)

    def token(self, role: str) -> str:
        return self.cp.mint_token(role)

    def enrollment_token(self, max_uses: int) -> tuple[str, str]:
        """A site and a token for ``max_uses`` collectors."""
        site = self.cli_json("sites", "create", f"bench-{time.monotonic_ns()}", "--tenant", "bench")["site"]
        issued = self.cli_json("tokens", "issue", "--site", site["site_id"], "--max-uses", str(max_uses))
        return site["site_id"], issued["plaintext"]


@contextmanager
def running_stack(**env: str) -> Iterator[Stack]:
    root = Path(tempfile.mkdtemp(prefix="versus-bench-"))
    # Thousands of simulated collectors all dial from 127.0.0.1, as behind a load balancer that
    # hides client addresses: the per-address anonymous limit would throttle their ramp-up.
    # VERSUS_BENCH_SERVICE_ENV="NAME=value ..." sets the services' settings for an A/B run (the
    # services get no VERSUS_ variable of the benchmark's own environment).
    extra = dict(item.split("=", 1) for item in os.environ.get("VERSUS_BENCH_SERVICE_ENV", "").split())
    env = {"VERSUS_GATEWAY_MAX_ANONYMOUS_PER_SOURCE": "0", **extra, **env}
    with unpinned():
        postgres = EmbeddedPostgres(root / "pg").start()
        redis = EmbeddedRedis(root / "redis").start()
    cp = ControlPlane(
        service_env(
            root / "state", DATABASE_URL=postgres.url, REDIS_URL=redis.url, VERSUS_LOG_LEVEL="WARNING", **env
        ),
        root / "up.log",
    )
    try:
        with unpinned():
            cp.start()
        yield Stack(root, postgres, redis, cp)
    finally:
        if cp.proc.poll() is None:
            cp.stop()
        redis.stop()
        postgres.stop()
        if os.environ.get("VERSUS_BENCH_KEEP"):
            print(f"kept: {root} (the services' log: up.log)", flush=True)
        else:
            shutil.rmtree(root, ignore_errors=True)


class _NoJournal:
    def lookup(self, idempotency_key: str) -> None:
        return None


def _csr(key: ec.EllipticCurvePrivateKey, cn: str) -> str:
    from cryptography import x509

    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
        .sign(key, hashes.SHA256())
    )
    return csr.public_bytes(serialization.Encoding.PEM).decode()


# What a simulated collector says it runs.
SIM_AGENT_VERSION = "0.0.0-bench"


@dataclass
class SimCollector:
    """One simulated collector speaking the real protocol (see the module docstring)."""

    collector_id: str
    gateway_url: str
    context: ssl.SSLContext
    key: ec.EllipticCurvePrivateKey = field(default_factory=lambda: ec.generate_private_key(ec.SECP256R1()))
    dispatch_keys: dict[str, PublicKey] = field(default_factory=dict)
    client: httpx.AsyncClient | None = None
    ws: Any = None
    seq: int = 0
    claim_no: int = 0
    slots: int = 8  # free slots it claims with: its published max_concurrency (nothing is held)
    # A new one per simulated process start, as the reference collector picks at start.
    session_id: str = field(default_factory=lambda: secrets.token_urlsafe(12))
    # 5xx answers seen (the gateway sheds load when the router cannot answer within its deadline).
    overloaded: int = 0
    # The 5xx answers by status and stable code ("503 backend_unavailable"), as counted in overloaded.
    overloaded_codes: collections.Counter[str] = field(default_factory=collections.Counter)
    _frames: dict[str, asyncio.Future[tuple[int, str]]] = field(default_factory=dict)
    _reader: asyncio.Task[None] | None = None

    def _http(self) -> httpx.AsyncClient:
        if self.client is None:
            self.client = httpx.AsyncClient(
                base_url=self.gateway_url,
                verify=self.context,
                timeout=120,
                auth=SignRequests(self.key, self.collector_id),
            )
        return self.client

    async def enroll(self, token: str) -> float:
        """Enroll through the real endpoint; returns the seconds it took."""
        started = time.perf_counter()
        reply = await self._http().post(
            API + "/enroll", json={"token": token, "csr_pem": _csr(self.key, self.collector_id)}
        )
        reply.raise_for_status()
        self.dispatch_keys = {k["kid"]: PublicKey.from_json(k) for k in reply.json()["dispatch_keys"]}
        return time.perf_counter() - started

    async def publish(self, max_concurrency: int = 8, epoch: int = 1) -> None:
        body = {
            "capability_epoch": epoch,
            "agent_version": "bench",
            "providers": [
                {
                    "provider": "stub",
                    "max_concurrency": max_concurrency,
                    "operations": [{"name": "echo", "op_class": "read", "timeout_s": 30}],
                }
            ],
        }
        reply = await self._http().post(API + "/capabilities", json=body)
        reply.raise_for_status()
        self.slots = max_concurrency

    def _claim_body(self, wait_s: float, max_tasks: int = 1) -> dict[str, Any]:
        # What the reference collector's claim says (collector/claim_loop.py), so the gateway and the
        # router do for a simulated collector what they do for a real one: numbered claims (a claim
        # abandoned by the client may still be handed a task, and the next claim tells the router it
        # never arrived), its session, vault mode, config version, free slots, agent version, a
        # resume on its first claim, and the protocol range it speaks. Tasks are reported before
        # the next claim, so none is held. (Key versions are left out: these identities were not
        # enrolled, so they hold none; the collector then says none either.)
        self.claim_no += 1
        body: dict[str, Any] = {
            "session_id": self.session_id,
            "vault_mode": "local",
            "config_version": 0,
            "claim_seq": self.claim_no,
            "held_task_ids": [],
            "capacity": {"stub": self.slots},
            "agent_version": SIM_AGENT_VERSION,
            "wait_s": wait_s,
            "resume": self.claim_no == 1,
            "protocol": {"min": protocol.MIN_PROTOCOL_VERSION, "max": protocol.PROTOCOL_VERSION},
        }
        if max_tasks > 1:
            body["max_tasks"] = max_tasks
        return body

    # --- HTTPS long-poll -------------------------------------------------------------------------
    async def claim_https(self, wait_s: float) -> bytes | None:
        body = self._claim_body(wait_s)
        reply = await self._http().post(API + "/claim", json=body)
        if reply.status_code == 204:
            return None
        if reply.status_code >= 500:  # overloaded: back off briefly and claim again, as a collector does
            self._overloaded(reply.status_code, reply.content)
            await asyncio.sleep(RETRY_S)
            return None
        reply.raise_for_status()
        raw = reply.content
        if b'"envelope":' not in raw:
            return None
        return raw[raw.index(b'"envelope":') + len(b'"envelope":') : -1]

    async def claim_batch_https(self, wait_s: float, max_tasks: int) -> list[bytes]:
        """A batched claim: every envelope in the answer (raw bytes), oldest first."""
        reply = await self._http().post(API + "/claim", json=self._claim_body(wait_s, max_tasks))
        if reply.status_code == 204:
            return []
        if reply.status_code >= 500:
            self._overloaded(reply.status_code, reply.content)
            await asyncio.sleep(RETRY_S)
            return []
        reply.raise_for_status()
        body = reply.json()
        if "envelope" not in body:
            return []
        # Re-encoding compactly gives back the exact bytes (the wire JSON is compact, keys in order).
        return [
            json.dumps(item["envelope"], separators=(",", ":")).encode()
            for item in [body, *body.get("more", [])]
        ]

    async def report_https(self, dispatch_id: str) -> bool:
        """Report success; True when the router has it recorded (now or by an earlier attempt)."""
        body = signed_report(self.key, self.collector_id, {"task_id": dispatch_id, "outcome": "success"})
        while True:  # a collector re-sends a report until it is acknowledged
            reply = await self._http().post(API + "/report", json=body)
            if reply.status_code < 500:
                # A refusal (e.g. the dispatch expired before this report) ends it, as on a real collector.
                # A duplicate ack (an earlier attempt landed though its answer was lost) counts as recorded.
                return reply.status_code == 200
            self._overloaded(reply.status_code, reply.content)
            await asyncio.sleep(RETRY_S)

    # --- WSS control socket ----------------------------------------------------------------------
    async def open_ws(self) -> None:
        url = self.gateway_url.replace("https://", "wss://") + API + "/control"
        # As the reference collector connects (no compression), except that the client never drops
        # the socket for a late pong: with thousands of sockets in one load generator, its own
        # scheduling delays would be counted against the gateway. The gateway's pings still apply.
        self.ws = await websockets.connect(
            url,
            ssl=self.context,
            additional_headers={
                "Authorization": "Bearer " + bound_token(self.key, self.collector_id, "GET", API + "/control")
            },
            max_size=4 * 1024 * 1024,
            compression=None,
            ping_timeout=None,
            open_timeout=30,
        )
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            async for text in self.ws:
                head = json.loads(text) if isinstance(text, str) else {}
                future = self._frames.pop(str(head.get("id")), None)
                if future is not None and not future.done():
                    future.set_result((int(head.get("status", 0)), text))
        except websockets.ConnectionClosed:
            pass
        finally:  # the socket is gone: nothing pending will be answered
            for future in self._frames.values():
                if not future.done():
                    future.set_exception(ConnectionError("control socket closed"))
            self._frames.clear()

    @property
    def ws_open(self) -> bool:
        return self.ws is not None and self._reader is not None and not self._reader.done()

    async def _frame(self, kind: str, body: dict[str, Any]) -> tuple[int, str]:
        self.seq += 1
        frame_id = str(self.seq)
        future: asyncio.Future[tuple[int, str]] = asyncio.get_running_loop().create_future()
        self._frames[frame_id] = future
        # Claims in the newest version (their answer settles it; protocol.md), reports in version 1.
        version = protocol.PROTOCOL_VERSION if kind == "claim" else 1
        member, bound = frame_body(version, body)
        auth = frame_token(self.key, self.collector_id, kind, bound)
        frame = {"v": version, "id": frame_id, "type": kind, "auth": auth, "body": member}
        await self.ws.send(json.dumps(frame))
        return await future

    async def claim_ws(self, wait_s: float) -> bytes | None:
        status, text = await self._frame("claim", self._claim_body(wait_s))
        if status >= 500:
            self._overloaded(status, text.encode())
            await asyncio.sleep(RETRY_S)
        if status != 200 or '"envelope":' not in text:
            return None
        return text[text.index('"envelope":') + len('"envelope":') : -2].encode()

    async def report_ws(self, dispatch_id: str) -> None:
        while True:
            status, text = await self._frame(
                "report",
                signed_report(self.key, self.collector_id, {"task_id": dispatch_id, "outcome": "success"}),
            )
            if status < 500:
                if status != 200:
                    raise RuntimeError(f"report refused: {status}")
                return
            self._overloaded(status, text.encode())
            await asyncio.sleep(RETRY_S)

    def _overloaded(self, status: int, raw: bytes) -> None:
        """Count a 5xx answer under its status and stable code (an HTTPS body or a control frame)."""
        self.overloaded += 1
        code = "?"
        with contextlib.suppress(ValueError, AttributeError, TypeError):
            data = json.loads(raw)
            error = data.get("error") or (data.get("body") or {}).get("error") or {}
            code = str(error.get("code") or "?")
        self.overloaded_codes[f"{status} {code}"] += 1

    def verify(self, raw: bytes) -> str:
        """Verify the envelope as a collector must; returns its dispatch id."""
        accepted = verify(
            raw, VerifyContext(self.collector_id, int(time.time()), self.dispatch_keys, set(), _NoJournal())
        )
        return accepted.envelope.fields.task_id

    async def drop_ws(self) -> None:
        """Close the control socket, as a collector does with a claim unanswered past its deadline."""
        ws, reader, self.ws, self._reader = self.ws, self._reader, None, None
        if reader is not None:
            reader.cancel()
        if ws is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(5):
                    await ws.close()

    async def close(self) -> None:
        if self.ws is not None:
            await self.ws.close()
        if self._reader is not None:
            self._reader.cancel()
        if self.client is not None:
            await self.client.aclose()


def issue_tokens(stack: Stack, count: int, sites: int = 1) -> list[tuple[str, str]]:
    """``sites`` new sites with one token each, enough for ``count`` collectors in all."""
    return [stack.enrollment_token(-(-count // sites)) for _ in range(sites)]


async def enroll_many(
    stack: Stack, count: int, concurrency: int = 16, issued: list[tuple[str, str]] | None = None
) -> tuple[str, list[SimCollector], list[float]]:
    """Enroll ``count`` simulated collectors, ``concurrency`` at a time: site, collectors, durations.

    ``issued`` (from :func:`issue_tokens`): the collectors are spread over those sites, each
    enrolling with its own site's token (the first site is returned); by default one new site."""
    issued = issued or issue_tokens(stack, count)
    sites = len(issued)
    context = stack.ssl_context()
    batch = f"{time.monotonic_ns() % 10**8:08d}"  # collector ids are unique across bursts
    collectors = [SimCollector(f"bench-{batch}-{i:05d}", stack.gateway_url, context) for i in range(count)]
    gate = asyncio.Semaphore(concurrency)
    durations: list[float] = []

    async def one(i: int, c: SimCollector) -> None:
        async with gate:
            durations.append(await c.enroll(issued[i % sites][1]))

    await asyncio.gather(*(one(i, c) for i, c in enumerate(collectors)))
    return issued[0][0], collectors, durations
