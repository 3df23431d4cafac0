"""Console sessions, held server-side in Redis; the browser holds only an opaque cookie.

The cookie is ``<session id>.<session key>`` (two random 256-bit values). Redis keeps, under the
SHA-256 of the id, the operator's API token and the session's CSRF token encrypted with
AES-256-GCM under the session key — so neither a copy of Redis nor the cookie alone yields the
API token. A session ends at sign-out, after :data:`IDLE_S` without a request, or
:data:`ABSOLUTE_S` after sign-in, whichever comes first.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from common.trust import b64url

# __Host-: the browser keeps it only if Secure, Path=/ and host-only (no Domain): no subdomain
# or plain-HTTP page can set or shadow it.
COOKIE = "__Host-versus-console"
IDLE_S = 30 * 60
ABSOLUTE_S = 12 * 60 * 60
_PREFIX = "versus:console:session:"


@dataclass(frozen=True)
class Session:
    """A signed-in operator: who the API token says they are, and what to call services with."""

    name: str
    role: str
    tenants: tuple[str, ...]
    created_at: float
    token: str = field(repr=False)
    csrf: str = field(repr=False)

    def csrf_matches(self, given: str) -> bool:
        return hmac.compare_digest(self.csrf.encode(), given.encode())


def _key(session_id: str) -> str:
    return _PREFIX + hashlib.sha256(session_id.encode()).hexdigest()


class SessionStore:
    """Create, load (refreshing the idle timeout) and end sessions in Redis."""

    def __init__(self, redis: Any, clock: Callable[[], float] = time.time):
        self.redis = redis
        self.clock = clock

    async def create(self, token: str, name: str, role: str, tenants: tuple[str, ...]) -> tuple[str, Session]:
        """A new session; returns the cookie value and the session."""
        session_id, key = secrets.token_bytes(32), secrets.token_bytes(32)
        sid = b64url.encode(session_id)
        session = Session(name, role, tenants, self.clock(), token, b64url.encode(secrets.token_bytes(32)))
        nonce = os.urandom(12)
        secret = json.dumps({"token": token, "csrf": session.csrf}).encode()
        record = {
            "name": name, "role": role, "tenants": list(tenants), "created_at": session.created_at,
            "nonce": b64url.encode(nonce),
            "ct": b64url.encode(AESGCM(key).encrypt(nonce, secret, sid.encode())),
        }  # fmt: skip
        await self.redis.set(_key(sid), json.dumps(record), ex=IDLE_S)
        return f"{sid}.{b64url.encode(key)}", session

    async def load(self, cookie: str | None, *, refresh: bool = True) -> Session | None:
        """The session a cookie names, or None (unknown, expired, or not opening with its key);
        ``refresh`` (a page view, not a live page's poll) starts the idle timeout again."""
        sid, key = _split(cookie)
        if not sid:
            return None
        raw = await self.redis.get(_key(sid))
        if raw is None:
            return None
        try:
            record = json.loads(raw)
            if self.clock() - float(record["created_at"]) > ABSOLUTE_S:
                await self.redis.delete(_key(sid))
                return None
            secret = json.loads(
                AESGCM(key).decrypt(b64url.decode(record["nonce"]), b64url.decode(record["ct"]), sid.encode())
            )
        except (InvalidTag, ValueError, KeyError, TypeError):
            return None
        if refresh:
            await self.redis.expire(_key(sid), IDLE_S)  # the idle timeout starts again
        return Session(
            str(record["name"]), str(record["role"]), tuple(record["tenants"]), float(record["created_at"]),
            str(secret["token"]), str(secret["csrf"]),
        )  # fmt: skip

    async def end(self, cookie: str | None) -> None:
        sid, _ = _split(cookie)
        if sid:
            await self.redis.delete(_key(sid))


def _split(cookie: str | None) -> tuple[str, bytes]:
    if not cookie or cookie.count(".") != 1:
        return "", b""
    sid, key_text = cookie.split(".")
    try:
        key = b64url.decode(key_text)
    except ValueError:
        return "", b""
    return (sid, key) if len(key) == 32 and len(sid) == 43 else ("", b"")
