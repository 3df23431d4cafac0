"""First-start API tokens: the internal service token and the bootstrap collector-admin token.

Run by `versus-cp up` after migrating, and by `versus-cp access bootstrap` for
deployments that run each service alone. Both talk to PostgreSQL directly:
whoever can write the database is already root of the control plane, so this
is the one place a token is minted without an API token.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

from common.access import api_tokens
from common.access.rbac import Role
from common.config.settings import Settings
from common.db import engine as db_engine
from common.grpc import token_files
from common.telemetry.logs import get_logger

log = get_logger("versus.access")

BOOTSTRAP_ADMIN_NAME = "bootstrap-admin"
SERVICE_TOKEN_NAME = "internal-services"  # noqa: S105 - a display name


@dataclass(frozen=True)
class Bootstrapped:
    """What a first start created. ``admin_token`` is set only when the admin token is new."""

    admin_token: str | None
    admin_token_file: Path

    def __repr__(self) -> str:
        return f"Bootstrapped(admin_token_file={self.admin_token_file!s}, new={self.admin_token is not None})"


async def _ensure(database_url: str, settings: Settings, service: bool) -> Bootstrapped:
    engine = db_engine.create_async(database_url, pool_size=1)
    state = settings.state_dir
    admin_file = settings.api_token_file or state / token_files.ADMIN_TOKEN_FILE
    try:
        async with engine.begin() as conn:
            if service and settings.service_token is None:
                path = state / token_files.SERVICE_TOKEN_FILE
                existing = token_files.read(path)
                if existing is None or await api_tokens.lookup(conn, existing) is None:
                    issued = await api_tokens.create(conn, SERVICE_TOKEN_NAME, Role.SERVICE, "versus-cp up")
                    token_files.write(path, issued.plaintext)
                    log.info("service token created", token_id=issued.token.token_id, file=str(path))
            admin: str | None = None
            if not await api_tokens.has_role(conn, Role.COLLECTOR_ADMIN):
                issued = await api_tokens.create(
                    conn, BOOTSTRAP_ADMIN_NAME, Role.COLLECTOR_ADMIN, "versus-cp up"
                )
                token_files.write(admin_file, issued.plaintext)
                admin = issued.plaintext
                log.info(
                    "bootstrap admin token created", token_id=issued.token.token_id, file=str(admin_file)
                )
        return Bootstrapped(admin, admin_file)
    finally:
        await engine.dispose()


def ensure(database_url: str, settings: Settings, *, service: bool = True) -> Bootstrapped:
    """Create the service token (unless configured or ``service`` is false) and, once ever, the
    bootstrap admin token."""
    return asyncio.run(_ensure(database_url, settings, service))
