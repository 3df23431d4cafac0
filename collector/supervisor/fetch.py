"""Download and verify a release with python-tuf's ``ngclient``, trusting only the pinned release keys.

The update repository's root is held by the release key set
(router/releases/update_repo.py), which the collector pinned at enrollment and follows
in-band (collector/key_sets.py). The first time, the supervisor looks for the
newest root version whose root keys are all pinned - same key ids *and* same
public key bytes - and signed by them, checks the operator's ``--update-pubkey``
is one of them, and hands it to ngclient as the trusted root; from then on
ngclient keeps its own trusted metadata (``<state>/tuf/``) and walks root
rotations itself. ngclient refuses a bad signature, too few signatures, a
rollback of any role's version, expired metadata, a snapshot that does not
match, and a target whose length or hash differs; the fetcher bounds every
download in time (collector/update_fetcher.py).

Bounds on the whole, not only per file: the root walk reads at most
:data:`MAX_ROOT_VERSIONS` versions within ``bootstrap_timeout_s``, and one attempt
(walk, refresh and download) ends within ``timeout_s``; every document the walk
reads must be a root document before anything of it is used (a signed targets
document served as ``1.root.json`` is refused with ``update_root_invalid``).

The signed config names the target's name, version, length and SHA-256; the
TUF targets metadata must agree on all four, so neither the gateway nor a stale
config can swap one release for another.
"""

from __future__ import annotations

import base64
import binascii
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric import ec
from tuf.api import exceptions
from tuf.api.metadata import Metadata, Root
from tuf.ngclient import Updater
from tuf.ngclient.fetcher import FetcherInterface

from collector.update_fetcher import Cancel, GatewayFetcher
from common.trust.keys import PublicKey

MAX_ROOT_BYTES = 512_000
MAX_ROOT_VERSIONS = 1024
# One update attempt, whole (supervise --update-timeout), and its first root walk (--bootstrap-timeout).
ATTEMPT_TIMEOUT_S = 1800.0
BOOTSTRAP_TIMEOUT_S = 300.0


class UpdateError(Exception):
    """A release that cannot be installed; ``code`` is stable and reported to the control plane."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class Target:
    """The upgrade target as the signed config names it."""

    version: str
    name: str
    sha256: str
    length: int

    @classmethod
    def from_config(cls, update: Mapping[str, Any]) -> Target:
        try:
            return cls(
                str(update["version"]), str(update["target"]), str(update["sha256"]), int(update["length"])
            )
        except (KeyError, TypeError, ValueError):
            raise UpdateError("target_malformed", "the config's update target is malformed") from None


def _root_keys_pinned(root: Metadata[Root], pinned: Mapping[str, PublicKey]) -> bool:
    """Every key of the root role is pinned (same id and bytes) and enough of them signed it."""
    role = root.signed.roles["root"]
    for keyid in role.keyids:
        held = pinned.get(keyid)
        key = root.signed.keys.get(keyid)
        if held is None or key is None or bytes.fromhex(str(key.keyval.get("public", ""))) != held.public:
            return False
    try:
        root.signed.verify_delegate("root", root.signed_bytes, root.signatures)
    except exceptions.UnsignedMetadataError:
        return False
    return True


def anchor_matches(root: Metadata[Root], anchor: str) -> bool:
    """``anchor`` (a key id, or the base64 or hex of an Ed25519 public key) is a key of the root role."""
    for keyid in root.signed.roles["root"].keyids:
        public = str(root.signed.keys[keyid].keyval.get("public", ""))
        if anchor in (keyid, public):
            return True
        try:
            if base64.b64decode(anchor, validate=True).hex() == public:
                return True
        except (binascii.Error, ValueError):
            continue
    return False


class ReleaseFetcher:
    def __init__(
        self,
        metadata_dir: Path,
        metadata_url: str,
        download_dir: Path,
        context: ssl.SSLContext,
        key: ec.EllipticCurvePrivateKey,
        collector_id: str,
        pinned: Mapping[str, PublicKey],
        anchor: str,
        fetcher: FetcherInterface | None = None,
        *,
        timeout_s: float = ATTEMPT_TIMEOUT_S,
        bootstrap_timeout_s: float = BOOTSTRAP_TIMEOUT_S,
        cancelled: Cancel | None = None,
    ):
        if not metadata_url.endswith("/metadata/"):
            raise UpdateError("manifest_url_invalid", "--manifest-url must end in /updates/metadata/")
        self.metadata_dir = metadata_dir
        self.metadata_url = metadata_url
        self.targets_url = metadata_url[: -len("metadata/")] + "targets/"
        self.download_dir = download_dir
        self.cancelled = cancelled or Cancel()
        self.fetcher = fetcher or GatewayFetcher(context, key, collector_id, cancelled=self.cancelled)
        self.pinned = pinned
        self.anchor = anchor
        self.timeout_s = timeout_s
        self.bootstrap_timeout_s = bootstrap_timeout_s

    def close(self) -> None:
        if isinstance(self.fetcher, GatewayFetcher):
            self.fetcher.close()

    def _limit(self, not_after: float) -> None:
        """Every later request of this attempt ends by ``not_after`` (time.monotonic())."""
        if isinstance(self.fetcher, GatewayFetcher):
            self.fetcher.not_after = not_after

    def _check_time(self, not_after: float, code: str, what: str) -> None:
        if self.cancelled.is_set():
            raise UpdateError("update_cancelled", "the update attempt was cancelled")
        if time.monotonic() >= not_after:
            raise UpdateError(code, what)

    def _bootstrap(self, attempt_ends: float) -> bytes | None:
        """The trusted root for a first run; None when ngclient already keeps one."""
        if (self.metadata_dir / "root.json").exists():
            return None
        walk_ends = min(attempt_ends, time.monotonic() + self.bootstrap_timeout_s)
        self._limit(walk_ends)
        best: bytes | None = None
        for version in range(1, MAX_ROOT_VERSIONS + 1):
            self._check_time(
                walk_ends, "update_bootstrap_timeout",
                f"the root walk read {version - 1} versions in its {self.bootstrap_timeout_s:.0f} s",
            )  # fmt: skip
            try:
                raw = self.fetcher.download_bytes(f"{self.metadata_url}{version}.root.json", MAX_ROOT_BYTES)
            except exceptions.DownloadHTTPError as exc:
                if exc.status_code == 404:
                    break
                raise
            except exceptions.SlowRetrievalError:
                self._check_time(walk_ends, "update_bootstrap_timeout", "the root walk ran out of time")
                raise
            document = Metadata.from_bytes(raw)
            if not isinstance(document.signed, Root):
                raise UpdateError(
                    "update_root_invalid",
                    f"version {version} of the root is a {type(document.signed).__name__.lower()} document",
                )
            root: Metadata[Root] = document  # a root: checked just above
            if root.signed.version == version and _root_keys_pinned(root, self.pinned):
                best = raw
        if best is None:
            raise UpdateError(
                "update_root_not_pinned",
                "no version of the update repository's root is held by the pinned release keys",
            )
        if not anchor_matches(Metadata[Root].from_bytes(best), self.anchor):
            raise UpdateError(
                "update_pubkey_not_trusted", "--update-pubkey is not a key of the update repository's root"
            )
        return best

    def fetch(self, target: Target) -> Path:
        """Download and verify ``target``; returns the verified file. Raises :class:`UpdateError`."""
        self.metadata_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.download_dir.mkdir(parents=True, exist_ok=True, mode=0o750)
        attempt_ends = time.monotonic() + self.timeout_s
        try:
            bootstrap = self._bootstrap(attempt_ends)
            self._limit(attempt_ends)
            updater = Updater(
                str(self.metadata_dir), self.metadata_url, str(self.download_dir), self.targets_url,
                fetcher=self.fetcher, bootstrap=bootstrap,
            )  # fmt: skip
            updater.refresh()
            info = updater.get_targetinfo(target.name)
            if info is None:
                raise UpdateError(
                    "release_not_listed", f"{target.name} is not in the signed targets (yanked?)"
                )
            custom = info.unrecognized_fields.get("custom", {})
            if (
                custom.get("version") != target.version
                or info.hashes.get("sha256") != target.sha256
                or info.length != target.length
            ):
                raise UpdateError(
                    "release_mismatch", f"the signed targets and the config disagree about {target.name}"
                )
            cached = updater.find_cached_target(info)
            return Path(cached or updater.download_target(info))
        except exceptions.RepositoryError as exc:
            raise UpdateError("update_metadata_refused", f"{type(exc).__name__}: {exc}") from None
        except exceptions.DownloadError as exc:
            self._check_time(
                attempt_ends, "update_timeout", f"the attempt ran out of its {self.timeout_s:.0f} s"
            )
            raise UpdateError("update_download_failed", f"{type(exc).__name__}: {exc}") from None
