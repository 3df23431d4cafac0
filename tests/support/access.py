"""API tokens for tests: minted straight into the test database, as `versus-cp access bootstrap` does."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncEngine

from common import api_tokens
from common.db import engine as db_engine
from common.rbac import Role


async def mint(engine: AsyncEngine, role: Role, name: str | None = None) -> str:
    """A fresh token with ``role``; returns the plaintext."""
    async with engine.begin() as conn:
        issued = await api_tokens.create(conn, name or f"test-{role.value}", role, "tests")
    return issued.plaintext


async def mint_at(database_url: str, role: Role, name: str | None = None) -> str:
    engine = db_engine.create_async(database_url, pool_size=1)
    try:
        return await mint(engine, role, name)
    finally:
        await engine.dispose()
