"""The collector distribution carries the collector, the modules it imports, and the dependencies
those import - nothing of the control plane (tools/collector_dist.py)."""

from __future__ import annotations

import re
import tomllib
import zipfile
from pathlib import Path

from tools.collector_dist import DISTRIBUTION_OF, ROOT, TEMPLATE, build, closure


def _declared() -> set[str]:
    project = tomllib.loads(TEMPLATE.read_text())["project"]
    return {re.split(r"[\[<>=!~; ]", req, maxsplit=1)[0].lower() for req in project["dependencies"]}


def test_the_declared_dependencies_are_exactly_what_the_collector_imports() -> None:
    _, third = closure()
    imported = {DISTRIBUTION_OF.get(name, name).lower() for name in third}
    assert imported == _declared()


def test_no_control_plane_module_or_dependency_comes_along() -> None:
    files, third = closure()
    tops = {p.relative_to(ROOT).parts[0] for p in files}
    assert tops == {"collector", "common"}
    server_side = {
        "db",
        "embedded",
        "grpc_server.py",
        "grpc_client.py",
        "settings.py",
        "ca_store.py",
        "tls.py",
    }
    assert (
        not {p.relative_to(ROOT / "common").parts[0] for p in files if p.is_relative_to(ROOT / "common")}
        & server_side
    )
    assert not third & {
        "sqlalchemy",
        "grpc",
        "fastapi",
        "uvicorn",
        "redis",
        "psycopg",
        "alembic",
        "pydantic",
        "google",
    }


def test_the_wheel_holds_the_closure_and_its_entry_points(tmp_path: Path) -> None:
    wheel = build(tmp_path)
    files, _ = closure()
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        entry_points = next(archive.read(n).decode() for n in names if n.endswith("entry_points.txt"))
    assert {p.relative_to(ROOT).as_posix() for p in files} == {n for n in names if n.endswith(".py")}
    assert "versus-collector = collector.main:main" in entry_points
    assert "ssh = collector.drivers.ssh:SshDriver" in entry_points
