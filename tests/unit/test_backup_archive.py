"""The backup archive's manifest and checks (common/backup/archive.py) and the choice of the
PostgreSQL tools (common/backup/pg_tools.py), fed values."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from common.backup import archive
from common.backup.archive import Manifest, Member
from common.backup.pg_tools import pick
from common.errors import FailedPrecondition, InvalidArgument


def _manifest(mode: str = "local") -> Manifest:
    members = {archive.DATABASE: Member(archive.DATABASE, "ab" * 32, 10)}
    if mode == "local":
        members[archive.MATERIAL] = Member(archive.MATERIAL, "cd" * 32, 5)
    return Manifest("2026-12-06T00:00:00+00:00", "0021", 15, 18, mode, "mat-1", 1, "mk-1", members)


@pytest.mark.parametrize("mode", ["local", "shared"])
def test_the_manifest_reads_back(mode: str) -> None:
    manifest = _manifest(mode)
    assert archive.parse_manifest(manifest.to_json()) == manifest


def _corrupt(doc: dict[str, object]) -> str:
    with pytest.raises(InvalidArgument) as caught:
        archive.parse_manifest(json.dumps(doc).encode())
    assert caught.value.code == "backup_corrupt"
    return caught.value.message


def test_a_manifest_this_version_cannot_trust_is_refused() -> None:
    good = json.loads(_manifest().to_json())
    assert "format" in _corrupt({**good, "format": "versus-backup/2"})
    assert "malformed" in _corrupt({k: v for k, v in good.items() if k != "members"})
    assert "unexpected" in _corrupt(
        {**good, "members": {**good["members"], "../etc/passwd": good["members"][archive.DATABASE]}}
    )
    no_material = {k: v for k, v in good["members"].items() if k != archive.MATERIAL}
    assert "missing" in _corrupt({**good, "members": no_material})  # local mode carries its material
    with pytest.raises(InvalidArgument):
        archive.parse_manifest(b"{" * (archive.MANIFEST_LIMIT + 1))


def test_a_member_must_match_its_checksum_and_size() -> None:
    digest = archive.Digest()
    digest.update(b"dump ")
    digest.update(b"bytes")
    seen = digest.member(archive.DATABASE)
    assert seen.size == 10
    archive.check_member(seen, seen)
    with pytest.raises(InvalidArgument, match="checksum"):
        archive.check_member(Member(archive.DATABASE, seen.sha256, 11), seen)


def test_a_dump_restores_onto_its_own_major_or_newer() -> None:
    archive.check_restorable(_manifest(), 15)
    archive.check_restorable(_manifest(), 18)
    with pytest.raises(FailedPrecondition) as caught:
        archive.check_restorable(_manifest(), 14)
    assert caught.value.code == "restore_server_too_old"


def test_tools_of_the_servers_major_else_the_oldest_newer() -> None:
    tools = {15: Path("/d15"), 16: Path("/e16"), 18: Path("/e18")}
    assert pick(15, tools) == (15, Path("/d15"))
    assert pick(17, tools) == (18, Path("/e18"))
    with pytest.raises(FailedPrecondition) as caught:
        pick(19, tools)
    assert caught.value.code == "pg_tools_missing" and "15, 16, 18" in caught.value.message
