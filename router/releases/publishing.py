"""Publishing, listing and yanking collector releases.

A release is one artifact (the collector's PEX file, tools/collector_dist.py) for one version,
os and arch. Publishing streams the artifact to a file beside the update repository, checks
its length and SHA-256 against what the publisher declared, then, in one transaction, records
the row and adds the artifact as a TUF target signed with the release key
(router/releases/update_repo.py). If the transaction fails after the target was written, publishing
the same artifact again completes it (the repository already holds the same bytes).

A release may carry its SBOM (router/releases/sbom.py): checked against the CycloneDX schema, stored with
the row, and signed into the repository as a target of its own in the same targets version as
the artifact, whose custom metadata names the SBOM's target and SHA-256 - so a signature binds
the two.

Yanking removes a version's targets (artifacts and SBOMs) from the signed metadata - collectors
can no longer fetch it, and no policy targets it - and keeps the rows for the record.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import hashlib
import re
import secrets
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy.engine import RowMapping
from sqlalchemy.ext.asyncio import AsyncEngine

from common.errors import FailedPrecondition, InvalidArgument, NotFound, Unavailable
from common.limits import MAX_ARTIFACT_BYTES
from common.telemetry.logs import get_logger
from common.trust.keys import KeySet
from router.core import audit
from router.releases import store as release_store
from router.releases import update_policy
from router.releases.sbom import Sbom, check_sbom
from router.releases.update_repo import UpdateRepository
from router.releases.updates import Updates

log = get_logger("versus.router.releases")

_PLATFORM = re.compile(r"^[a-z0-9_]{1,32}$")
MAX_NOTES_CHARS = 20_000


@dataclass(frozen=True, slots=True)
class Header:
    version: str
    channel: str
    security_fix: bool
    os: str
    arch: str
    notes: str
    length: int
    sha256: str
    sbom: bytes = field(default=b"", repr=False)  # CycloneDX JSON; empty: none


def target_name(header: Header) -> str:
    return f"versus-collector-{header.version}-{header.os}-{header.arch}.pex"


def sbom_target_name(header: Header) -> str:
    return f"versus-collector-{header.version}-{header.os}-{header.arch}.cdx.json"


def check_header(header: Header) -> None:
    """Everything about a release that can be refused before a byte of the artifact arrives."""
    update_policy.parse_version(header.version)
    if header.channel not in update_policy.CHANNELS:
        raise InvalidArgument("channel must be stable or beta", code="channel_invalid")
    for name, value in (("os", header.os), ("arch", header.arch)):
        if not _PLATFORM.match(value):
            raise InvalidArgument(
                f"{name} must be 1-32 of a-z, 0-9 and _ (e.g. linux, x86_64)", code=f"{name}_invalid"
            )
    if len(header.notes) > MAX_NOTES_CHARS:
        raise InvalidArgument(f"notes are at most {MAX_NOTES_CHARS} characters", code="notes_too_long")
    if not 0 < header.length <= MAX_ARTIFACT_BYTES:
        raise InvalidArgument(f"the artifact must be 1-{MAX_ARTIFACT_BYTES} bytes", code="artifact_too_large")
    if not re.fullmatch(r"[0-9a-f]{64}", header.sha256):
        raise InvalidArgument("sha256 must be 64 lowercase hex digits", code="artifact_sha256_invalid")


# A download is read and sent in pieces of this size.
DOWNLOAD_CHUNK = 1024 * 1024


class Releases:
    def __init__(
        self, engine: AsyncEngine, repo: UpdateRepository, keys: Callable[[], KeySet], updates: Updates,
        manifest_url: str = "",
    ):  # fmt: skip
        self.engine = engine
        self.repo = repo
        self.keys = keys
        self.updates = updates
        # Where collectors reach the update repository (shown for a supervisor installed by hand).
        self.manifest_url = manifest_url

    async def artifact(self, version: str, os_name: str, arch: str) -> tuple[RowMapping, Path]:
        """A published, not yanked, artifact of ``version`` for ``os_name``/``arch`` and its file."""
        rows = [r for r in await self.get(version) if (r["os"], r["arch"]) == (os_name, arch)]
        if not rows or rows[0]["yanked_at"] is not None:
            raise NotFound(f"no published release {version!r} for {os_name}/{arch}", code="release_not_found")
        row = rows[0]
        path = self.repo.targets / f"{row['sha256']}.{row['target_name']}"
        if not path.is_file():  # another router published it and this copy has not caught up yet
            raise Unavailable(
                "this router does not hold that artifact yet: try again", code="artifact_not_here"
            )
        return row, path

    async def _receive(self, header: Header, chunks: AsyncIterator[bytes]) -> Path:
        """Write the artifact to a private file, refusing it the moment it is longer than declared."""
        incoming = self.repo.directory / "incoming"
        incoming.mkdir(parents=True, exist_ok=True, mode=0o700)
        path = incoming / f"{secrets.token_hex(8)}.part"
        digest, size = hashlib.sha256(), 0
        try:
            with path.open("wb") as fh:
                async for chunk in chunks:
                    size += len(chunk)
                    if size > header.length:
                        raise InvalidArgument(
                            f"the artifact is longer than the declared {header.length} bytes",
                            code="artifact_length_mismatch",
                        )
                    digest.update(chunk)
                    fh.write(chunk)
            if size != header.length:
                raise InvalidArgument(
                    f"the artifact is {size} bytes, not the declared {header.length}",
                    code="artifact_length_mismatch",
                )
            if digest.hexdigest() != header.sha256:
                raise InvalidArgument(
                    "the artifact's SHA-256 differs from the declared one (corrupted upload?)",
                    code="artifact_sha256_mismatch",
                )
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        return path

    async def publish(self, header: Header, chunks: AsyncIterator[bytes], actor: str) -> Sequence[RowMapping]:
        check_header(header)
        # Schema validation takes about a second: off the event loop, and before the upload.
        sbom = await asyncio.to_thread(check_sbom, header.sbom, header.version) if header.sbom else None
        name = target_name(header)
        artifact = await self._receive(header, chunks)
        custom: dict[str, Any] = {
            "version": header.version, "channel": header.channel, "security_fix": header.security_fix,
            "os": header.os, "arch": header.arch,
        }  # fmt: skip
        row: dict[str, Any] = {
            "version": header.version, "os": header.os, "arch": header.arch, "channel": header.channel,
            "security_fix": header.security_fix, "target_name": name, "length": header.length,
            "sha256": header.sha256, "notes": header.notes, "published_by": actor,
        }  # fmt: skip
        attachments: list[tuple[Path, str, dict[str, Any]]] = []
        if sbom is not None:
            sbom_name = sbom_target_name(header)
            custom["sbom"] = {"target": sbom_name, "sha256": sbom.sha256}
            row.update(self._sbom_columns(sbom, sbom_name))
            sbom_file = artifact.with_suffix(".sbom")
            await asyncio.to_thread(sbom_file.write_bytes, sbom.document)
            attachments.append((sbom_file, sbom_name, {"version": header.version, "sbom_of": name}))
        try:
            async with self.engine.begin() as conn:
                await release_store.insert_release(conn, row)
                held = await asyncio.to_thread(self.repo.released)
                if name in held:
                    if held[name].sha256 != header.sha256 or held[name].custom.get("sbom") != custom.get(
                        "sbom"
                    ):
                        raise FailedPrecondition(
                            f"{name} is already in the update repository with other bytes",
                            code="release_exists",
                        )
                    log.warning("completing a release whose target was written before", target=name)
                else:
                    await asyncio.to_thread(
                        self.repo.publish, self.keys(), artifact, name, custom, dt.datetime.now(dt.UTC),
                        attachments,
                    )  # fmt: skip
                await audit.record(
                    conn, actor, "release.publish", "release", name,
                    {"after": {**custom, "sha256": header.sha256, "length": header.length}},
                )  # fmt: skip
        finally:
            for path in (artifact, *(a[0] for a in attachments)):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
        log.info("release published", target=name, version=header.version, channel=header.channel,
                 security_fix=header.security_fix, sbom=sbom is not None)  # fmt: skip
        await self.updates.reconcile()
        async with self.engine.connect() as conn:
            return [
                r for r in await release_store.get_release(conn, header.version) if r["target_name"] == name
            ]

    @staticmethod
    def _sbom_columns(sbom: Sbom, name: str) -> dict[str, Any]:
        return {
            "sbom": sbom.document, "sbom_target_name": name, "sbom_sha256": sbom.sha256,
            "sbom_length": len(sbom.document), "sbom_spec_version": sbom.spec_version,
            "sbom_components": sbom.components,
        }  # fmt: skip

    async def sboms(self, version: str) -> dict[str, bytes]:
        """The SBOM documents of ``version``'s artifacts, by artifact target name."""
        async with self.engine.connect() as conn:
            return await release_store.sboms(conn, version)

    async def list(self, channel: str, include_yanked: bool) -> Sequence[RowMapping]:
        async with self.engine.connect() as conn:
            return await release_store.list_releases(conn, channel, include_yanked)

    async def get(self, version: str) -> Sequence[RowMapping]:
        async with self.engine.connect() as conn:
            return await release_store.get_release(conn, version)

    async def yank(self, version: str, reason: str, actor: str) -> Sequence[RowMapping]:
        if not reason.strip() or len(reason) > 500:
            raise InvalidArgument("say why (a reason of 1-500 characters)", code="reason_required")
        async with self.engine.begin() as conn:
            await release_store.get_release(conn, version)  # NotFound for an unknown version
            rows = await release_store.yank(conn, version, actor, reason.strip())
            if not rows:
                raise FailedPrecondition(f"release {version} is already yanked", code="release_yanked")
            held = await asyncio.to_thread(self.repo.released)
            keys, now = self.keys(), dt.datetime.now(dt.UTC)
            for row in rows:
                if row["target_name"] in held:
                    also = [row["sbom_target_name"]] if row["sbom_target_name"] else []
                    await asyncio.to_thread(self.repo.remove, keys, row["target_name"], now, also)
                await audit.record(
                    conn, actor, "release.yank", "release", row["target_name"],
                    {"version": version, "reason": reason.strip()},
                )  # fmt: skip
        log.warning("release yanked", version=version, reason=reason.strip())
        await self.updates.reconcile()
        return await self.get(version)
