"""API tokens for tests: minted straight into the test database, as `versus-cp access bootstrap` does."""

from __future__ import annotations

from google.protobuf.descriptor import ServiceDescriptor
from sqlalchemy.ext.asyncio import AsyncEngine
from versus.access.v1 import access_pb2
from versus.credential.v1 import credential_pb2
from versus.enrollment.v1 import enrollment_pb2
from versus.fleet.v1 import fleet_pb2
from versus.router.v1 import collector_bridge_pb2, task_router_pb2, tunnel_pb2

from common.access import api_tokens
from common.access.rbac import Role
from common.db import engine as db_engine

# Every generated module that declares gRPC services: the RBAC policy must name each of their RPCs.
SERVICE_MODULES = (
    access_pb2,
    credential_pb2,
    enrollment_pb2,
    fleet_pb2,
    collector_bridge_pb2,
    task_router_pb2,
    tunnel_pb2,
)
# Every service by its full name.
SERVICES: dict[str, ServiceDescriptor] = {
    s.full_name: s for module in SERVICE_MODULES for s in module.DESCRIPTOR.services_by_name.values()
}


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
