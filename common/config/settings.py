"""One typed settings object for every process, read from the environment and an optional file.

Precedence, highest first: explicit keyword arguments, environment variables,
the TOML file named by ``VERSUS_CONFIG``, then the defaults below. Every field
is documented in docs/configuration.md.
"""

from __future__ import annotations

import os
import tomllib
from enum import StrEnum
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import AliasChoices, Field, SecretStr, ValidationError, field_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from common import limits
from common.config.targets import grpc_target
from common.db.urls import hosts as db_hosts
from common.errors import ConfigError
from common.redis import sentinel as redis_sentinel

CONFIG_FILE_ENV = "VERSUS_CONFIG"


def default_state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "versus"


class LogFormat(StrEnum):
    CONSOLE = "console"
    JSON = "json"


class EventLoop(StrEnum):
    """Which event loop each service process runs on (common/runtime/event_loop.py)."""

    UVLOOP = "uvloop"
    ASYNCIO = "asyncio"


class KeyMaterialMode(StrEnum):
    """Where the deployment's key and CA material comes from (common/material/shared.py)."""

    LOCAL = "local"
    SHARED = "shared"


class _TomlFileSource(PydanticBaseSettingsSource):
    """Values from the TOML file named by ``VERSUS_CONFIG`` (a flat table of field names)."""

    def __init__(self, settings_cls: type[BaseSettings]):
        super().__init__(settings_cls)
        path = os.environ.get(CONFIG_FILE_ENV)
        self._values: dict[str, Any] = {}
        if path:
            try:
                with open(path, "rb") as fh:
                    self._values = tomllib.load(fh)
            except OSError as exc:
                raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
            except tomllib.TOMLDecodeError as exc:
                raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc
            unknown = sorted(set(self._values) - set(settings_cls.model_fields))
            if unknown:
                raise ConfigError(f"config file {path} has unknown settings: {', '.join(unknown)}")

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self._values.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(self._values)


class Settings(BaseSettings):
    """Settings shared by `versus-cp up` and each service started alone."""

    model_config = SettingsConfigDict(
        env_prefix="VERSUS_",
        populate_by_name=True,
        extra="forbid",
        frozen=True,
    )

    # --- state -----------------------------------------------------------------------------------
    database_url: str | None = Field(
        default=None,
        validation_alias=AliasChoices("DATABASE_URL", "database_url"),
        description="PostgreSQL URL. Unset: start the embedded server under the state directory.",
    )
    redis_url: str | None = Field(
        default=None,
        validation_alias=AliasChoices("REDIS_URL", "redis_url"),
        description="Redis URL (redis://, rediss:// or unix://). Unset: start the embedded server.",
    )
    state_dir: Path = Field(
        default_factory=default_state_dir,
        description="Keys, CAs, generated TLS files and embedded server data live here.",
    )

    key_material: KeyMaterialMode = Field(
        default=KeyMaterialMode.LOCAL,
        description="local: keys and CAs in the state directory (one host). shared: sealed in "
        "PostgreSQL, followed by every replica (docs/deployment.md).",
    )
    material_key_file: Path | None = Field(
        default=None,
        description="Material key file (mode 0600) that seals the shared key material; needed by "
        "routers, enrollment services and the key and CA commands in shared mode, never by gateways.",
    )

    # --- listeners -------------------------------------------------------------------------------
    gateway_host: str = "127.0.0.1"
    gateway_port: int = Field(default=8443, ge=1, le=65535)
    # The gateway's internal gRPC listener where platform ends attach to the tunnel sessions it
    # holds (docs/gateway.md, "Tunnels"). Port 0: one the system picks at start, advertised in
    # each session's record; deployments across hosts set a fixed port and the advertise address.
    gateway_attach_host: str = "127.0.0.1"
    gateway_attach_port: int = Field(default=0, ge=0, le=65535)
    gateway_attach_advertise: str | None = Field(
        default=None,
        description="host:port at which platform clients and routers reach this gateway's attach "
        "listener. Default: its listen address and bound port.",
    )
    router_host: str = "127.0.0.1"
    router_port: int = Field(default=50051, ge=1, le=65535)
    router_metrics_port: int = Field(default=9464, ge=1, le=65535)
    enrollment_host: str = "127.0.0.1"
    enrollment_port: int = Field(default=50052, ge=1, le=65535)
    enrollment_metrics_port: int = Field(default=9465, ge=1, le=65535)
    # The operator web console (docs/console.md), HTTPS with the gateway's TLS material.
    console_host: str = "127.0.0.1"
    console_port: int = Field(default=8444, ge=1, le=65535)
    console_public_url: str | None = Field(
        default=None, description="Where operators' browsers reach the console (its origin)."
    )

    # Where the gateway reaches the internal gRPC services; default: their own listen address.
    # One host:port, a comma-separated list of replicas' IP:port, or a gRPC target such as
    # dns:///routers.internal:50051 (common/config/targets.py); calls are balanced round robin.
    router_target: str | None = None
    enrollment_target: str | None = None
    router_advertise: str | None = Field(
        default=None,
        description='Not used since gateways hold tunnel sessions (docs/gateway.md, "Tunnels"); '
        "accepted so that existing configurations still start.",
    )

    # --- gateway TLS -----------------------------------------------------------------------------
    gateway_tls: bool = Field(
        default=True, description="Serve HTTPS. Off only behind a TLS-terminating edge."
    )
    tls_cert_file: Path | None = Field(default=None, description="Gateway certificate chain (PEM).")
    tls_key_file: Path | None = Field(default=None, description="Gateway private key (PEM).")
    gateway_server_name: str = Field(
        default="localhost", description="Name collectors verify on the gateway."
    )

    claim_hold_s: float = Field(
        default=25.0, gt=0, le=55, description="Longest the gateway holds a claim waiting for work (seconds)."
    )
    socket_claim_hold_s: float = Field(
        default=120.0,
        gt=0,
        le=240,
        description="Longest the gateway holds a claim sent on the control socket (seconds). The "
        "socket's pings keep the connection, and the gateway writes the parked claim's heartbeat "
        "every 20 s while they are answered (docs/gateway.md, 'Where a claim waits').",
    )
    gateway_park_claims: bool = Field(
        default=True,
        description="Idle claims wait in the gateway, not the router (docs/gateway.md, 'Where a claim "
        "waits'); false sends every claim to the router, as before parking (for comparisons).",
    )
    gateway_router_streams: int = Field(
        default=2,
        ge=0,
        le=16,
        description="Long-lived Exchange streams each gateway keeps to the routers for collector calls "
        "(docs/router.md, 'The gateway's stream'); 0 makes one unary call per claim or report, as before.",
    )
    router_db_pool: int = Field(
        default=40,
        ge=1,
        le=1000,
        description="PostgreSQL connections each router process keeps open for its work; a transaction "
        "beyond them waits for one (docs/router.md, 'PostgreSQL connections').",
    )
    router_db_overflow: int = Field(
        default=0,
        ge=0,
        le=1000,
        description="Connections a router may open beyond router_db_pool under load, closed as soon as "
        "they are returned (each costs PostgreSQL a new backend); 0 keeps none.",
    )
    router_fleet_sample_s: float = Field(
        default=15.0,
        ge=1,
        le=3600,
        description="How often each router samples the fleet gauges from PostgreSQL and Redis (seconds; "
        "docs/operations.md, 'Metrics').",
    )
    collector_cert_lifetime_s: int = Field(
        default=90 * 24 * 3600,
        ge=10,
        le=397 * 24 * 3600,
        description="How long a collector certificate is valid (seconds); collectors renew at about two "
        "thirds of it. Short values are for tests.",
    )
    gateway_drain_s: float = Field(
        default=0.0,
        ge=0,
        le=300,
        description="On SIGTERM, how long the gateway answers /readyz with 503 while still serving, so "
        "a load balancer's health checks move collectors away before the listener closes (seconds).",
    )
    gateway_max_anonymous_per_source: int = Field(
        default=256,
        ge=0,
        le=1_000_000,
        description="Connections one source address may hold before presenting a valid collector token "
        "(0: no limit, e.g. behind a load balancer that hides client addresses).",
    )
    gateway_max_handshakes: int = Field(
        default=64,
        ge=1,
        le=100_000,
        description="TLS handshakes the gateway runs at once; further connections wait for a slot, "
        "up to 4,096 of them for up to 8 s (docs/gateway.md, 'Storms').",
    )
    gateway_public_url: str | None = Field(
        default=None,
        description="URL collectors use to reach the gateway (enroll commands, trust bootstrap). "
        "Default: https://<gateway_server_name>:<gateway_port>.",
    )
    gateway_ca_file: Path | None = Field(
        default=None,
        description="CA of operator-supplied gateway certificates, handed to collectors at enrollment.",
    )

    credentials_master_keys_file: Path | None = Field(
        default=None,
        description="Master keys of vault mode B's credential store (docs/vault.md); default: "
        "<state>/credentials-master-keys.json, created on first use.",
    )
    output_task_limit_bytes: int = Field(
        default=limits.OUTPUT_TASK_LIMIT_BYTES,
        ge=limits.MAX_OUTPUT_CHUNK,
        le=2**40,
        description="Most streamed output one task attempt may store (protocol 4, docs/protocol.md).",
    )
    output_tenant_quota_bytes: int = Field(
        default=limits.OUTPUT_TENANT_QUOTA_BYTES,
        ge=limits.MAX_OUTPUT_CHUNK,
        le=2**50,
        description="Most streamed output one tenant's tasks may store at once; output is removed as it "
        "passes retention.",
    )
    output_retention_s: int = Field(
        default=limits.OUTPUT_RETENTION_S,
        ge=60,
        le=365 * 24 * 3600,
        description="How long a task's streamed output is kept after the task ended (seconds).",
    )
    update_soak_s: int = Field(
        default=3600,
        ge=0,
        le=30 * 24 * 3600,
        description="How long a release without the security flag waits before sites on the auto "
        "update policy take it (seconds); security fixes go out at once (docs/upgrades.md).",
    )

    # --- collector identity ----------------------------------------------------------------------
    trust_domain: str = Field(
        default="versus.internal",
        pattern=r"^[a-z0-9]([a-z0-9.-]{0,253}[a-z0-9])?$",
        description="SPIFFE trust domain in collector identity SANs.",
    )
    collector_ca_cert_file: Path | None = None
    collector_ca_key_file: Path | None = None

    # --- API tokens (docs/access.md) ---------------------------------------------------------------
    service_token: SecretStr | None = Field(
        default=None,
        description="API token (role service) the gateway presents to the router and enrollment service. "
        "Default: the file service-token in the state directory, written by `versus-cp up`.",
    )
    api_token: SecretStr | None = Field(
        default=None, description="API token the `versus-cp` operator commands present."
    )
    api_token_file: Path | None = Field(
        default=None,
        description="File (mode 0600) holding the operator API token. Default: admin-token in the state "
        "directory, written by `versus-cp up` on first start.",
    )

    # --- observability ---------------------------------------------------------------------------
    log_format: LogFormat = LogFormat.CONSOLE
    log_level: str = "INFO"

    # --- lifecycle -------------------------------------------------------------------------------
    event_loop: EventLoop = Field(
        default=EventLoop.UVLOOP,
        description="The services' event loop: uvloop (libuv), or the standard library's asyncio loop.",
    )
    shutdown_grace_s: float = Field(default=10.0, gt=0, le=300)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, _TomlFileSource(settings_cls))

    @field_validator("database_url")
    @classmethod
    def _check_database_url(cls, value: str | None) -> str | None:
        if value is None or value == "":
            return None
        parts = urlsplit(value)
        if parts.scheme not in {"postgresql", "postgres", "postgresql+psycopg"}:
            raise ValueError("must be a postgresql:// URL")
        try:
            named = db_hosts(value)  # every host of a multi-host URL (a Patroni cluster's nodes)
        except ValueError as exc:
            raise ValueError("has an invalid port") from exc
        for entry in named:
            _, colon, port = entry.rpartition(":") if not entry.startswith("/") else ("", "", "")
            if colon and not (port.isdigit() and 0 < int(port) < 65536):
                raise ValueError("has an invalid port")
        if not parts.hostname and "host=" not in parts.query:
            raise ValueError("names no host")
        return value

    @field_validator("redis_url")
    @classmethod
    def _check_redis_url(cls, value: str | None) -> str | None:
        if value is None or value == "":
            return None
        if redis_sentinel.is_sentinel(value):
            redis_sentinel.parse(value)  # raises ValueError with what is wrong
            return value
        parts = urlsplit(value)
        if parts.scheme not in {"redis", "rediss", "unix"}:
            raise ValueError("must be a redis://, rediss://, unix:// or redis+sentinel:// URL")
        try:
            parts.port  # noqa: B018
        except ValueError as exc:
            raise ValueError("has an invalid port") from exc
        if parts.scheme == "unix" and not parts.path:
            raise ValueError("names no socket path")
        if parts.scheme != "unix" and not parts.hostname:
            raise ValueError("names no host")
        return value

    @field_validator("router_target", "enrollment_target")
    @classmethod
    def _check_target(cls, value: str | None) -> str | None:
        if value is None or value == "":
            return None
        try:
            grpc_target(value)
        except ConfigError as exc:
            raise ValueError(exc.message) from None
        return value

    @field_validator("router_advertise")
    @classmethod
    def _check_advertise(cls, value: str | None) -> str | None:
        if value is None or value == "":
            return None
        host, sep, port = value.rpartition(":")
        if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
            raise ValueError("must be host:port")
        if host.strip("[]") in {"0.0.0.0", "::"}:
            raise ValueError("must be an address other hosts can dial, not a wildcard")
        return value

    @field_validator("log_level")
    @classmethod
    def _check_log_level(cls, value: str) -> str:
        level = value.upper()
        if level not in {"DEBUG", "INFO", "WARNING", "ERROR"}:
            raise ValueError("must be DEBUG, INFO, WARNING or ERROR")
        return level

    # --- derived ---------------------------------------------------------------------------------
    @property
    def embedded(self) -> bool:
        """True when at least one of PostgreSQL / Redis is the embedded server."""
        return self.database_url is None or self.redis_url is None

    @property
    def router_address(self) -> str:
        return self.router_target or f"{_connectable(self.router_host)}:{self.router_port}"

    @property
    def router_advertise_address(self) -> str:
        """Where other hosts reach this router process (nothing needs it since gateways hold tunnels)."""
        return self.router_advertise or f"{_connectable(self.router_host)}:{self.router_port}"

    def gateway_attach_address(self, bound_port: int) -> str:
        """Where platform ends reach this gateway's attach listener, once bound to ``bound_port``."""
        return self.gateway_attach_advertise or f"{_connectable(self.gateway_attach_host)}:{bound_port}"

    @property
    def enrollment_address(self) -> str:
        return self.enrollment_target or f"{_connectable(self.enrollment_host)}:{self.enrollment_port}"

    @property
    def gateway_scheme(self) -> str:
        return "https" if self.gateway_tls else "http"

    @property
    def gateway_url(self) -> str:
        """Where this machine reaches its own gateway."""
        return f"{self.gateway_scheme}://{_connectable(self.gateway_host)}:{self.gateway_port}"

    @property
    def console_url(self) -> str:
        """Where this machine reaches its own console."""
        return f"https://{_connectable(self.console_host)}:{self.console_port}"

    @property
    def public_gateway_url(self) -> str:
        """Where collectors reach the gateway."""
        default = f"{self.gateway_scheme}://{self.gateway_server_name}:{self.gateway_port}"
        return (self.gateway_public_url or default).rstrip("/")


def _connectable(host: str) -> str:
    """A listen address a client can dial: wildcard binds are reached over loopback."""
    if host in {"0.0.0.0", "", "*"}:
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def load_settings(**overrides: Any) -> Settings:
    """Build settings, turning every validation problem into one readable :class:`ConfigError`."""
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            name = ".".join(str(p) for p in err["loc"]) or "settings"
            env = _env_name(name)
            problems.append(f"{env}: {err['msg'].removeprefix('Value error, ')}")
        raise ConfigError("invalid configuration: " + "; ".join(problems)) from None


def _env_name(field: str) -> str:
    if field in {"database_url", "DATABASE_URL"}:
        return "DATABASE_URL"
    if field in {"redis_url", "REDIS_URL"}:
        return "REDIS_URL"
    return f"VERSUS_{field.upper()}"
