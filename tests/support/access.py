"""API tokens for tests: minted straight into the test database, as `versus-cp access bootstrap` does."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncEngine

from common import api_tokens
from common.db import engine as db_engine
from common.rbac import Role


async def mint(
    engine: AsyncEngine, role: Role, name: str | None = None, tenants: tuple[str, ...] = ()
) -> str:
    """A fresh token with ``role``; returns the plaintext.

    A platform token is scoped to ``tenants``, or to every tenant when none are named.
    """
    async with engine.begin() as conn:
        issued = await api_tokens.create(
            conn, name or f"test-{role.value}", role, "tests",
            tenants=tenants, all_tenants=role == Role.PLATFORM and not tenants,
        )  # fmt: skip
    return issued.plaintext


async def mint_at(database_url: str, role: Role, name: str | None = None) -> str:
    engine = db_engine.create_async(database_url, pool_size=1)
    try:
        return await mint(engine, role, name)
    finally:
        await engine.dispose()
