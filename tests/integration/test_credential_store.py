"""Vault mode B's credential store over gRPC with real PostgreSQL: values are write-only, never in
PostgreSQL in plaintext, scoped to tenants, audited; a master key rotation rewraps (docs/vault.md)."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from sqlalchemy import select, text
from versus.credential.v1 import credential_pb2 as pb
from versus.credential.v1 import credential_pb2_grpc

from common.access.rbac import Role
from common.db.schema import audit_events
from common.error_mapping import GRPC_CODE_METADATA_KEY
from common.grpc.client import aio_channel
from router.credentials.store import CredentialStore
from router.credentials.vault import MasterKeys
from tests.integration.test_gateway_collector import Stack, running_stack
from tests.support.access import mint

pytestmark = [pytest.mark.timeout(90), pytest.mark.usefixtures("no_secret_logged")]

SECRET = "hunter2-very-secret-value"
VALUE = json.dumps({"username": "netops", "password": SECRET}).encode()


@pytest.fixture
async def stack(database_url: str, redis_url: str, tmp_path: Any) -> AsyncIterator[Stack]:
    async with running_stack(database_url, redis_url, tmp_path) as running:
        running.router.credential_store = CredentialStore(
            running.router.engine, MasterKeys("mk-1", {"mk-1": os.urandom(32)})
        )
        yield running


async def _service(stack: Stack, role: Role, tenants: tuple[str, ...] = ()) -> tuple[Any, Any]:
    channel = aio_channel(stack.grpc_address, await mint(stack.router.engine, role, tenants=tenants))
    return channel, credential_pb2_grpc.CredentialServiceStub(channel)


def _code(exc: grpc.aio.AioRpcError) -> str:
    metadata: Any = exc.trailing_metadata() or ()
    return str(dict(metadata).get(GRPC_CODE_METADATA_KEY, ""))


async def test_values_are_write_only_encrypted_at_rest_scoped_and_audited(stack: Stack) -> None:
    channel, platform = await _service(stack, Role.PLATFORM, ("tenant-g",))
    try:
        put = await platform.PutCredential(
            pb.PutCredentialRequest(tenant_id="tenant-g", credential_ref="ssh:sw-1", value=VALUE)
        )
        assert (put.credential.version, list(put.credential.fields)) == (1, ["password", "username"])
        again = await platform.PutCredential(
            pb.PutCredentialRequest(tenant_id="tenant-g", credential_ref="ssh:sw-1", value=VALUE)
        )
        assert again.credential.version == 2
        listed = await platform.ListCredentials(pb.ListCredentialsRequest())
        assert [(c.tenant_id, c.credential_ref) for c in listed.credentials] == [("tenant-g", "ssh:sw-1")]
        assert SECRET not in str(listed) and SECRET not in str(put)
        # Another tenant's: refused before anything is read or written.
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await platform.PutCredential(
                pb.PutCredentialRequest(tenant_id="globex", credential_ref="ssh:sw-1", value=VALUE)
            )
        assert _code(refused.value) == "tenant_not_in_scope"
        with pytest.raises(grpc.aio.AioRpcError) as bad:
            await platform.PutCredential(
                pb.PutCredentialRequest(tenant_id="tenant-g", credential_ref="ssh:sw-2", value=b"[1]")
            )
        assert _code(bad.value) == "credential_value_invalid"
    finally:
        await channel.close(None)
    # PostgreSQL holds no plaintext anywhere: not in the rows, not in the audit log.
    async with stack.router.engine.connect() as conn:
        dump = await conn.scalar(text("SELECT string_agg(c::text, ' ') FROM device_credentials c"))
        audit = [r for r in await conn.execute(select(audit_events)) if r.action.startswith("credential.")]
    assert dump and SECRET not in dump and SECRET.encode().hex() not in dump and "netops" not in dump
    assert [r.action for r in audit] == ["credential.put", "credential.put", "credential.list"]
    assert SECRET not in str(audit)
    # The router opens it for a delivery, and only with the master key.
    async with stack.router.engine.connect() as conn:
        assert await stack.router.credential_store.open(conn, "tenant-g", "ssh:sw-1") == json.loads(VALUE)


async def test_a_master_key_rotation_rewraps_every_data_key(stack: Stack) -> None:
    store = stack.router.credential_store
    channel, admin = await _service(stack, Role.COLLECTOR_ADMIN)
    try:
        await admin.PutCredential(
            pb.PutCredentialRequest(tenant_id="tenant-g", credential_ref="http:lb-1", value=VALUE)
        )
        stack.router.credential_store = CredentialStore(
            store.engine, MasterKeys("mk-2", {**store.master.keys, "mk-2": os.urandom(32)})
        )
        done = await admin.RewrapCredentials(pb.RewrapCredentialsRequest())
        assert (done.rewrapped, done.active_key_id) == (1, "mk-2")
        only_new = MasterKeys("mk-2", {"mk-2": stack.router.credential_store.master.keys["mk-2"]})
        async with stack.router.engine.connect() as conn:
            assert await CredentialStore(store.engine, only_new).open(
                conn, "tenant-g", "http:lb-1"
            ) == json.loads(VALUE)
        await admin.DeleteCredential(
            pb.DeleteCredentialRequest(tenant_id="tenant-g", credential_ref="http:lb-1")
        )
        with pytest.raises(grpc.aio.AioRpcError) as gone:
            await admin.DeleteCredential(
                pb.DeleteCredentialRequest(tenant_id="tenant-g", credential_ref="http:lb-1")
            )
        assert _code(gone.value) == "credential_not_found"
    finally:
        await channel.close(None)
