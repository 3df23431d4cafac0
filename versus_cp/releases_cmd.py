"""Collector releases (served by the router's FleetService; docs/upgrades.md):

    versus-cp releases publish --version V --channel stable|beta [--security] --artifact FILE
                               --os linux --arch x86_64 [--notes FILE] [--sbom FILE | --no-sbom]
    versus-cp releases list [--channel stable|beta] [--all]
    versus-cp releases show VERSION [--sbom-out FILE|- [--platform OS/ARCH]]
    versus-cp releases yank VERSION --reason TEXT

The artifact is the collector's PEX file (``make collector-release``). It is
streamed to the router in 1 MiB messages with its length and SHA-256, which
the router checks before it signs the release into the update repository.
Its SBOM (the ``.cdx.json`` file ``make collector-release`` writes beside it,
found there unless ``--sbom`` names another) goes in the header; publishing
without one takes an explicit ``--no-sbom``. Every command takes ``--json``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from versus.fleet.v1 import fleet_pb2 as pb
from versus.fleet.v1 import fleet_pb2_grpc

from common.config.settings import Settings
from common.config.state_dir import file_sha256
from common.errors import InvalidArgument
from common.limits import MAX_ARTIFACT_BYTES, MAX_SBOM_BYTES
from versus_cp import rpc
from versus_cp.output import fields, print_json, print_table, when

CHANNELS = {"stable": pb.CHANNEL_STABLE, "beta": pb.CHANNEL_BETA}
_CHANNEL_NAMES = {v: k for k, v in CHANNELS.items()}
CHUNK_BYTES = 1 << 20
MAX_NOTES_BYTES = 20_000


def _call(settings: Settings, method: str, request: Any, timeout_s: float = rpc.TIMEOUT_S) -> Any:
    return rpc.call(
        settings, settings.router_address, fleet_pb2_grpc.FleetServiceStub, method, request, timeout_s
    )


def upload_timeout_s(length: int) -> float:
    """A minute, plus a second per MiB (an upload at 1 MiB/s still finishes)."""
    return 60.0 + length / CHUNK_BYTES


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    publish = sub.add_parser("publish", help="Register a release and sign it into the update repository.")
    publish.add_argument("--version", required=True, help="PEP 440 version, e.g. 0.4.15")
    publish.add_argument("--channel", choices=list(CHANNELS), required=True)
    publish.add_argument("--security", action="store_true", help="a security fix: auto sites take it at once")
    publish.add_argument("--artifact", type=Path, required=True, help="the PEX file (make collector-release)")
    publish.add_argument("--os", required=True, help="e.g. linux")
    publish.add_argument("--arch", required=True, help="e.g. x86_64")
    publish.add_argument("--notes", type=Path, help="file with the release notes")
    sbom = publish.add_mutually_exclusive_group()
    sbom.add_argument(
        "--sbom", type=Path, help="the artifact's CycloneDX SBOM (default: <artifact>.cdx.json)"
    )
    sbom.add_argument("--no-sbom", action="store_true", help="publish without an SBOM")
    listing = sub.add_parser("list", help="List releases, newest first.")
    listing.add_argument("--channel", choices=list(CHANNELS))
    listing.add_argument("--all", action="store_true", help="include yanked releases")
    show = sub.add_parser("show", help="One version: its artifacts, hashes, notes and who runs it.")
    show.add_argument("version")
    show.add_argument("--sbom-out", metavar="FILE", help="write the SBOM document to FILE (- for stdout)")
    show.add_argument(
        "--platform", metavar="OS/ARCH", help="the artifact whose SBOM to write (several built)"
    )
    yank = sub.add_parser("yank", help="Withdraw a version: no collector fetches or is sent to it again.")
    yank.add_argument("version")
    yank.add_argument("--reason", required=True)
    for p in (publish, listing, show, yank):
        p.add_argument("--json", action="store_true")


def publish_messages(header: pb.ReleaseHeader, artifact: Path) -> Iterator[pb.PublishReleaseRequest]:
    """The header, then the artifact in chunks (what PublishRelease streams)."""
    yield pb.PublishReleaseRequest(header=header)
    with artifact.open("rb") as fh:
        for block in iter(lambda: fh.read(CHUNK_BYTES), b""):
            yield pb.PublishReleaseRequest(chunk=block)


def _header(args: argparse.Namespace) -> pb.ReleaseHeader:
    artifact: Path = args.artifact
    if not artifact.is_file():
        raise InvalidArgument(f"{artifact} is not a file", code="artifact_not_found")
    size = artifact.stat().st_size
    if size > MAX_ARTIFACT_BYTES:
        raise InvalidArgument(f"the artifact is over {MAX_ARTIFACT_BYTES} bytes", code="artifact_too_large")
    sbom = b""
    if not args.no_sbom:
        path: Path = args.sbom or artifact.with_name(artifact.name.removesuffix(".pex") + ".cdx.json")
        if not path.is_file():
            raise InvalidArgument(
                f"no SBOM at {path}: name it with --sbom, or publish without one with --no-sbom",
                code="sbom_missing",
            )
        if path.stat().st_size > MAX_SBOM_BYTES:
            raise InvalidArgument(f"the SBOM is over {MAX_SBOM_BYTES} bytes", code="sbom_too_large")
        sbom = path.read_bytes()
    notes = ""
    if args.notes is not None:
        raw = args.notes.read_bytes()
        if len(raw) > MAX_NOTES_BYTES:
            raise InvalidArgument(f"notes are at most {MAX_NOTES_BYTES} bytes", code="notes_too_long")
        notes = raw.decode("utf-8", errors="replace")
    return pb.ReleaseHeader(
        version=args.version, channel=CHANNELS[args.channel], security_fix=args.security, os=args.os,
        arch=args.arch, notes=notes, length=size, sha256=file_sha256(artifact), sbom=sbom,
    )  # fmt: skip


def print_releases(releases: list[pb.Release]) -> None:
    rows = [
        (
            r.version,
            _CHANNEL_NAMES.get(r.channel, "?") + (" security" if r.security_fix else ""),
            f"{r.os}/{r.arch}",
            f"{r.length / 1048576:.1f} MiB",
            when(r.published_at),
            "yanked" if r.yanked else r.running_count,
        )
        for r in releases
    ]
    print_table(["VERSION", "CHANNEL", "PLATFORM", "SIZE", "PUBLISHED", "RUNNING"], rows)


def print_release(releases: list[pb.Release]) -> None:
    for r in releases:
        facts = [
            ("channel", _CHANNEL_NAMES.get(r.channel, "?")),
            ("security fix", "yes" if r.security_fix else "no"),
            ("platform", f"{r.os}/{r.arch}"),
            ("artifact", r.target_name),
            ("length", r.length),
            ("sha256", r.sha256),
            ("published", f"{when(r.published_at)} by {r.published_by}"),
            ("running on", f"{r.running_count} active collector(s)"),
            ("sbom", _sbom_line(r)),
        ]
        if r.yanked:
            facts.append(("yanked", f"{when(r.yanked_at)} by {r.yanked_by}: {r.yank_reason}"))
        print(f"Release {r.version} ({r.os}/{r.arch})\n" + fields(facts))
        if r.notes:
            print("\nNotes\n" + "\n".join("  " + line for line in r.notes.splitlines()))
        print()


def _sbom_line(r: pb.Release) -> str:
    if not r.sbom_target_name:
        return "none (published without one)"
    noun = "component" if r.sbom_components == 1 else "components"
    return (
        f"{r.sbom_target_name}: CycloneDX {r.sbom_spec_version}, {r.sbom_components} {noun}, "
        f"{r.sbom_length} bytes, sha256 {r.sbom_sha256}"
    )


def write_sbom(releases: list[pb.Release], out: str, platform: str | None) -> None:
    """The SBOM of the one artifact asked for (``platform``, else the only one with an SBOM)."""
    chosen = [r for r in releases if r.sbom and (platform is None or f"{r.os}/{r.arch}" == platform)]
    if len(chosen) != 1:
        platforms = ", ".join(f"{r.os}/{r.arch}" for r in releases if r.sbom) or "none"
        code = "sbom_not_found" if not chosen else "platform_required"
        raise InvalidArgument(f"artifacts of this release with an SBOM: {platforms}; name one with --platform"
                              if chosen else f"no SBOM for that artifact (those with one: {platforms})",
                              code=code)  # fmt: skip
    if out == "-":
        sys.stdout.buffer.write(chosen[0].sbom)
    else:
        Path(out).write_bytes(chosen[0].sbom)


def run(settings: Settings, args: argparse.Namespace) -> int:
    if args.action == "publish":
        header = _header(args)
        reply = _call(
            settings,
            "PublishRelease",
            publish_messages(header, args.artifact),
            upload_timeout_s(header.length),
        )
        if args.json:
            print_json(reply)
        else:
            print_release([reply.release])
            print(
                "Published: collectors on older versions show an update; "
                "site policies decide who installs it."
            )
        return 0
    if args.action == "list":
        request = pb.ListReleasesRequest(
            channel=CHANNELS.get(args.channel or "", pb.CHANNEL_UNSPECIFIED), include_yanked=args.all
        )
        listed = _call(settings, "ListReleases", request)
        print_json(listed) if args.json else print_releases(list(listed.releases))
        return 0
    if args.action == "show":
        asked = pb.GetReleaseRequest(version=args.version, include_sbom=args.sbom_out is not None)
        shown = _call(settings, "GetRelease", asked)
        if args.sbom_out is not None:
            write_sbom(list(shown.releases), args.sbom_out, args.platform)
            if args.sbom_out == "-":
                return 0
            for r in shown.releases:
                r.ClearField("sbom")  # written to the file, not repeated on the terminal
        print_json(shown) if args.json else print_release(list(shown.releases))
        return 0
    yanked = _call(settings, "YankRelease", pb.YankReleaseRequest(version=args.version, reason=args.reason))
    print_json(yanked) if args.json else print_release(list(yanked.releases))
    return 0
