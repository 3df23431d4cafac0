"""`versus-cp up`: the whole control plane as one process tree on one machine.

Order of events:

1. validate the state directory and lock it; check every listen port is free;
2. start embedded PostgreSQL / Redis for whichever URL is unset (otherwise
   check the external server answers); apply migrations; create the internal
   service token and, on the very first start, the bootstrap admin token
   (shown once in the banner, saved 0600 as ``admin-token`` in the state dir);
3. start the router, enrollment and gateway services as child processes with
   the resolved URLs in their environment - the same code path as running each
   service alone;
4. wait until each reports ready, print the banner;
5. on SIGTERM/SIGINT (or if a service dies) stop the services, then Redis,
   then PostgreSQL, and exit.

Children get a parent-death signal, so even a SIGKILLed supervisor leaves
no orphans behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import ssl
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import httpx
from grpc_health.v1 import health_pb2, health_pb2_grpc

from common.config.settings import Settings
from common.config.state_dir import StateLock, ensure_writable
from common.db import engine as db_engine
from common.embedded.postgres import EmbeddedPostgres
from common.embedded.process import death_signal_spawn
from common.embedded.redis import EmbeddedRedis
from common.errors import StartupError, Unavailable
from common.material import shared as material
from common.material.files import Marker
from common.redis.client import check_reachable as redis_reachable
from common.runtime.service import PARENT_PID_ENV, setup_logging, shutdown_signals
from common.telemetry.logs import get_logger
from common.trust.keys import KeyPurpose
from common.trust.keystore import KeyStore
from common.trust.tls import GatewayTls, resolve_tls
from versus_cp import access_bootstrap, endpoints
from versus_cp.banner import render_banner
from versus_cp.migrate import apply as apply_migrations

log = get_logger("versus.up")

READY_TIMEOUT_S = 60.0
SERVICES = ("router", "enrollment", "gateway", "console")


@dataclass
class Child:
    name: str
    proc: asyncio.subprocess.Process
    exited: asyncio.Task[int] = field(init=False)

    def __post_init__(self) -> None:
        self.exited = asyncio.create_task(self.proc.wait())


def listen_ports(settings: Settings) -> list[tuple[str, str, int]]:
    return [
        ("gateway", settings.gateway_host, settings.gateway_port),
        *([("console", settings.console_host, settings.console_port)] if settings.gateway_tls else []),
        ("router gRPC", settings.router_host, settings.router_port),
        ("router metrics", settings.router_host, settings.router_metrics_port),
        ("enrollment gRPC", settings.enrollment_host, settings.enrollment_port),
        ("enrollment metrics", settings.enrollment_host, settings.enrollment_metrics_port),
    ]


def check_ports_free(settings: Settings) -> None:
    """Refuse to start when any listen port is taken or listed twice."""
    seen: dict[tuple[str, int], str] = {}
    for label, host, port in listen_ports(settings):
        if (host, port) in seen:
            raise StartupError(f"{label} and {seen[(host, port)]} are both configured on {host}:{port}")
        seen[(host, port)] = label
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((host, port))
            except OSError as exc:
                raise StartupError(
                    f"cannot listen on {host}:{port} ({label}): {exc.strerror or exc}"
                ) from None


class Supervisor:
    """Runs and stops the whole control plane; see the module docstring."""

    def __init__(self, settings: Settings):
        self.settings = settings
        # The console serves HTTPS only (its session cookie is Secure): behind a TLS-terminating
        # edge (VERSUS_GATEWAY_TLS=false) it is not started.
        self.services = [s for s in SERVICES if s != "console" or settings.gateway_tls]
        self.children: dict[str, Child] = {}
        self.postgres: EmbeddedPostgres | None = None
        self.redis: EmbeddedRedis | None = None

    async def run(self) -> int:
        setup_logging(self.settings, "up")
        state = ensure_writable(self.settings.state_dir)
        lock = StateLock(state)
        lock.acquire()
        try:
            return await self._run(state)
        finally:
            await self._stop_children()
            self._stop_embedded()
            lock.release()

    def _prepare_material(self, database_url: str) -> Marker:
        engine = db_engine.create_sync(database_url, pool_size=1)
        try:
            return material.prepare(material.Source.from_settings(self.settings), engine, material.Role.CORE)
        finally:
            engine.dispose()

    async def _run(self, state: Path) -> int:
        check_ports_free(self.settings)
        database_url, redis_url = self._backends(state)
        apply_migrations(database_url)
        # asyncio.run cannot nest: the token bootstrap runs in a worker thread with its own loop.
        access = await asyncio.to_thread(access_bootstrap.ensure, database_url, self.settings)
        # The deployment's key and CA material, before a child loads any (common/material/shared.py).
        marker = await asyncio.to_thread(self._prepare_material, database_url)
        for purpose in KeyPurpose:
            keyset = KeyStore(state, purpose).load()
            log.info("signing keys ready", key_set=purpose.value, current_kid=keyset.current_kid)
        log.info("key material ready", material=marker.material_id, mode=marker.mode)
        tls = resolve_tls(self.settings)
        stop = shutdown_signals()
        env = self._child_env(database_url, redis_url)
        for name in self.services:
            await self._spawn(name, env)
        await self._wait_ready(tls, stop)
        if stop.done():
            return 0
        print(
            render_banner(self.settings, state, tls, self.postgres, self.redis, access),
            file=sys.stderr,
            flush=True,
        )
        # The embedded servers' URLs, for another gateway or router beside this `up`.
        embedded_db = database_url if self.postgres is not None else None
        endpoints.write(self.settings, state, embedded_db, redis_url if self.redis is not None else None)
        try:
            return await self._wait_for_exit(stop)
        finally:
            endpoints.remove(state)

    # --- backends --------------------------------------------------------------------------------
    def _backends(self, state: Path) -> tuple[str, str]:
        database_url, redis_url = self.settings.database_url, self.settings.redis_url
        try:
            if database_url:
                db_engine.check_reachable(database_url)
            if redis_url:
                redis_reachable(redis_url)
        except Unavailable as exc:
            raise StartupError(exc.message) from None
        if not database_url:
            self.postgres = EmbeddedPostgres(state / "postgres").start()
            database_url = self.postgres.url
            log.info("embedded postgres started", pid=self.postgres.pid)
        if not redis_url:
            self.redis = EmbeddedRedis(state / "redis").start()
            redis_url = self.redis.url
            log.info("embedded redis started", pid=self.redis.pid)
        return database_url, redis_url

    def _stop_embedded(self) -> None:
        if self.redis is not None:
            self.redis.stop()
            log.info("embedded redis stopped")
            self.redis = None
        if self.postgres is not None:
            self.postgres.stop()
            log.info("embedded postgres stopped")
            self.postgres = None

    # --- children --------------------------------------------------------------------------------
    def _child_env(self, database_url: str, redis_url: str) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            {
                "DATABASE_URL": database_url,
                "REDIS_URL": redis_url,
                "VERSUS_STATE_DIR": str(self.settings.state_dir),
                PARENT_PID_ENV: str(os.getpid()),
            }
        )
        return env

    async def _spawn(self, name: str, env: dict[str, str]) -> None:
        prefix, spawn = death_signal_spawn(signal.SIGTERM)
        proc = await asyncio.create_subprocess_exec(
            *prefix,
            sys.executable,
            "-m",
            "versus_cp",
            name,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            # Own session: a terminal Ctrl-C reaches only the supervisor, which
            # then stops the services in order.
            start_new_session=True,
            **spawn,
        )
        self.children[name] = Child(name, proc)
        log.info("service started", service=name, pid=proc.pid)

    async def _wait_ready(self, tls: GatewayTls | None, stop: asyncio.Future[str]) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        # One HTTPS client and one channel per service for the whole wait, polled every 0.1 s: a
        # client (its TLS context) built per probe cost the supervisor a third of a CPU-second.
        verify: ssl.SSLContext | bool = False
        if tls is not None:
            verify = (
                ssl.create_default_context(cafile=str(tls.ca_file)) if tls.ca_file else _loopback_context()
            )
        async with contextlib.AsyncExitStack() as stack:
            http = await stack.enter_async_context(httpx.AsyncClient(verify=verify, timeout=1.0))
            channels = {
                name: await stack.enter_async_context(grpc.aio.insecure_channel(address, options=_PROBING))
                for name, address in (
                    ("router", self.settings.router_address),
                    ("enrollment", self.settings.enrollment_address),
                )
            }
            probes = {
                "router": lambda: _grpc_serving(channels["router"]),
                "enrollment": lambda: _grpc_serving(channels["enrollment"]),
                "gateway": lambda: _http_ready(http, f"{self.settings.gateway_url}/readyz"),
                "console": lambda: _http_ready(http, f"{self.settings.console_url}/healthz"),
            }
            pending = set(probes) & set(self.services)
            while pending and not stop.done():
                for name in sorted(pending):
                    child = self.children[name]
                    if child.exited.done():
                        status = child.exited.result()
                        raise StartupError(
                            f"{name} exited during startup with status {status} (its error is above)"
                        )
                    if await probes[name]():
                        pending.discard(name)
                if time.monotonic() > deadline:
                    raise StartupError(
                        f"not ready after {READY_TIMEOUT_S:.0f}s: {', '.join(sorted(pending))}"
                    )
                if pending:
                    await asyncio.sleep(0.1)

    async def _wait_for_exit(self, stop: asyncio.Future[str]) -> int:
        exits: dict[asyncio.Future[Any], str] = {c.exited: name for name, c in self.children.items()}
        waiting: list[asyncio.Future[Any]] = [stop, *exits]
        done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        if stop in done:
            log.info("shutting down", reason=stop.result())
            return 0
        failed = next(exits[task] for task in done if task in exits)
        log.error(
            "service exited unexpectedly; stopping the control plane",
            service=failed,
            status=self.children[failed].exited.result(),
        )
        return 1

    async def _stop_children(self) -> None:
        """SIGTERM every service, wait out the grace period, SIGKILL what is left."""
        running = [c for c in self.children.values() if c.proc.returncode is None]
        for child in running:
            with contextlib.suppress(ProcessLookupError):
                child.proc.send_signal(signal.SIGTERM)
        if running:
            _, late = await asyncio.wait(
                [c.exited for c in running], timeout=self.settings.shutdown_grace_s + 5
            )
            for child in running:
                if child.exited in late:
                    log.warning("service did not stop in time; killing it", service=child.name)
                    with contextlib.suppress(ProcessLookupError):
                        child.proc.kill()
                    await child.exited
        self.children.clear()


# A service not listening yet must not send the probe's channel into gRPC's reconnect backoff
# (1 s, growing): it is asked again every 0.1 s.
_PROBING = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 100),
]


async def _grpc_serving(channel: grpc.aio.Channel) -> bool:
    try:
        stub = health_pb2_grpc.HealthStub(channel)
        reply = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1.0)
        return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)
    except grpc.aio.AioRpcError:
        return False


async def _http_ready(client: httpx.AsyncClient, url: str) -> bool:
    try:
        response = await client.get(url)
        return response.status_code == 200
    except httpx.HTTPError:
        return False


def _loopback_context() -> ssl.SSLContext:
    # Operator-supplied certificates may not name the loopback address we probe;
    # this probe only asks our own child whether it is ready.
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx
