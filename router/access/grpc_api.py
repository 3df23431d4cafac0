"""gRPC adapter for AccessService: API tokens and the audit log."""

from __future__ import annotations

import base64
import datetime as dt

from google.protobuf.struct_pb2 import Struct
from sqlalchemy.ext.asyncio import AsyncEngine
from versus.access.v1 import access_pb2 as pb
from versus.access.v1 import access_pb2_grpc

from common.access import api_tokens, rbac
from common.access.rbac import Role
from common.errors import InvalidArgument
from common.grpc.pb_time import timestamp as _ts
from common.grpc.server import Context
from router.core import audit

ROLE_TO_PB = {
    Role.VIEWER: pb.ROLE_VIEWER,
    Role.OPERATOR: pb.ROLE_OPERATOR,
    Role.COLLECTOR_ADMIN: pb.ROLE_COLLECTOR_ADMIN,
    Role.PLATFORM: pb.ROLE_PLATFORM,
    Role.SERVICE: pb.ROLE_SERVICE,
}
ROLE_FROM_PB = {v: k for k, v in ROLE_TO_PB.items()}
MAX_PAGE_SIZE = 500
DEFAULT_PAGE_SIZE = 100


def token_pb(token: api_tokens.ApiToken) -> pb.ApiToken:
    return pb.ApiToken(
        token_id=token.token_id,
        name=token.name,
        role=ROLE_TO_PB[token.role],
        display_prefix=token.display_prefix,
        created_at=_ts(token.created_at),
        expires_at=_ts(token.expires_at),
        revoked_at=_ts(token.revoked_at),
        created_by=token.created_by,
        tenants=sorted(token.tenants - {rbac.ALL_TENANTS}) if token.tenants is not None else [],
        all_tenants=token.tenants is not None and rbac.ALL_TENANTS in token.tenants,
    )


def _page(token: str) -> int | None:
    if not token:
        return None
    try:
        return int(base64.urlsafe_b64decode(token.encode()).decode())
    except ValueError:
        raise InvalidArgument(
            "page_token is not one this service issued", code="page_token_invalid"
        ) from None


class AccessServicer(access_pb2_grpc.AccessServiceServicer):
    def __init__(self, engine: AsyncEngine):
        self.engine = engine

    async def CreateApiToken(
        self, request: pb.CreateApiTokenRequest, context: Context
    ) -> pb.CreateApiTokenResponse:
        role = ROLE_FROM_PB.get(request.role)
        if role is None:
            raise InvalidArgument("role is required", code="role_invalid")
        async with self.engine.begin() as conn:
            issued = await api_tokens.create(
                conn, request.name, role, rbac.current_actor(), request.ttl_seconds,
                tenants=list(request.tenants), all_tenants=request.all_tenants,
            )  # fmt: skip
        return pb.CreateApiTokenResponse(token=token_pb(issued.token), plaintext=issued.plaintext)

    async def ListApiTokens(
        self, request: pb.ListApiTokensRequest, context: Context
    ) -> pb.ListApiTokensResponse:
        async with self.engine.connect() as conn:
            found = await api_tokens.list_all(conn)
        return pb.ListApiTokensResponse(tokens=[token_pb(t) for t in found])

    async def RevokeApiToken(
        self, request: pb.RevokeApiTokenRequest, context: Context
    ) -> pb.RevokeApiTokenResponse:
        async with self.engine.begin() as conn:
            token = await api_tokens.revoke(conn, request.token_id, rbac.current_actor())
        return pb.RevokeApiTokenResponse(token=token_pb(token))

    async def ListAuditEvents(
        self, request: pb.ListAuditEventsRequest, context: Context
    ) -> pb.ListAuditEventsResponse:
        size = request.page_size or DEFAULT_PAGE_SIZE
        if size > MAX_PAGE_SIZE:
            raise InvalidArgument(f"page_size must be at most {MAX_PAGE_SIZE}", code="page_size_too_large")
        async with self.engine.connect() as conn:
            rows = await audit.list_events(
                conn,
                subject_type=request.subject_type,
                subject_id=request.subject_id,
                actor=request.actor,
                action_prefix=request.action_prefix,
                before_id=_page(request.page_token),
                limit=size + 1,
                since=request.since.ToDatetime(dt.UTC) if request.HasField("since") else None,
                until=request.until.ToDatetime(dt.UTC) if request.HasField("until") else None,
            )
        events = []
        for r in rows[:size]:
            details = Struct()
            details.update(dict(r["details"] or {}))
            events.append(
                pb.AuditEvent(
                    id=r["id"], at=_ts(r["at"]), service=r["service"], actor=r["actor"], action=r["action"],
                    subject_type=r["subject_type"], subject_id=r["subject_id"],
                    request_id=r["request_id"] or "", details=details,
                )
            )  # fmt: skip
        more = len(rows) > size
        token = base64.urlsafe_b64encode(str(rows[size - 1]["id"]).encode()).decode() if more else ""
        return pb.ListAuditEventsResponse(events=events, next_page_token=token)

    async def WhoAmI(self, request: pb.WhoAmIRequest, context: Context) -> pb.WhoAmIResponse:
        principal = rbac.current()
        assert principal is not None  # the interceptor authenticated the call
        scope = principal.tenants
        return pb.WhoAmIResponse(
            token_id=principal.token_id, name=principal.name, role=ROLE_TO_PB[principal.role],
            tenants=sorted(scope - {rbac.ALL_TENANTS}) if scope is not None else [],
            all_tenants=scope is not None and rbac.ALL_TENANTS in scope,
        )  # fmt: skip
