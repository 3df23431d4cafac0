"""The short banner `versus-cp up` prints once everything is ready."""

from __future__ import annotations

from pathlib import Path

from common.config.settings import Settings
from common.db.engine import describe as describe_db
from common.embedded.postgres import EmbeddedPostgres
from common.embedded.redis import EmbeddedRedis
from common.redis.client import describe as describe_redis
from common.trust.tls import GatewayTls
from versus_cp.access_bootstrap import Bootstrapped


def render_banner(
    settings: Settings,
    state: Path,
    tls: GatewayTls | None,
    postgres: EmbeddedPostgres | None,
    redis: EmbeddedRedis | None,
    access: Bootstrapped | None = None,
) -> str:
    pg = (
        f"embedded, data in {postgres.directory}"
        if postgres
        else f"external {describe_db(settings.database_url or '')}"
    )
    rd = (
        f"embedded, data in {redis.directory}"
        if redis
        else f"external {describe_redis(settings.redis_url or '')}"
    )
    lines = [
        "",
        "Versus control plane is up.",
        f"  gateway     {settings.gateway_url}   (collectors; /healthz /readyz /metrics)",
        *(
            [f"  console     {settings.console_url}   (operators; sign in with an API token)"]
            if settings.gateway_tls
            else []
        ),
        f"  router      {settings.router_address} gRPC   metrics http://{settings.router_host}:"
        f"{settings.router_metrics_port}/metrics",
        f"  enrollment  {settings.enrollment_address} gRPC   metrics http://{settings.enrollment_host}:"
        f"{settings.enrollment_metrics_port}/metrics",
        f"  postgres    {pg}",
        f"  redis       {rd}",
        f"  state       {state}",
    ]
    if postgres or redis:
        # What another gateway or router beside this one needs (docs/configuration.md); also in
        # endpoints.json. Socket URLs: no secret in them.
        lines.append("  attach      " + " ".join(
            [*([f"DATABASE_URL='{postgres.url}'"] if postgres else []),
             *([f"REDIS_URL='{redis.url}'"] if redis else [])]
        ))  # fmt: skip
    if tls is not None and tls.ca_file is not None:
        lines.append(f"  gateway CA  {tls.ca_file}  pin {tls.ca_pin()}")
    if access is not None and access.admin_token is not None:
        lines += [
            "",
            "Bootstrap admin API token (collector-admin), shown only this once:",
            f"  {access.admin_token}",
            f"  saved with mode 0600 to {access.admin_token_file}; versus-cp reads it from there or from",
            "  VERSUS_API_TOKEN. Create scoped tokens with `versus-cp access create` (docs/access.md).",
        ]
    lines += [
        "",
        "Next: enroll a collector (docs/enrollment.md):",
        "  versus-cp sites create <name> --tenant <tenant>",
        "  versus-cp tokens issue --site <site id>      # prints the versus-collector enroll command",
        "Stop with Ctrl-C (or SIGTERM).",
        "",
    ]
    return "\n".join(lines)
