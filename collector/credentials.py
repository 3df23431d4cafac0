"""Device credentials in vault mode A: sealed on the collector's disk, re-read whenever they change.

The credentials live in ``<state>/credentials.sealed``, encrypted under a key derived from the
collector's identity (collector/sealed.py); never in plaintext. Operators change them with
``versus-collector credentials set|rm|list`` (collector/credentials_cli.py), which rewrites the
sealed file atomically: the next task sees the new content, a task already running keeps the
snapshot it started with. A sealed file that does not open (altered, or another collector's) or
that others can read is refused: the collector logs it and keeps the last good content; at start
it is an error.

**Migration.** A plaintext ``credentials.json`` (the format before sealing, or a whole new set an
operator drops in, as before sealing existed) replaces the sealed content and is then removed: at
start, and whenever one appears while the collector runs.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric import ec

from collector.sealed import SealedError, seal, unseal
from common.config.state_dir import write_private
from common.config.watched_file import WatchedFile, private_only
from common.telemetry.logs import get_logger

log = get_logger("versus.collector")

FILE_NAME = "credentials.sealed"
PLAIN_NAME = "credentials.json"

Credentials = Mapping[str, Any]
NONE: Credentials = {}


def _parse_plain(raw: bytes) -> dict[str, Any]:
    value = json.loads(raw)
    if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
        raise ValueError(f"{PLAIN_NAME} must hold a JSON object of providers, each an object of devices")
    return value


def read_sealed(state_dir: Path, identity: ec.EllipticCurvePrivateKey) -> dict[str, Any]:
    """The sealed credentials ({} when there are none yet); :class:`SealedError` when they do not open."""
    path = state_dir / FILE_NAME
    if not path.exists():
        return {}
    private_only(path, path.stat())
    return unseal(identity, path.read_bytes())


def write_sealed(state_dir: Path, identity: ec.EllipticCurvePrivateKey, credentials: Credentials) -> None:
    """Seal ``credentials`` and replace the file atomically (mode 0600)."""
    write_private(state_dir / FILE_NAME, seal(identity, credentials))


def migrate_plaintext(state_dir: Path, identity: ec.EllipticCurvePrivateKey) -> bool:
    """Seal a plaintext ``credentials.json`` in place of the sealed content and remove it; whether
    there was one."""
    plain = state_dir / PLAIN_NAME
    if not plain.exists():
        return False
    private_only(plain, plain.stat())
    entries = _parse_plain(plain.read_bytes())
    write_sealed(state_dir, identity, entries)
    plain.unlink()
    log.warning("plaintext credentials sealed and removed", file=str(plain),
                devices=sum(len(d) for d in entries.values()))  # fmt: skip
    return True


class LocalCredentials:
    """The current sealed credentials; call it to take a snapshot."""

    def __init__(self, state_dir: Path, identity: ec.EllipticCurvePrivateKey):
        self._state_dir = state_dir
        self._identity = identity
        try:
            migrate_plaintext(state_dir, identity)
        except SealedError as exc:
            raise ValueError(f"credentials: {exc.code}: {exc}") from None
        except (OSError, ValueError) as exc:
            raise ValueError(f"credentials: {exc}") from None
        self._file: WatchedFile[Credentials] = WatchedFile(
            state_dir / FILE_NAME, lambda raw: unseal(identity, raw), NONE, private_only
        )
        # A bad file at start is an error the operator sees at once. The collector does not run
        # without its credentials: it goes offline, so the site's work is placed on collectors
        # that can do it instead of failing here task after task.
        try:
            self._file.get()
        except SealedError as exc:
            raise ValueError(f"credentials: {exc.code}: {exc}") from None

    def __repr__(self) -> str:  # the content is secret
        return f"LocalCredentials({str(self._file.path)!r})"

    def __call__(self) -> Credentials:
        if (self._state_dir / PLAIN_NAME).exists():
            try:
                migrate_plaintext(self._state_dir, self._identity)
            except (OSError, SealedError, ValueError) as exc:
                log.error("plaintext credentials not sealed; keeping the sealed ones", reason=str(exc))
        return self._file.get()

    @property
    def reloads(self) -> int:
        return self._file.reloads


def no_credentials() -> Credentials:
    """What drivers see in vault modes B and C, where the local file is not read."""
    return NONE
