"""Where processes find their API token: settings first, then a 0600 file in the state directory.

`versus-cp up` writes two files on first start: ``service-token`` (the
gateway's token for internal calls) and ``admin-token`` (the bootstrap
collector-admin token, also shown once on the terminal). A token file readable
by group or others is refused, as ssh refuses a loose private key.
"""

from __future__ import annotations

import os
from pathlib import Path

from common.errors import ConfigError, Unauthenticated
from common.settings import Settings

# File names, not secrets.
SERVICE_TOKEN_FILE = "service-token"  # noqa: S105
ADMIN_TOKEN_FILE = "admin-token"  # noqa: S105


def write(path: Path, token: str) -> None:
    """Create ``path`` with mode 0600 (replacing an older file) holding ``token``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    os.replace(tmp, path)


def read(path: Path) -> str | None:
    """The token in ``path``, None if there is no such file; refuses a file others can read."""
    try:
        mode = path.stat().st_mode & 0o777
    except FileNotFoundError:
        return None
    if mode & 0o077:
        raise ConfigError(f"{path} is readable by others (mode {mode:o}); run `chmod 600 {path}`")
    token = path.read_text().strip()
    return token or None


def service_token(settings: Settings) -> str:
    """The token the gateway presents to the internal services."""
    if settings.service_token is not None:
        return settings.service_token.get_secret_value()
    token = read(settings.state_dir / SERVICE_TOKEN_FILE)
    if token is None:
        raise ConfigError(
            "no service token: set VERSUS_SERVICE_TOKEN (create one with "
            "`versus-cp access create NAME --role service`), or start with `versus-cp up`"
        )
    return token


def operator_token(settings: Settings) -> str:
    """The token `versus-cp` operator commands present."""
    if settings.api_token is not None:
        return settings.api_token.get_secret_value()
    path = settings.api_token_file or settings.state_dir / ADMIN_TOKEN_FILE
    token = read(path)
    if token is None:
        # Not authenticated (exit 3), like a token the service refuses: not a configuration error.
        raise Unauthenticated(
            f"no API token: set VERSUS_API_TOKEN or VERSUS_API_TOKEN_FILE (looked in {path})",
            code="api_token_missing",
        )
    return token
