"""CredentialService over gRPC: revoking credentials from running tasks
(router/credentials/revocations.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from versus.credential.v1 import credential_pb2 as pb
from versus.credential.v1 import credential_pb2_grpc

from common.access import rbac
from common.errors import FailedPrecondition, InvalidArgument, NotFound
from common.grpc.pb_time import timestamp as ts
from common.grpc.server import Context
from router.credentials.revocations import Revocations, overall
from router.credentials.store import CredentialStore

ACTION_FROM_PB = {pb.REVOKE_ACTION_SCRUB: "scrub", pb.REVOKE_ACTION_KILL: "kill"}
ACTION_TO_PB = {v: k for k, v in ACTION_FROM_PB.items()}
STATE_TO_PB = {
    "pending": pb.REVOCATION_STATE_PENDING,
    "revoked": pb.REVOCATION_STATE_REVOKED,
    "unreachable": pb.REVOCATION_STATE_UNREACHABLE,
    "failed": pb.REVOCATION_STATE_FAILED,
}
DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 500


def revocation_pb(row: Mapping[str, Any]) -> pb.Revocation:
    targets = row.get("targets", [])
    return pb.Revocation(
        revocation_id=row["revocation_id"],
        credential_ref=row["credential_ref"],
        action=ACTION_TO_PB[row["action"]],
        reason=row["reason"],
        actor=row["actor"],
        created_at=ts(row["created_at"]),
        state=STATE_TO_PB[overall(t["state"] for t in targets)],
        targets=[
            pb.RevocationTarget(
                collector_id=t["collector_id"],
                dispatch_ids=list(t["dispatch_ids"]),
                state=STATE_TO_PB[t["state"]],
                results={str(k): str(v) for k, v in (t["results"] or {}).items()},
                detail=t["detail"],
                updated_at=ts(t["updated_at"]),
            )
            for t in targets
        ],
    )


def stored_pb(row: Mapping[str, Any]) -> pb.StoredCredential:
    return pb.StoredCredential(
        tenant_id=row["tenant_id"], credential_ref=row["credential_ref"], version=row["version"],
        fields=list(row["fields"]), updated_by=row["updated_by"], created_at=ts(row["created_at"]),
        updated_at=ts(row["updated_at"]),
    )  # fmt: skip


class CredentialServicer(credential_pb2_grpc.CredentialServiceServicer):
    def __init__(self, router: Revocations):
        self.router = router

    def _store(self) -> CredentialStore:
        store: CredentialStore | None = self.router.credential_store
        if store is None:
            raise FailedPrecondition("this router has no credentials master key", code="vault_unavailable")
        return store

    async def PutCredential(
        self, request: pb.PutCredentialRequest, context: Context
    ) -> pb.PutCredentialResponse:
        rbac.require_tenant(request.tenant_id)
        row = await self._store().put(
            request.tenant_id, request.credential_ref, request.value, rbac.current_actor()
        )
        return pb.PutCredentialResponse(credential=stored_pb(row))

    async def DeleteCredential(
        self, request: pb.DeleteCredentialRequest, context: Context
    ) -> pb.DeleteCredentialResponse:
        rbac.require_tenant(request.tenant_id)
        await self._store().delete(request.tenant_id, request.credential_ref, rbac.current_actor())
        return pb.DeleteCredentialResponse()

    async def ListCredentials(
        self, request: pb.ListCredentialsRequest, context: Context
    ) -> pb.ListCredentialsResponse:
        scope = rbac.tenant_filter()
        if request.tenant_id:
            rbac.require_tenant(request.tenant_id)
            tenants: list[str] | None = [request.tenant_id]
        else:
            tenants = None if scope is None else sorted(scope)
        rows = await self._store().list(tenants, rbac.current_actor())
        return pb.ListCredentialsResponse(credentials=[stored_pb(r) for r in rows])

    async def RewrapCredentials(
        self, request: pb.RewrapCredentialsRequest, context: Context
    ) -> pb.RewrapCredentialsResponse:
        vault = self._store()
        done = await vault.rewrap_all(rbac.current_actor())
        return pb.RewrapCredentialsResponse(rewrapped=done, active_key_id=vault.master.active)

    async def RevokeCredential(
        self, request: pb.RevokeCredentialRequest, context: Context
    ) -> pb.RevokeCredentialResponse:
        action = ACTION_FROM_PB.get(request.action)
        if action is None:
            raise InvalidArgument("action must be SCRUB or KILL", code="revoke_action_invalid")
        row = await self.router.revoke_credential(
            request.credential_ref, action, request.reason, rbac.current_actor()
        )
        return pb.RevokeCredentialResponse(revocation=revocation_pb(row))

    async def GetRevocation(
        self, request: pb.GetRevocationRequest, context: Context
    ) -> pb.GetRevocationResponse:
        row = await self.router.get_revocation(request.revocation_id)
        if not _visible(row):
            raise NotFound(
                f"revocation {request.revocation_id!r} does not exist", code="revocation_not_found"
            )
        return pb.GetRevocationResponse(revocation=revocation_pb(row))

    async def ListRevocations(
        self, request: pb.ListRevocationsRequest, context: Context
    ) -> pb.ListRevocationsResponse:
        size = request.page_size or DEFAULT_PAGE_SIZE
        if size > MAX_PAGE_SIZE:
            raise InvalidArgument(f"page_size must be at most {MAX_PAGE_SIZE}", code="page_size_too_large")
        rows = await self.router.list_revocations(request.credential_ref, size)
        return pb.ListRevocationsResponse(revocations=[revocation_pb(r) for r in rows if _visible(r)])


def _visible(row: Mapping[str, Any]) -> bool:
    """A token scoped to tenants sees the revocations it made; the rest span every tenant."""
    return rbac.tenant_filter() is None or row["actor"] == rbac.current_actor()
