"""Vault mode C on the control plane's side: each collector's AppRole secret id is write-only,
sealed in PostgreSQL, audited by version only, and reaches the collector in its signed config
encrypted to the collector's own key (router/credentials/vault_secrets.py)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from sqlalchemy import select, text

from common.db.schema import collectors
from common.errors import FailedPrecondition, InvalidArgument
from common.trust import signed_doc
from common.trust.credential_relay import open_for
from router.credentials.store import CredentialStore
from router.credentials.vault import MasterKeys
from router.fleet.operations import Fleet
from tests.integration.test_gateway_collector import API, Collector, Stack, running_stack

pytestmark = [pytest.mark.timeout(90), pytest.mark.usefixtures("no_secret_logged")]

WRAPPING_TOKEN = "hvs.CAESIwrapping-token-4711"


@pytest.fixture
async def stack(database_url: str, redis_url: str, tmp_path: Any) -> AsyncIterator[Stack]:
    async with running_stack(database_url, redis_url, tmp_path) as running:
        master = MasterKeys("mk-1", {"mk-1": os.urandom(32)})
        running.router.credential_store = CredentialStore(running.router.engine, master)
        yield running


async def _integration(fleet: Fleet, **extra: str) -> str:
    values = {"name": "corp", "address": "https://vault.corp:8200", "role_id": "role-1", "kv_mount": "secret",
              "path_prefix": "versus", "secret_id_delivery": "wrapped", "ca_pem": "", **extra}  # fmt: skip
    return str((await fleet.create_integration(values))["integration_id"])


async def _config(stack: Stack, c: Collector, held: int = 0) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=stack.url, timeout=30) as client:
        reply = await client.post(
            API + "/claim", json={"wait_s": 0, "session_id": "s-1", "config_version": held}, auth=c.auth
        )
    assert reply.status_code == 200, reply.text
    return signed_doc.verify(
        reply.json()["config"], c.dispatch_keys, kind="collector_config", collector_id=c.collector_id,
        now=int(time.time()),
    )  # fmt: skip


async def test_the_secret_id_is_sealed_at_rest_and_reaches_only_its_collector(stack: Stack) -> None:
    c = await stack.enroll("col-c")
    assert (await stack.publish(c)).status_code == 200
    fleet = Fleet(stack.router)
    integration = await _integration(fleet)
    view = await fleet.set_vault_mode("col-c", "external", integration, WRAPPING_TOKEN + "\n")
    assert view.row["vault_secret_version"] == 1
    # PostgreSQL: sealed, in the collector row and nowhere else (not in the audit log either).
    async with stack.router.engine.connect() as conn:
        stored = (await conn.execute(select(collectors.c.vault_secret))).scalars().all()
        audit = (await conn.execute(text("SELECT details::text FROM audit_events"))).scalars().all()
    assert not any(WRAPPING_TOKEN in str(s) for s in stored) and any(stored)
    assert not any(WRAPPING_TOKEN in a for a in audit)
    assert any('"vault_secret_version": 1' in a for a in audit)
    # The config: the integration's settings, and the secret encrypted to this collector for version 1.
    config = await _config(stack, c)
    secret = config["vault"]["secret"]
    assert (secret["version"], secret["delivery"]) == (1, "wrapped")
    assert WRAPPING_TOKEN not in json.dumps(config)
    assert open_for(c.key, "col-c", "vault-secret-id:v1", secret) == {"secret_id": WRAPPING_TOKEN}
    # Changing nothing but the integration's settings keeps the secret; a new one is version 2.
    await fleet.set_vault_mode("col-c", "external", integration)
    again = await fleet.set_vault_mode("col-c", "external", integration, "hvs.second-token")
    assert again.row["vault_secret_version"] == 2
    second = (await _config(stack, c, held=1))["vault"]["secret"]
    assert open_for(c.key, "col-c", "vault-secret-id:v2", second) == {"secret_id": "hvs.second-token"}
    # Leaving mode C forgets it.
    await fleet.set_vault_mode("col-c", "local", "")
    async with stack.router.engine.connect() as conn:
        gone = (await conn.execute(select(collectors.c.vault_secret))).scalar_one()
    assert gone is None


async def test_bad_secret_ids_and_integrations_are_refused_with_their_codes(stack: Stack) -> None:
    c = await stack.enroll("col-x")
    assert (await stack.publish(c)).status_code == 200
    fleet = Fleet(stack.router)
    integration = await _integration(fleet)

    async def code(call: Any) -> str:
        with pytest.raises((InvalidArgument, FailedPrecondition)) as caught:
            await call
        return str(caught.value.code)

    assert await code(fleet.set_vault_mode("col-x", "external", integration)) == "vault_secret_id_required"
    assert await code(fleet.set_vault_mode("col-x", "external", integration, "two words")) == (
        "vault_secret_id_invalid"
    )
    assert await code(fleet.set_vault_mode("col-x", "relayed", "", "hvs.x")) == "vault_secret_id_unexpected"
    assert await code(_integration(fleet, name="p", path_prefix="a/../b")) == "path_prefix_invalid"
    assert (
        await code(_integration(fleet, name="d", secret_id_delivery="mailed")) == "secret_id_delivery_invalid"
    )
    assert await code(_integration(fleet, name="c", ca_pem="not a certificate")) == "ca_pem_invalid"
    stack.router.credential_store = None
    assert await code(fleet.set_vault_mode("col-x", "external", integration, "hvs.x")) == "vault_unavailable"
