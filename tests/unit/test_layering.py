"""Services talk over gRPC, never through each other's code (docs/architecture.md, "Who writes what")."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ("router", "gateway", "enrollment", "collector", "console")


def _imported(package: str) -> set[tuple[str, str]]:
    found: set[tuple[str, str]] = set()
    for path in (ROOT / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            found.update((str(path.relative_to(ROOT)), n.split(".")[0]) for n in names)
    return found


@pytest.mark.parametrize("service", SERVICES)
def test_a_service_imports_no_other_service(service: str) -> None:
    others = set(SERVICES) - {service}
    crossing = sorted((where, top) for where, top in _imported(service) if top in others)
    assert crossing == []


def test_shared_code_imports_no_service() -> None:
    crossing = sorted((where, top) for where, top in _imported("common") if top in SERVICES)
    assert crossing == []
