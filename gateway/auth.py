"""Authenticating collectors on the gateway: ``Authorization: Bearer <ES256 JWT>``.

Identity comes only from a verified token, never from a request body. A token
is refused when it does not verify against the key on record, when the
collector's certificate has expired (it must re-enroll), or when the
collector's status does not allow the endpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import time
from typing import Any

from starlette.requests import HTTPConnection
from starlette.responses import JSONResponse
from starlette.websockets import WebSocket

from common import collector_jwt, error_mapping
from common.collector_jwt import BearerClaims, BearerError
from common.errors import PermissionDenied, VersusError
from common.logs import get_logger
from gateway.metrics import AUTH_FAILURES
from gateway.store import CollectorAuthRecord, GatewayStore

log = get_logger("versus.gateway.auth")

ACTIVE_ONLY = frozenset({"active"})
# The enrollment status endpoint answers pending and denied collectors too, so they can learn their fate.
ANY_ENROLLED = frozenset({"pending", "active", "denied"})


async def authenticate(
    request: HTTPConnection, store: GatewayStore, allowed: frozenset[str] = ACTIVE_ONLY
) -> tuple[BearerClaims, CollectorAuthRecord]:
    """The verified claims and collector record; every refusal is counted by code."""
    try:
        return await _authenticate(request, store, allowed)
    except (BearerError, PermissionDenied) as exc:
        AUTH_FAILURES.labels(exc.code).inc()
        raise


async def _authenticate(
    request: HTTPConnection, store: GatewayStore, allowed: frozenset[str]
) -> tuple[BearerClaims, CollectorAuthRecord]:
    headers = request.headers.getlist("authorization")
    if len(headers) > 1:
        raise BearerError("exactly one Authorization header is allowed", code="bearer_duplicated")
    scheme, _, token = (headers[0] if headers else "").partition(" ")
    if scheme.lower() != "bearer" or not token:
        raise BearerError("an Authorization: Bearer token is required", code="bearer_missing")
    collector_id = collector_jwt.unverified_subject(token.strip())
    record = await store.collector_auth(collector_id)
    if record is None:
        # Same answer as a bad signature: do not confirm which collector ids exist.
        raise BearerError("bearer token signature does not verify", code="bearer_bad_signature")
    claims = collector_jwt.verify(token.strip(), record.public_key, int(time.time()))
    if record.cert_not_after <= dt.datetime.now(dt.UTC):
        raise BearerError("the collector certificate has expired; enroll again", code="certificate_expired")
    if record.status == "revoked":
        raise BearerError("the collector identity is revoked", code="collector_revoked")
    if record.status not in allowed:
        raise PermissionDenied(f"collector is {record.status}", code=f"collector_{record.status}")
    return claims, record


async def admit_socket(ws: WebSocket, store: GatewayStore) -> BearerClaims | None:
    """The verified claims of a collector opening a WebSocket, or None after refusing it.

    Collectors never send ``Origin``; browsers always do, so refusing it keeps
    web pages off these sockets. A refusal before ``accept`` reaches the client
    as HTTP 403 at the handshake.
    """
    if ws.headers.get("origin") is not None:
        await ws.close(code=4403, reason="origin_not_allowed")
        return None
    try:
        claims, _ = await authenticate(ws, store)
    except VersusError as exc:
        await ws.close(code=error_mapping.status_for(exc).ws_close_code, reason=exc.code)
        return None
    except Exception as exc:
        # A dependency failed (say, no database connection free during a reconnect storm): answer
        # the handshake 503 with the stable code, so the collector backs off and retries, instead
        # of an unhandled error per socket (whose tracebacks alone cost the gateway its CPU).
        status = error_mapping.status_for(exc)
        public = error_mapping.public_error(exc)
        if status.http_status == 500:
            log.exception("socket admission failed")
        else:
            log.warning("socket refused: dependency unavailable", error=type(exc).__name__)
        try:
            await ws.send_denial_response(JSONResponse(public.to_dict(), status_code=status.http_status))
        except RuntimeError:  # the server cannot send a denial response: close (the client sees 403)
            await ws.close(code=status.ws_close_code, reason=public.code)
        return None
    return claims


async def standing_lapsed(state: Any, collector_id: str) -> str:
    """Wait until the collector of an open socket loses its standing; returns the close reason.

    Woken at once by a revocation broadcast (gateway/revocations.py), and checks
    PostgreSQL every ``revocation_check_s`` regardless.
    """
    with state.revocations.watch(collector_id) as announced:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(announced.wait(), getattr(state, "revocation_check_s", 60.0))
            announced.clear()
            try:
                reason = await lapsed_standing(state.store, collector_id)
            except Exception:  # a dependency failed: keep the socket, check again next period
                log.warning("standing check failed; retrying next period", exc_info=True)
                continue
            if reason is not None:
                return reason


async def lapsed_standing(store: GatewayStore, collector_id: str) -> str | None:
    """Why an open socket's collector may no longer use it (the close reason), or None while it is active."""
    record = await store.collector_auth(collector_id)
    if record is None or record.cert_not_after <= dt.datetime.now(dt.UTC):
        return "collector_not_active"
    if record.status != "active":
        return "collector_revoked" if record.status == "revoked" else "collector_not_active"
    return None
