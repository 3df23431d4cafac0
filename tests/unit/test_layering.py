"""The import order of the tree (docs/architecture.md, "Packages and their order").

Every import statement counts, at module level or inside a function, under ``TYPE_CHECKING`` or
not: an arrow a reader has to follow is an arrow. The rules:

- services never import each other; shared code imports no service;
- inside ``common`` and ``router``, each package sits on a level and imports only packages on
  lower levels (peers on one level never import each other);
- pure cores import no I/O library, not even through the project modules they import;
- no import circle between any two modules of the tree.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ("router", "gateway", "enrollment", "collector", "console")
# Every hand-written package of the tree (gen/ is generated; tests are not imported by code).
PACKAGES = (*SERVICES, "common", "versus_cp", "tools", "bench", "chaos")

# Bottom first. A package imports only packages on a lower level; a name in a level is a
# package or a module (``common.errors``).
COMMON_LEVELS: tuple[tuple[str, ...], ...] = (
    ("common.errors",),
    (
        "common.limits",
        "common.error_mapping",
        "common.protocol",
        "common.tunnel",
        "common.embedded",
        "common.telemetry",
    ),
    ("common.redis", "common.db"),
    ("common.config", "common.access"),
    ("common.trust", "common.updates"),
    ("common.envelope", "common.grpc", "common.material"),
    ("common.runtime", "common.backup"),
)
ROUTER_LEVELS: tuple[tuple[str, ...], ...] = (
    ("router.core",),
    (
        "router.access",
        "router.audit_export",
        "router.credentials",
        "router.output",
        "router.releases",
        "router.trust",
        "router.tunnels",
    ),
    ("router.dispatch",),
    ("router.fleet",),
    ("router.server",),
)

# Plain code, fed values in tests: neither they nor any project module they import may import
# an I/O library.
PURE = (
    "common.envelope.canonical",
    "common.envelope.codes",
    "common.envelope.fence",
    "common.envelope.sign",
    "common.envelope.verify",
    "common.envelope.wire",
    "common.protocol",
    "common.tunnel.frames",
    "common.tunnel.stream",
    "common.tunnel.record",
    "common.access.rbac",
    "router.core.states",
    "router.core.fleet_state",
    "router.dispatch.ladder",
    "router.dispatch.placement",
    "router.dispatch.reservations",
    "router.dispatch.submit",
    "router.releases.update_policy",
    "router.audit_export.events",
    "gateway.admission",
)
IO_LIBRARIES = frozenset(
    {
        "aiohttp",
        "asyncpg",
        "grpc",
        "httpx",
        "psycopg",
        "redis",
        "requests",
        "socket",
        "sqlalchemy",
        "starlette",
        "subprocess",
        "uvicorn",
        "websockets",
    }
)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            if "migrations" not in path.parts:
                found[_module_name(path)] = path
    return found


@cache
def _imports(module: str) -> frozenset[str]:
    """Every name ``module`` imports, absolute, as written (``a.b`` for ``from a import b`` too)."""
    path = _modules()[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names.add(base)
            names.update(f"{base}.{a.name}" for a in node.names)
    return frozenset(names)


def _project_imports(module: str) -> set[str]:
    """The modules of the tree that ``module`` imports (a package counts as its ``__init__``)."""
    modules = _modules()
    return {name for name in _imports(module) if name in modules and name != module}


def _unit(module: str, levels: Iterable[Iterable[str]]) -> tuple[int, str] | None:
    for depth, units in enumerate(levels):
        for unit in units:
            if module == unit or module.startswith(unit + "."):
                return depth, unit
    return None


def _crossings(top: str, levels: tuple[tuple[str, ...], ...]) -> list[str]:
    wrong = []
    for module in sorted(m for m in _modules() if m.startswith(top + ".")):
        mine = _unit(module, levels)
        assert mine is not None, f"{module} is on no level of the {top} order: add its package"
        for imported in sorted(_project_imports(module)):
            theirs = _unit(imported, levels)
            if theirs is None or theirs[1] == mine[1]:
                continue
            if theirs[0] >= mine[0]:
                wrong.append(f"{module} ({mine[1]}, level {mine[0]}) imports {imported} (level {theirs[0]})")
    return wrong


@pytest.mark.parametrize("service", SERVICES)
def test_a_service_imports_no_other_service(service: str) -> None:
    others = set(SERVICES) - {service}
    crossing = sorted(
        f"{m} imports {i}"
        for m in _modules()
        if m.split(".")[0] == service
        for i in _imports(m)
        if i.split(".")[0] in others
    )
    assert crossing == []


def test_shared_code_imports_no_service() -> None:
    crossing = sorted(
        f"{m} imports {i}"
        for m in _modules()
        if m.startswith("common.")
        for i in _imports(m)
        if i.split(".")[0] in SERVICES
    )
    assert crossing == []


@pytest.mark.parametrize(("top", "levels"), [("common", COMMON_LEVELS), ("router", ROUTER_LEVELS)])
def test_packages_import_only_downward(top: str, levels: tuple[tuple[str, ...], ...]) -> None:
    assert _crossings(top, levels) == []


def test_every_package_of_common_and_router_is_on_a_level() -> None:
    placed = {unit for levels in (COMMON_LEVELS, ROUTER_LEVELS) for units in levels for unit in units}
    tops = {
        _module_name(p if p.is_file() else p / "__init__.py")
        for base in ("common", "router")
        for p in (ROOT / base).iterdir()
        if (p.suffix == ".py" and p.name != "__init__.py") or (p / "__init__.py").exists()
    }
    assert tops - placed == set()
    assert placed - tops == set(), "a level names a package that does not exist"


@pytest.mark.parametrize("module", PURE)
def test_pure_cores_import_no_io_library(module: str) -> None:
    seen: set[str] = set()
    todo = [module]
    reached: list[str] = []
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        for name in _imports(current):
            if name.split(".")[0] in IO_LIBRARIES:
                reached.append(f"{current} imports {name}")
        todo.extend(_project_imports(current))
    assert reached == []


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph``, or None (an iterative depth-first search)."""
    state: dict[str, int] = {}
    for start in sorted(graph):
        if start in state:
            continue
        stack = [(start, iter(sorted(graph[start])))]
        path = [start]
        state[start] = 1
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                stack.pop()
                path.pop()
                state[node] = 2
            elif state.get(child) == 1:
                return [*path[path.index(child) :], child]
            elif child not in state:
                state[child] = 1
                path.append(child)
                stack.append((child, iter(sorted(graph[child]))))
    return None


def _import_graph() -> dict[str, set[str]]:
    graph = {}
    for module in _modules():
        # Importing ``a.b.c`` runs ``a/__init__`` and ``a/b/__init__`` too, but those hold only
        # a purpose paragraph: an arrow to a package is an arrow to its ``__init__`` alone.
        graph[module] = _project_imports(module)
    return graph


def test_no_import_circle() -> None:
    assert _cycle(_import_graph()) is None


def test_the_circle_finder_finds_a_circle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_a_wrong_arrow_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The order check fails on an upward import: ``router.core`` importing the dispatch layer."""
    planted = ROOT / "router" / "core" / "_planted_for_test.py"
    assert not planted.exists()
    modules = dict(_modules())
    modules["router.core._planted_for_test"] = planted
    monkeypatch.setattr(sys.modules[__name__], "_modules", lambda: modules)
    real = _imports

    def imports(module: str) -> frozenset[str]:
        if module == "router.core._planted_for_test":
            return frozenset({"router.dispatch.service"})
        return real(module)

    monkeypatch.setattr(sys.modules[__name__], "_imports", imports)
    assert _crossings("router", ROUTER_LEVELS) == [
        "router.core._planted_for_test (router.core, level 0) imports router.dispatch.service (level 2)"
    ]
