"""Where audit events go: a rotated file of JSON lines, syslog over TLS, an HMAC-signed webhook.

A sink's ``deliver`` returns once the batch is as safe as that sink can say: the file written and
fsynced; the syslog bytes acknowledged by the receiver's TCP stack (its send queue empty: RFC 5425
has no application acknowledgement, so a receiver that dies between its kernel acknowledging and
writing can lose what it had not written — docs/operations.md says so); the webhook answered 2xx.
Anything else raises :class:`SinkUnavailable` and the batch is offered again later.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import socket
import ssl
import struct
import termios
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import httpx

from router.audit_export import events

DELIVERY_TIMEOUT_S = 10.0


class SinkUnavailable(Exception):
    """The sink did not take the batch; it is offered again after a backoff."""


class Sink(Protocol):
    name: str

    async def deliver(self, batch: Sequence[Mapping[str, Any]]) -> None: ...
    async def close(self) -> None: ...


class FileSink:
    """JSON lines (one CloudEvent each) appended to ``path``; past ``max_bytes`` the file becomes
    ``path.1`` (``path.1`` becomes ``path.2``…, ``backups`` kept) and a new one starts."""

    name = "file"

    def __init__(self, path: Path, max_bytes: int, backups: int):
        self.path, self.max_bytes, self.backups = path, max_bytes, backups

    async def deliver(self, batch: Sequence[Mapping[str, Any]]) -> None:
        data = b"".join(events.json_line(e) for e in batch)
        try:
            await asyncio.to_thread(self._append, data)
        except OSError as exc:
            raise SinkUnavailable(f"{self.path}: {exc.strerror or exc}") from None

    def _append(self, data: bytes) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            if self.path.stat().st_size and self.path.stat().st_size + len(data) > self.max_bytes:
                self._rotate()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)

    def _rotate(self) -> None:
        for n in range(self.backups - 1, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{n}")
            if older.exists():
                older.replace(self.path.with_name(f"{self.path.name}.{n + 1}"))
        if self.backups:
            self.path.replace(self.path.with_name(f"{self.path.name}.1"))
        else:
            self.path.unlink()

    async def close(self) -> None:
        return None


class SyslogSink:
    """RFC 5424 messages, octet-counted, over one TLS connection (RFC 5425), reopened after any failure."""

    name = "syslog"

    def __init__(self, host: str, port: int, context: ssl.SSLContext, app_name: str = "versus"):
        self.host, self.port, self.context, self.app_name = host, port, context, app_name
        self.hostname = socket.gethostname()
        self._writer: asyncio.StreamWriter | None = None

    async def deliver(self, batch: Sequence[Mapping[str, Any]]) -> None:
        frames = b"".join(events.syslog_frame(e, self.hostname, self.app_name, os.getpid()) for e in batch)
        try:
            async with asyncio.timeout(DELIVERY_TIMEOUT_S):
                writer = await self._connection()
                writer.write(frames)
                await writer.drain()
                await _acknowledged(writer)
        except (OSError, ssl.SSLError, TimeoutError, ConnectionError) as exc:
            await self.close()
            raise SinkUnavailable(f"syslog {self.host}:{self.port}: {exc or type(exc).__name__}") from None

    async def _connection(self) -> asyncio.StreamWriter:
        if self._writer is None or self._writer.is_closing():
            _, self._writer = await asyncio.open_connection(
                self.host, self.port, ssl=self.context, server_hostname=self.host
            )
        return self._writer

    async def close(self) -> None:
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()
            with contextlib.suppress(Exception):
                async with asyncio.timeout(2.0):
                    await writer.wait_closed()


async def _acknowledged(writer: asyncio.StreamWriter) -> None:
    """Until the receiver's TCP stack has acknowledged every byte sent (the socket's send queue is
    empty); a connection the receiver closed meanwhile raises."""
    raw = writer.get_extra_info("socket")
    while True:
        if writer.is_closing():
            raise ConnectionError("the receiver closed the connection")
        unsent = struct.unpack("i", fcntl.ioctl(raw.fileno(), termios.TIOCOUTQ, b"\0\0\0\0"))[0]
        if unsent == 0:
            return
        await asyncio.sleep(0.01)


class WebhookSink:
    """Each batch POSTed as a CloudEvents JSON batch, signed with HMAC-SHA256 (``X-Versus-Signature``)."""

    name = "webhook"

    def __init__(self, url: str, secret: bytes, context: ssl.SSLContext | None):
        self.url, self.secret = url, secret
        self._client = httpx.AsyncClient(verify=context or True, timeout=DELIVERY_TIMEOUT_S)

    def __repr__(self) -> str:  # the secret never reaches a log line
        return f"WebhookSink({self.url!r})"

    async def deliver(self, batch: Sequence[Mapping[str, Any]]) -> None:
        body = events.batch_body(batch)
        headers = {
            "Content-Type": events.BATCH_CONTENT_TYPE,
            events.SIGNATURE_HEADER: events.signature(self.secret, int(time.time()), body),
        }
        try:
            reply = await self._client.post(self.url, content=body, headers=headers)
        except httpx.HTTPError as exc:
            raise SinkUnavailable(f"webhook: {exc or type(exc).__name__}") from None
        if not 200 <= reply.status_code < 300:
            raise SinkUnavailable(f"webhook answered {reply.status_code}")

    async def close(self) -> None:
        await self._client.aclose()
