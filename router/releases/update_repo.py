"""Collector releases as a TUF repository, written with python-tuf's metadata API.

Layout under ``<state>/updates`` (consistent snapshots, as TUF clients expect)::

    metadata/<N>.root.json      every version of root (clients walk them when keys rotate)
    metadata/<N>.targets.json   the releases: one target per artifact, with its version, channel,
                                security flag, os and arch as custom metadata
    metadata/<N>.snapshot.json  which targets version is current (against mix-and-match)
    metadata/timestamp.json     which snapshot is current, short-lived (against freeze)
    targets/<sha256>.<name>     the artifacts, named by their hash

Every role is held by the release key set (common/trust/keystore.py): the keys a
collector pins at enrollment and receives in-band after a rotation are exactly
the keys of root, so a collector's trust in updates starts where its trust in
the control plane does. The newest release key signs; a new root version is
written whenever the release set's keys change, signed by the keys of the
version before and of the new one (as TUF rotates root).

This module only writes files (under an exclusive lock); the gateway serves
them to authenticated collectors and the supervisor reads them with
``tuf.ngclient``.
"""

from __future__ import annotations

import datetime as dt
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from securesystemslib.signer import CryptoSigner, SSlibKey
from tuf.api.metadata import Metadata, MetaFile, Root, Snapshot, TargetFile, Targets, Timestamp
from tuf.api.serialization.json import JSONSerializer

from common.config.state_dir import file_sha256, locked, write_public
from common.errors import FailedPrecondition, InvalidArgument
from common.limits import MAX_ARTIFACT_BYTES
from common.trust.keys import KeySet, SigningKey

ROLES = ("root", "targets", "snapshot", "timestamp")
ROOT_LIFETIME = dt.timedelta(days=365)
TARGETS_LIFETIME = dt.timedelta(days=90)
# Timestamp and snapshot are re-signed by the router well before they expire (refresh()):
# a client cut off from fresh metadata for longer stops trusting what it has (freeze attacks).
TIMESTAMP_LIFETIME = dt.timedelta(days=1)
SNAPSHOT_LIFETIME = dt.timedelta(days=7)
REFRESH_BEFORE = dt.timedelta(hours=12)
_JSON = JSONSerializer(compact=False)


@dataclass(frozen=True, slots=True)
class PublishedTarget:
    name: str
    length: int
    sha256: str
    custom: dict[str, Any]


def tuf_key(key: SigningKey) -> SSlibKey:
    """The release key as TUF names it (its keyid is our kid)."""
    return SSlibKey.from_crypto(key.private_key().public_key(), keyid=key.kid)


def _signer(key: SigningKey) -> CryptoSigner:
    return CryptoSigner(key.private_key(), tuf_key(key))


def _expiry(now: dt.datetime, lifetime: dt.timedelta) -> dt.datetime:
    return (now + lifetime).replace(microsecond=0)


class UpdateRepository:
    """The TUF repository in ``directory``; ``keys()`` is the release key set (reloaded by the caller)."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.metadata = directory / "metadata"
        self.targets = directory / "targets"

    # --- reading -----------------------------------------------------------------------------------
    def exists(self) -> bool:
        return (self.metadata / "timestamp.json").exists()

    def _latest(self, role: str) -> Metadata[Any]:
        if role == "timestamp":
            return Metadata.from_file(str(self.metadata / "timestamp.json"))
        versions = sorted(int(p.name.split(".", 1)[0]) for p in self.metadata.glob(f"*.{role}.json"))
        return Metadata.from_file(str(self.metadata / f"{versions[-1]}.{role}.json"))

    def root_json(self, version: int | None = None) -> bytes:
        """Root metadata as served: version ``version``, or the newest."""
        if version is None:
            return _JSON.serialize(self._latest("root"))
        return (self.metadata / f"{version}.root.json").read_bytes()

    def released(self) -> dict[str, PublishedTarget]:
        """The targets the newest targets metadata lists, by name (none before the repository exists)."""
        if not self.exists():
            return {}
        targets: Metadata[Targets] = self._latest("targets")
        return {
            name: PublishedTarget(
                name, t.length, t.hashes["sha256"], dict(t.unrecognized_fields.get("custom", {}))
            )
            for name, t in targets.signed.targets.items()
        }

    # --- writing -----------------------------------------------------------------------------------
    def ensure(self, keys: KeySet, now: dt.datetime) -> None:
        """Create the repository (root version 1 held by ``keys``), or follow a change of ``keys``
        with a new root version; keep timestamp and snapshot from expiring."""
        with locked(self.directory):
            if not self.exists():
                self._create(keys, now)
                return
            self._follow_keys(keys, now)
            self._refresh(keys, now)

    def publish(
        self,
        keys: KeySet,
        artifact: Path,
        name: str,
        custom: Mapping[str, Any],
        now: dt.datetime,
        attachments: Sequence[tuple[Path, str, Mapping[str, Any]]] = (),
    ) -> PublishedTarget:
        """Add ``artifact`` as target ``name`` with ``custom`` metadata, and each of ``attachments``
        (file, target name, custom metadata: a release's SBOM) beside it, in one new targets,
        snapshot and timestamp version: all are signed together or none is. Refused when a name
        is already published (releases are immutable)."""
        files = [(artifact, name, custom), *attachments]
        for path, target_name, _ in files:
            if "/" in target_name or target_name.startswith(".") or not target_name:
                raise InvalidArgument("a target name is a plain file name", code="release_name_invalid")
            if path.stat().st_size > MAX_ARTIFACT_BYTES:
                raise InvalidArgument(
                    f"the artifact is over {MAX_ARTIFACT_BYTES} bytes", code="artifact_too_large"
                )
        with locked(self.directory):
            if not self.exists():
                self._create(keys, now)
            self._follow_keys(keys, now)
            targets: Metadata[Targets] = self._latest("targets")
            for _, target_name, _ in files:
                if target_name in targets.signed.targets:
                    raise FailedPrecondition(f"{target_name} is already published", code="release_exists")
            published = []
            for path, target_name, meta in files:
                published.append(self._store(path, target_name, meta))
                targets.signed.targets[target_name] = TargetFile(
                    published[-1].length, {"sha256": published[-1].sha256}, target_name,
                    unrecognized_fields={"custom": dict(meta)},
                )  # fmt: skip
            self._release_targets(keys, targets, now)
            return published[0]

    def _store(self, path: Path, name: str, custom: Mapping[str, Any]) -> PublishedTarget:
        """Copy a target's file in under its hash (written whole, then renamed into place)."""
        digest, size = file_sha256(path), path.stat().st_size
        self.targets.mkdir(parents=True, exist_ok=True)
        stored = self.targets / f"{digest}.{name}"
        shutil.copyfile(path, stored.with_suffix(stored.suffix + ".part"))
        stored.with_suffix(stored.suffix + ".part").replace(stored)
        return PublishedTarget(name, size, digest, dict(custom))

    def remove(self, keys: KeySet, name: str, now: dt.datetime, also: Sequence[str] = ()) -> None:
        """Stop listing target ``name`` (a yanked release), and those of ``also`` that are listed
        (its SBOM), in one new targets version: clients can no longer fetch them."""
        with locked(self.directory):
            targets: Metadata[Targets] = self._latest("targets")
            if targets.signed.targets.pop(name, None) is None:
                raise FailedPrecondition(f"{name} is not published", code="release_not_found")
            for other in also:
                targets.signed.targets.pop(other, None)
            self._follow_keys(keys, now)
            self._release_targets(keys, targets, now)

    # --- internals ---------------------------------------------------------------------------------
    def _create(self, keys: KeySet, now: dt.datetime) -> None:
        root = Metadata(Root(expires=_expiry(now, ROOT_LIFETIME), consistent_snapshot=True))
        for key in keys.keys:
            for role in ROLES:
                root.signed.add_key(tuf_key(key), role)
        targets = Metadata(Targets(expires=_expiry(now, TARGETS_LIFETIME)))
        snapshot = Metadata(Snapshot(expires=_expiry(now, SNAPSHOT_LIFETIME)))
        timestamp = Metadata(Timestamp(expires=_expiry(now, TIMESTAMP_LIFETIME)))
        for meta in (root, targets, snapshot, timestamp):
            meta.sign(_signer(keys.current), append=True)
        self.metadata.mkdir(parents=True, exist_ok=True)
        self._write(root, targets, snapshot, timestamp)

    def _follow_keys(self, keys: KeySet, now: dt.datetime) -> None:
        """A new root version when the release set's keys differ from root's."""
        root: Metadata[Root] = self._latest("root")
        held = set(root.signed.roles["root"].keyids)
        wanted = {k.kid for k in keys.keys}
        if held == wanted:
            return
        for kid in held - wanted:
            for role in ROLES:
                root.signed.revoke_key(kid, role)
        for key in keys.keys:
            if key.kid not in held:
                for role in ROLES:
                    root.signed.add_key(tuf_key(key), role)
        root.signed.version += 1
        root.signed.expires = _expiry(now, ROOT_LIFETIME)
        root.signatures.clear()
        # Clients require the threshold of the version before and of this one. The release set
        # changes one key at a time (a rotation adds one, a retirement drops one), so the keys of
        # the new set always include a key of the old root - provided every change is followed
        # here before the next: `versus-cp keys rotate|retire` call ensure() right after.
        for key in keys.keys:
            root.sign(_signer(key), append=True)
        self._write(root)
        # Everything else is signed again by the set's current key: a key that left root no longer
        # counts, and clients drop timestamp and snapshot they hold when those roles' keys change
        # (which is how they recover from a fast-forward attack with a compromised key).
        self._release_targets(keys, self._latest("targets"), now)

    def _release_targets(self, keys: KeySet, targets: Metadata[Targets], now: dt.datetime) -> None:
        targets.signed.version += 1
        targets.signed.expires = _expiry(now, TARGETS_LIFETIME)
        targets.signatures.clear()
        targets.sign(_signer(keys.current))
        snapshot: Metadata[Snapshot] = self._latest("snapshot")
        snapshot.signed.meta["targets.json"] = MetaFile(version=targets.signed.version)
        self._write(targets)
        self._bump(keys, snapshot, now)

    def _refresh(self, keys: KeySet, now: dt.datetime) -> None:
        timestamp: Metadata[Timestamp] = self._latest("timestamp")
        snapshot: Metadata[Snapshot] = self._latest("snapshot")
        if min(timestamp.signed.expires, snapshot.signed.expires) - now < REFRESH_BEFORE:
            self._bump(keys, snapshot, now)

    def _bump(self, keys: KeySet, snapshot: Metadata[Snapshot], now: dt.datetime) -> None:
        snapshot.signed.version += 1
        snapshot.signed.expires = _expiry(now, SNAPSHOT_LIFETIME)
        snapshot.signatures.clear()
        snapshot.sign(_signer(keys.current))
        timestamp: Metadata[Timestamp] = self._latest("timestamp")
        timestamp.signed.snapshot_meta = MetaFile(version=snapshot.signed.version)
        timestamp.signed.version += 1
        timestamp.signed.expires = _expiry(now, TIMESTAMP_LIFETIME)
        timestamp.signatures.clear()
        timestamp.sign(_signer(keys.current))
        # Snapshot before timestamp: a client that sees the new timestamp finds what it names.
        self._write(snapshot)
        self._write(timestamp)

    def _write(self, *metas: Metadata[Any]) -> None:
        for meta in metas:
            name = (
                "timestamp.json"
                if meta.signed.type == "timestamp"
                else f"{meta.signed.version}.{meta.signed.type}.json"
            )
            write_public(self.metadata / name, _JSON.serialize(meta))
