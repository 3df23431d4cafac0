"""Audit export settings (``VERSUS_AUDIT_*``), read by the router: which sinks, and how.

| Setting | Meaning | Default |
|---|---|---|
| ``VERSUS_AUDIT_FILE`` | JSON lines to this file (CloudEvents) | none |
| ``VERSUS_AUDIT_FILE_MAX_BYTES`` / ``_BACKUPS`` | rotation: a file's size, files kept | 100 MiB / 10 |
| ``VERSUS_AUDIT_SYSLOG`` | ``host:port`` of an RFC 5424 receiver over TLS (RFC 5425) | none |
| ``VERSUS_AUDIT_SYSLOG_CA_FILE`` | CA the receiver's certificate is checked against | system roots |
| ``VERSUS_AUDIT_WEBHOOK_URL`` | ``https://`` URL each batch is POSTed to | none |
| ``VERSUS_AUDIT_WEBHOOK_SECRET_FILE`` | the HMAC-SHA256 key (required with the URL) | none |
| ``VERSUS_AUDIT_WEBHOOK_CA_FILE`` | CA the webhook's certificate is checked against | system roots |
| ``VERSUS_AUDIT_SOURCE`` | first segment of each event's ``source`` (``/<it>/<service>``) | ``versus`` |
| ``VERSUS_AUDIT_BATCH`` | most events per delivery | 200 |
"""

from __future__ import annotations

import ssl
from pathlib import Path

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from common.errors import ConfigError
from router.audit_export.sinks import FileSink, Sink, SyslogSink, WebhookSink

INVALID = "audit_export_invalid"


class AuditExportSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="VERSUS_AUDIT_", frozen=True)

    file: Path | None = None
    file_max_bytes: int = Field(default=100 * 1024 * 1024, ge=1024 * 1024, le=2**40)
    file_backups: int = Field(default=10, ge=0, le=1000)
    syslog: str | None = Field(default=None, pattern=r"^[A-Za-z0-9.\-\[\]:]+:[0-9]{1,5}$")
    syslog_ca_file: Path | None = None
    webhook_url: str | None = Field(default=None, pattern=r"^https://\S+$")
    webhook_secret_file: Path | None = None
    webhook_ca_file: Path | None = None
    source: str = Field(default="versus", pattern=r"^[A-Za-z0-9._-]{1,64}$")
    batch: int = Field(default=200, ge=1, le=5000)

    @field_validator("syslog")
    @classmethod
    def _port(cls, value: str | None) -> str | None:
        if value is not None and not 0 < int(value.rsplit(":", 1)[1]) < 65536:
            raise ValueError("the port must be in 1..65535")
        return value


def load() -> AuditExportSettings:
    """The settings, every problem one :class:`ConfigError` (the router refuses to start)."""
    try:
        settings = AuditExportSettings()
    except ValidationError as exc:
        problems = "; ".join(
            f"VERSUS_AUDIT_{'.'.join(str(p) for p in e['loc']).upper()}: {e['msg']}" for e in exc.errors()
        )
        raise ConfigError(f"invalid audit export configuration: {problems}", code=INVALID) from None
    if settings.webhook_url and settings.webhook_secret_file is None:
        raise ConfigError(
            "VERSUS_AUDIT_WEBHOOK_URL needs VERSUS_AUDIT_WEBHOOK_SECRET_FILE (its deliveries are signed)",
            code=INVALID,
        )
    return settings


def sinks(settings: AuditExportSettings) -> list[Sink]:
    """The sinks the settings name (none: nothing leaves; the audit log stays in PostgreSQL)."""
    out: list[Sink] = []
    if settings.file is not None:
        out.append(FileSink(settings.file, settings.file_max_bytes, settings.file_backups))
    if settings.syslog is not None:
        host, port = settings.syslog.rsplit(":", 1)
        out.append(SyslogSink(host.strip("[]"), int(port), _context(settings.syslog_ca_file)))
    if settings.webhook_url is not None:
        assert settings.webhook_secret_file is not None
        try:
            secret = settings.webhook_secret_file.read_bytes().strip()
        except OSError as exc:
            raise ConfigError(
                f"VERSUS_AUDIT_WEBHOOK_SECRET_FILE: cannot read {settings.webhook_secret_file}: "
                f"{exc.strerror}",
                code=INVALID,
            ) from None
        if len(secret) < 16:
            raise ConfigError(
                "VERSUS_AUDIT_WEBHOOK_SECRET_FILE: the secret must be at least 16 bytes",
                code=INVALID,
            )
        context = _context(settings.webhook_ca_file) if settings.webhook_ca_file else None
        out.append(WebhookSink(settings.webhook_url, secret, context))
    return out


def _context(ca_file: Path | None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(ca_file) if ca_file else None)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context
