"""Build the collector as its own distribution, `versus-collector`, from this tree.

    python -m tools.collector_dist [--out DIR] [--pex]        # make collector-release

A customer's collector host needs the collector and nothing of the control
plane (no PostgreSQL, Redis, SQLAlchemy or gRPC servers). The wheel holds the
``collector`` package and exactly the modules of ``common`` that it imports,
found by following the import statements from ``collector/`` (:func:`closure`);
its dependencies are declared in ``packaging/collector/pyproject.toml`` and
checked against the third-party imports of those modules
(tests/unit/test_collector_dist.py). tests/e2e/test_collector_distribution.py
installs the wheel into a clean virtual environment and runs it against a real
control plane.

The release artifact (``--pex``) is that wheel and its dependencies in one
PEX file (docs/upgrades.md says why PEX): one file whose SHA-256 the update
metadata signs, runnable by the host's Python 3.11+ with nothing else
installed, unpacked on first run into a virtual environment beside it.
"""

from __future__ import annotations

import argparse
import ast
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = ROOT / "packaging" / "collector" / "pyproject.toml"
# Packages of this tree a collector module may import (the rest are third-party or the standard library).
LOCAL = ("collector", "common")
# Import names whose distribution is called something else.
DISTRIBUTION_OF = {"jwt": "pyjwt"}


def _module_file(module: str) -> Path | None:
    base = ROOT.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


# CPython 3.11's parser is not safe to call from several threads at once (it can fail with
# "SystemError: AST constructor recursion depth mismatch"); builds may run in parallel threads.
_PARSE = threading.Lock()


def closure() -> tuple[list[Path], set[str]]:
    """The files of this tree the collector needs (every parent ``__init__`` included) and the
    top-level names of the third-party modules they import."""
    pending = [
        ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for p in (ROOT / "collector").rglob("*.py")
    ]
    seen: set[str] = set()
    files: set[Path] = set()
    third: set[str] = set()
    while pending:
        module = pending.pop()
        if module in seen:
            continue
        seen.add(module)
        path = _module_file(module)
        if path is None:
            continue
        files.add(path)
        parts = module.split(".")
        for i in range(1, len(parts)):  # a module's packages come with it
            parent = _module_file(".".join(parts[:i]))
            if parent is not None:
                files.add(parent)
        with _PARSE:
            tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            for name in names:
                top = name.split(".")[0]
                if top in LOCAL:
                    pending.append(name)
                elif top not in sys.stdlib_module_names and top != "__future__":
                    third.add(top)
    return sorted(files), third


def stage(into: Path, version: str | None = None) -> None:
    """Copy the collector's files and the distribution's pyproject into ``into``; ``version``
    replaces the one in ``collector/__init__.py``."""
    files, _ = closure()
    for path in files:
        target = into / path.relative_to(ROOT)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
    shutil.copy2(TEMPLATE, into / "pyproject.toml")
    if version is not None:
        init = into / "collector" / "__init__.py"
        text, count = re.subn(r'(?m)^__version__ = ".*"$', f'__version__ = "{version}"', init.read_text())
        if count != 1:
            raise RuntimeError("collector/__init__.py has no __version__ line")
        init.write_text(text)


def build(out: Path, version: str | None = None, edit: Callable[[Path], None] | None = None) -> Path:
    """Build the wheel into ``out``; returns its path. ``version`` overrides the tree's version and
    ``edit`` may change the staged tree before it is built (tests build broken releases so)."""
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="versus-collector-") as tmp:
        staging = Path(tmp)
        stage(staging, version)
        if edit is not None:
            edit(staging)
        before = set(out.glob("versus_collector-*.whl"))
        subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
             "--wheel-dir", str(out), str(staging)],
            check=True,
        )  # fmt: skip
    built = sorted(set(out.glob("versus_collector-*.whl")) - before) or sorted(
        out.glob("versus_collector-*.whl")
    )
    return built[-1]


def build_pex(wheel: Path, out: Path) -> Path:
    """The release artifact: ``wheel`` and its dependencies as one PEX file in ``out``, named
    ``versus-collector-<version>-<os>-<arch>.pex``. Dependencies are resolved from the package
    index (or pex's cache); ``--venv`` makes it unpack into a virtual environment on first run,
    after which it starts as fast as an installed wheel."""
    version = wheel.name.split("-")[1]
    target = out / f"versus-collector-{version}-{platform.system().lower()}-{platform.machine()}.pex"
    subprocess.run(
        [sys.executable, "-m", "pex", str(wheel), "--console-script", "versus-collector", "--venv",
         "--python-shebang", "/usr/bin/env python3", "--no-emit-warnings",
         "--output-file", str(target)],
        check=True, timeout=600, env=clean_env(), stdout=subprocess.DEVNULL,
    )  # fmt: skip
    return target


# The installer's own packages, in every virtual environment: not counted as the collector's size.
TOOLING = ("pip", "setuptools", "_distutils_hack", "pkg_resources", "distutils-precedence.pth")


def clean_env() -> dict[str, str]:
    """This environment without anything that would put this tree or its venv on the path."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}


def install_clean(wheel: Path, venv: Path) -> None:
    """A new virtual environment at ``venv`` with ``wheel`` and its dependencies (PyPI or pip's cache)."""
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
         str(wheel)],
        check=True, timeout=400, env=clean_env(), cwd=venv,
    )  # fmt: skip


def site_packages(venv: Path) -> Path:
    [site] = list((venv / "lib").glob("python3*/site-packages"))
    return site


def installed_bytes(venv: Path) -> int:
    """Bytes of everything installed in ``venv``'s site-packages but the installer's own packages."""
    total = 0
    for entry in site_packages(venv).iterdir():
        if entry.name.split("-")[0].split(".")[0] in TOOLING or entry.name in TOOLING:
            continue
        files = [entry] if entry.is_file() else [p for p in entry.rglob("*") if p.is_file()]
        total += sum(p.stat().st_size for p in files)
    return total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "dist")
    parser.add_argument("--version", help="override the version of this tree (collector/__init__.py)")
    parser.add_argument("--pex", action="store_true", help="also build the release artifact (a PEX file)")
    args = parser.parse_args()
    wheel = build(args.out, args.version)
    print(wheel)
    if args.pex:
        print(build_pex(wheel, args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
