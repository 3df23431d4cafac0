"""The collector distribution carries the collector, the modules it imports, and the dependencies
those import - nothing of the control plane (tools/collector_dist.py)."""

from __future__ import annotations

import ast
import re
import threading
import time
import tomllib
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

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
    assert "versus-collector = collector.entry:main" in entry_points
    assert "ssh = collector.drivers.ssh:SshDriver" in entry_points


def test_the_closure_parses_one_file_at_a_time_across_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Releases are built in parallel threads (the upgrade tests do); CPython 3.11's parser is not
    thread-safe (a build once died with "SystemError: AST constructor recursion depth mismatch"),
    so parsing is serialised. A parser that notices company fails this on unguarded code."""
    inside, most = 0, 0
    guard = threading.Lock()
    real_parse = ast.parse

    def watched(source: str, filename: str) -> ast.Module:
        nonlocal inside, most
        with guard:
            inside += 1
            most = max(most, inside)
        time.sleep(0.002)
        try:
            return real_parse(source, filename)
        finally:
            with guard:
                inside -= 1

    monkeypatch.setattr(ast, "parse", watched)
    expected = closure()
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: closure(), range(4)))
    assert all(r == expected for r in results) and most == 1
