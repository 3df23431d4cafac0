"""Authenticating collectors on the gateway: ``Authorization: Bearer <ES256 JWT>``.

Identity comes only from a verified token, never from a request body. A token
is refused when it does not verify against the key on record, when the
collector's certificate has expired (it must re-enroll), or when the
collector's status does not allow the endpoint.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import time
from collections.abc import Iterator

from starlette.requests import HTTPConnection
from starlette.responses import JSONResponse
from starlette.websockets import WebSocket, WebSocketDisconnect

from common import error_mapping
from common.errors import PermissionDenied, Unavailable, VersusError
from common.telemetry.logs import get_logger
from common.trust import collector_jwt
from common.trust.collector_jwt import BearerClaims, BearerError
from gateway import edge, replay
from gateway.metrics import AUTH_FAILURES, SOCKETS_SHED
from gateway.store import CollectorAuthRecord, GatewayStore

log = get_logger("versus.gateway.auth")

ACTIVE_ONLY = frozenset({"active"})
# The enrollment status endpoint answers pending and denied collectors too, so they can learn their fate.
ANY_ENROLLED = frozenset({"pending", "active", "denied"})

# WebSocket admissions in progress at once per gateway process, beyond which handshakes are shed
# (see AdmissionGate). Each holds one short database read: 512 queued on a 20-connection pool
# drain in well under a second when the database is healthy; when it is not, the excess is
# refused at once instead of timing out together 30 s later.
MAX_PENDING_ADMISSIONS = 512
# What a shed handshake's Retry-After says; collectors add their own jittered backoff.
SHED_RETRY_AFTER_S = 2


async def authenticate(
    request: HTTPConnection,
    store: GatewayStore,
    allowed: frozenset[str] = ACTIVE_ONLY,
    *,
    body_follows: bool = False,
) -> tuple[BearerClaims, CollectorAuthRecord]:
    """The verified claims and collector record; every refusal is counted by code.

    The token must be bound to this request's method and path and be used for the
    first time (:mod:`gateway.replay`). A request without a body is checked against
    the empty body here; with ``body_follows`` the caller reads the body (within its
    limit) and passes it to :func:`check_body`.
    """
    try:
        return await _authenticate(request, store, allowed, body_follows)
    except (BearerError, PermissionDenied) as exc:
        AUTH_FAILURES.labels(exc.code).inc()
        raise


def check_body(claims: BearerClaims, body: bytes) -> None:
    """Refuse a body other than the one the bearer token was signed over (counted like any refusal)."""
    try:
        claims.check_body(body)
    except BearerError as exc:
        AUTH_FAILURES.labels(exc.code).inc()
        raise


def request_target(request: HTTPConnection) -> tuple[str, str]:
    """(method, path with query) as the collector signed them; a WebSocket upgrade is a GET."""
    scope = request.scope
    method = "GET" if scope["type"] == "websocket" else str(scope["method"])
    query = scope.get("query_string", b"")
    return method, scope["path"] + ("?" + query.decode("latin-1") if query else "")


async def _authenticate(
    request: HTTPConnection, store: GatewayStore, allowed: frozenset[str], body_follows: bool
) -> tuple[BearerClaims, CollectorAuthRecord]:
    headers = request.headers.getlist("authorization")
    if len(headers) > 1:
        raise BearerError("exactly one Authorization header is allowed", code="bearer_duplicated")
    scheme, _, token = (headers[0] if headers else "").partition(" ")
    if scheme.lower() != "bearer" or not token:
        raise BearerError("an Authorization: Bearer token is required", code="bearer_missing")
    token = token.strip()
    collector_id = collector_jwt.unverified_subject(token)
    record = _known(await store.collector_auth(collector_id))
    now = int(time.time())
    try:
        claims = collector_jwt.verify(token, record.public_key, now)
    except BearerError as exc:
        # A kept record may hold the key the collector had before it renewed or rotated: ask
        # PostgreSQL before refusing.
        if exc.code != "bearer_bad_signature":
            raise
        fresh = _known(await store.collector_auth(collector_id, fresh=True))
        if _same_key(fresh, record):
            raise
        record = fresh
        claims = collector_jwt.verify(token, record.public_key, now)
    method, path = request_target(request)
    claims.check_request(method, path)
    if not body_follows:
        claims.check_body(b"")
    changes_state = not (request.scope["type"] == "http" and method == "GET")
    redis = request.app.state.connections.redis
    standing_changed = await replay.accept_once(redis, claims, now, changes_state=changes_state)
    if standing_changed or record.cert_not_after <= dt.datetime.now(dt.UTC):
        # Revoked in the last minute, or the kept certificate ended (perhaps renewed since): the
        # record in PostgreSQL decides.
        fresh = _known(await store.collector_auth(collector_id, fresh=True))
        if not _same_key(fresh, record):
            raise BearerError("bearer token signature does not verify", code="bearer_bad_signature")
        record = fresh
    if record.cert_not_after <= dt.datetime.now(dt.UTC):
        raise BearerError("the collector certificate has expired; enroll again", code="certificate_expired")
    if record.status == "revoked":
        raise BearerError("the collector identity is revoked", code="collector_revoked")
    if record.status not in allowed:
        raise PermissionDenied(f"collector is {record.status}", code=f"collector_{record.status}")
    edge.mark_authenticated(request.scope, collector_id)
    return claims, record


def _known(record: CollectorAuthRecord | None) -> CollectorAuthRecord:
    if record is None:
        # Same answer as a bad signature: do not confirm which collector ids exist.
        raise BearerError("bearer token signature does not verify", code="bearer_bad_signature")
    return record


def _same_key(a: CollectorAuthRecord, b: CollectorAuthRecord) -> bool:
    return a.public_key.public_numbers() == b.public_key.public_numbers()


class AdmissionGate:
    """Bounds the WebSocket admissions (token check, one database read) in progress at once.

    When a whole fleet reconnects at once (a gateway restart), admitting every
    handshake immediately queues thousands on the database pool; they time out
    together, keepalive pings go unanswered and open sockets drop, which brings
    more reconnects. Beyond ``limit`` admissions in progress a handshake is
    refused at once with 503 ``gateway_busy`` and ``Retry-After``; collectors
    back off with jitter, which spreads the storm.
    """

    def __init__(self, limit: int = MAX_PENDING_ADMISSIONS):
        self.limit = limit
        self.pending = 0

    @contextlib.contextmanager
    def enter(self) -> Iterator[bool]:
        """Yields whether this admission may proceed; it counts as in progress until the block ends."""
        if self.pending >= self.limit:
            yield False
            return
        self.pending += 1
        try:
            yield True
        finally:
            self.pending -= 1


async def admit_socket(ws: WebSocket, store: GatewayStore) -> tuple[BearerClaims, CollectorAuthRecord] | None:
    """The verified claims and record of a collector opening a WebSocket, or None after refusing it.

    Collectors never send ``Origin``; browsers always do, so refusing it keeps
    web pages off these sockets. A refusal before ``accept`` reaches the client
    as an HTTP answer with the JSON error body and its stable code (401, 403 or 503).
    """
    if ws.headers.get("origin") is not None:
        await deny(ws, PermissionDenied("browsers may not open collector sockets", code="origin_not_allowed"))
        return None
    gate: AdmissionGate = ws.app.state.admissions
    with gate.enter() as room:
        if not room:
            SOCKETS_SHED.inc()
            busy = Unavailable("the gateway is admitting too many sockets; retry soon", code="gateway_busy")
            await deny(ws, busy, {"Retry-After": str(SHED_RETRY_AFTER_S)})
            return None
        try:
            admitted = await authenticate(ws, store)
        except VersusError as exc:
            await deny(ws, exc)
            return None
        except Exception as exc:
            # A dependency failed (say, no database connection free during a reconnect storm): answer
            # the handshake 503 with the stable code, so the collector backs off and retries, instead
            # of an unhandled error per socket (whose tracebacks alone cost the gateway its CPU).
            public = error_mapping.public_error(exc)
            if error_mapping.status_for(exc).http_status == 500:
                log.exception("socket admission failed")
            else:
                log.warning(
                    "socket refused: dependency unavailable",
                    error=type(exc).__name__,
                    detail=error_mapping.dependency_detail(exc),
                )
            await deny(ws, public)
            return None
    return admitted


async def deny(ws: WebSocket, error: VersusError, headers: dict[str, str] | None = None) -> None:
    """Refuse a handshake with an HTTP answer carrying the error body (the client sees its status)."""
    status = error_mapping.status_for(error)
    try:
        await ws.send_denial_response(
            JSONResponse(error.to_dict(), status_code=status.http_status, headers=headers)
        )
    except RuntimeError:  # the server cannot send a denial response: close (the client sees 403)
        await ws.close(code=status.ws_close_code, reason=error.code)


async def close_socket(ws: WebSocket, code: int, reason: str) -> None:
    """Close an accepted socket; a peer that is already gone is not an error (nothing to tell it)."""
    with contextlib.suppress(WebSocketDisconnect, RuntimeError):
        await ws.close(code=code, reason=reason)
