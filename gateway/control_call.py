"""One collector message and its answer, as both transports hand them to an operation
(gateway/collector_api.py over per-call HTTPS, gateway/control_ws.py over the WebSocket)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


def server_time() -> tuple[str, int]:
    """Now, as an answer states it: ISO 8601 with microseconds, and unix milliseconds."""
    now = dt.datetime.now(dt.UTC)
    return now.strftime("%Y-%m-%dT%H:%M:%S.%fZ"), int(now.timestamp() * 1000)


@dataclass(frozen=True, slots=True)
class ControlCall:
    """One collector message as either transport hands it to its operation."""

    state: Any  # the gateway app's state: backends, settings
    collector_id: str  # from the verified bearer token, never from the body
    raw: bytes  # the body, exactly the bytes the token is bound to
    request_id: str | None
    transport: str = "https"  # "https" or "wss"
    version: int = 1  # the protocol version the message is written in (docs/protocol.md)
    # On the control socket: when the connection last delivered anything (monotonic seconds).
    heard_at: Callable[[], float] | None = None


@dataclass(frozen=True, slots=True)
class ControlReply:
    """One answer on the control channel, the same over per-call HTTPS and over the WebSocket."""

    status: int
    payload: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
