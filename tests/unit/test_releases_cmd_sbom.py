"""`versus-cp releases show --sbom-out`: which artifact's SBOM is written, and the refusals."""

from __future__ import annotations

from pathlib import Path

import pytest
from versus.fleet.v1 import fleet_pb2 as pb

from common.errors import InvalidArgument
from versus_cp.releases_cmd import write_sbom

X86 = pb.Release(version="1.0", os="linux", arch="x86_64", sbom=b'{"x86": 1}')
ARM = pb.Release(version="1.0", os="linux", arch="aarch64", sbom=b'{"arm": 1}')
BARE = pb.Release(version="1.0", os="linux", arch="riscv64")


def test_the_only_sbom_is_written_without_naming_a_platform(tmp_path: Path) -> None:
    out = tmp_path / "sbom.json"
    write_sbom([X86, BARE], str(out), None)
    assert out.read_bytes() == b'{"x86": 1}'


def test_the_named_platform_is_written(tmp_path: Path) -> None:
    out = tmp_path / "sbom.json"
    write_sbom([X86, ARM], str(out), "linux/aarch64")
    assert out.read_bytes() == b'{"arm": 1}'


def test_several_platforms_need_one_named(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument) as refused:
        write_sbom([X86, ARM], str(tmp_path / "sbom.json"), None)
    assert refused.value.code == "platform_required" and "linux/aarch64" in refused.value.message
    assert not (tmp_path / "sbom.json").exists()


def test_an_artifact_without_an_sbom_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument) as refused:
        write_sbom([X86, BARE], str(tmp_path / "sbom.json"), "linux/riscv64")
    assert refused.value.code == "sbom_not_found" and "linux/x86_64" in refused.value.message
