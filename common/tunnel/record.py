"""A tunnel session's shared record and its attach ticket (what the router and the gateway agree on).

The router writes the record when it offers the session: the collector it chose, whether the
platform attaches directly, and the SHA-256 of the attach ticket (the ticket itself only ever
travels to the platform, in ``TunnelReady``). The gateway that takes the collector's dial-back
adds its attach URL and id, or the reason the session failed before it started.

A ticket is ``<session id>.<secret>``: 256 random bits, good for one attachment within
:data:`TICKET_TTL_S` of the gateway taking the session.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from dataclasses import asdict, dataclass

TICKET_TTL_S = 30.0
_TICKET_BYTES = 32


@dataclass(frozen=True, slots=True)
class Record:
    collector_id: str
    ticket_sha256: str
    direct: bool = False
    gateway: str = ""  # the holding gateway's attach URL (common/tunnel/attach.py)
    gateway_id: str = ""
    failed: str = ""  # the stable reason the session ended before it was ready
    traceparent: str = ""  # the router's OpenTunnel span, which the holding gateway's span continues

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str | bytes) -> Record | None:
        """The record, or None for one this version cannot read (an older router's)."""
        try:
            data = json.loads(raw)
            return cls(
                collector_id=str(data["collector_id"]),
                ticket_sha256=str(data["ticket_sha256"]),
                direct=bool(data.get("direct", False)),
                gateway=str(data.get("gateway", "")),
                gateway_id=str(data.get("gateway_id", "")),
                failed=str(data.get("failed", "")),
                traceparent=str(data.get("traceparent", "")),
            )
        except (ValueError, KeyError, TypeError):
            return None


def new_ticket(session_id: str) -> tuple[str, str]:
    """A fresh ticket for ``session_id`` and the SHA-256 (hex) the record keeps of its secret."""
    secret = secrets.token_urlsafe(_TICKET_BYTES)
    return f"{session_id}.{secret}", _digest(secret)


def ticket_session(ticket: str) -> str:
    """The session a ticket names ("" for something that is no ticket)."""
    session_id, dot, secret = ticket.partition(".")
    return session_id if dot and session_id and secret else ""


def ticket_matches(ticket: str, digest: str) -> bool:
    """Whether ``ticket``'s secret hashes to ``digest`` (compared in constant time)."""
    secret = ticket.partition(".")[2]
    return bool(secret) and hmac.compare_digest(_digest(secret), digest)


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()
