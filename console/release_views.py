"""Collector releases as the console shows them, and the conversion from the fleet API's
messages (the edge: pages never see protobuf)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from versus.fleet.v1 import fleet_pb2 as pb

from console.views import timestamp

CHANNELS = {"stable": pb.CHANNEL_STABLE, "beta": pb.CHANNEL_BETA}
CHANNEL_NAMES = {v: k for k, v in CHANNELS.items()}


@dataclass(frozen=True)
class ReleaseView:
    version: str
    channel: str
    security_fix: bool
    platform: str
    size: str
    sha256: str
    published_at: str
    published_by: str
    running_count: int
    yanked: bool
    yanked_at: str
    yanked_by: str
    yank_reason: str
    notes: str
    sbom: str  # what the signed SBOM says in a few words, or "none"


def sbom_summary(r: pb.Release) -> str:
    """What a release's signed SBOM is, in a few words ("none" without one)."""
    if not r.sbom_target_name:
        return "none"
    noun = "component" if r.sbom_components == 1 else "components"
    return f"CycloneDX {r.sbom_spec_version}, {r.sbom_components} {noun}"


def release_view(r: pb.Release) -> ReleaseView:
    return ReleaseView(
        version=r.version, channel=CHANNEL_NAMES.get(r.channel, "?"), security_fix=r.security_fix,
        platform=f"{r.os}/{r.arch}", size=f"{r.length / 1048576:.1f} MiB", sha256=r.sha256,
        published_at=timestamp(r.published_at), published_by=r.published_by, running_count=r.running_count,
        yanked=r.yanked, yanked_at=timestamp(r.yanked_at), yanked_by=r.yanked_by, yank_reason=r.yank_reason,
        notes=r.notes,
        sbom=sbom_summary(r),
    )  # fmt: skip


@dataclass(frozen=True)
class Upload:
    """A release to publish, as the form gave it (the artifact is streamed from ``path``)."""

    version: str
    channel: str
    security_fix: bool
    os: str
    arch: str
    notes: str
    sbom: bytes = field(default=b"", repr=False)  # the artifact's CycloneDX SBOM, when one was chosen


@dataclass(frozen=True)
class Bundle:
    version: str
    channel: str
    security_fix: bool
    os: str
    arch: str
    target_name: str
    size: str
    sha256: str
    published_at: str
    published_s: int
    latest: bool = False


def bundle(r: pb.Release) -> Bundle:
    return Bundle(
        r.version, CHANNEL_NAMES.get(r.channel, "?"), r.security_fix, r.os, r.arch, r.target_name,
        f"{r.length / 1048576:.1f} MiB", r.sha256, timestamp(r.published_at), r.published_at.seconds,
    )  # fmt: skip


def bundles(releases: list[Bundle]) -> list[Bundle]:
    """Every published artifact, newest first per platform; the newest stable one of each platform
    is marked latest (a platform with only beta releases: its newest)."""
    latest: dict[tuple[str, str], Bundle] = {}
    for b in releases:
        best = latest.get((b.os, b.arch))
        if best is None or (b.channel == "stable", b.published_s) > (
            best.channel == "stable",
            best.published_s,
        ):
            latest[(b.os, b.arch)] = b
    ordered = sorted(releases, key=lambda b: (b.os, b.arch, -b.published_s))
    return [replace(b, latest=latest[(b.os, b.arch)] is b) for b in ordered]
