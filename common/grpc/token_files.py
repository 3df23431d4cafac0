"""Where processes find their API token: settings first, then a 0600 file in the state directory.

`versus-cp up` writes two files on first start: ``service-token`` (the
gateway's token for internal calls) and ``admin-token`` (the bootstrap
collector-admin token, also shown once on the terminal). A token file readable
by group or others is refused, as ssh refuses a loose private key.

The gateway reads its service token per call (:func:`service_token` returns a
source, re-read when the file changes), so an operator rotates it by writing a
new token into the file (atomically, mode 0600) and revoking the old one: no
restart. A token given in the environment is fixed for the process's life.
"""

from __future__ import annotations

import os
from pathlib import Path

from common.config.settings import Settings
from common.config.watched_file import FileRefused, WatchedFile, private_only
from common.errors import ConfigError, Unauthenticated
from common.grpc.client import Token

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


def _parse_token(raw: bytes) -> str:
    token = raw.decode().strip()
    if not token:
        raise ValueError("the token file is empty")
    return token


def read(path: Path) -> str | None:
    """The token in ``path``, None if there is no such file; refuses a file others can read."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    try:
        private_only(path, st)
    except FileRefused as exc:
        raise ConfigError(str(exc)) from None
    token = path.read_text().strip()
    return token or None


class TokenFile:
    """A token read from a 0600 file at every use, re-parsed only when the file changed.

    A replacement that is empty, unreadable or loosely permitted keeps the last
    good token (and is logged); a removed file is an error at the next call.
    """

    def __init__(self, path: Path):
        self._file: WatchedFile[str | None] = WatchedFile(path, _parse_token, None, private_only)
        try:
            first = self._file.get()
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if first is None:
            raise ConfigError(
                "no service token: set VERSUS_SERVICE_TOKEN (create one with "
                "`versus-cp access create NAME --role service`), or start with `versus-cp up`"
            )

    def __repr__(self) -> str:
        return f"TokenFile({str(self._file.path)!r})"

    def __call__(self) -> str:
        token = self._file.get()
        if token is None:
            raise Unauthenticated(f"the token file {self._file.path} was removed", code="api_token_missing")
        return token


def service_token(settings: Settings) -> Token:
    """What the gateway presents to the internal services: fixed from the environment, else the file."""
    if settings.service_token is not None:
        return settings.service_token.get_secret_value()
    return TokenFile(settings.state_dir / SERVICE_TOKEN_FILE)


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
