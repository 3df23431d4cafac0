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

The dependencies are exactly ``locks/collector.txt`` (tools/locks.py): pip
downloads the locked wheels for this platform, each checked against the lock's
hashes (:func:`wheelhouse`), and pex packs them without resolving anything
(``--intransitive --no-pypi``). Beside the PEX file goes its SBOM
(:func:`build_sbom`): a CycloneDX document written by cyclonedx-bom from an
environment holding exactly those wheels, with each wheel's SHA-256, so the
SBOM lists what the artifact contains; ``versus-cp releases publish`` sends it
with the release and the router signs both.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import tomllib
from collections.abc import Callable
from pathlib import Path

from packaging.utils import canonicalize_name, parse_wheel_filename

from common.config.state_dir import file_sha256

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = ROOT / "packaging" / "collector" / "pyproject.toml"
LOCK = ROOT / "locks" / "collector.txt"
# CycloneDX version of the SBOM (the newest cyclonedx-python-lib validates).
SBOM_SPEC = "1.6"
# Packages of this tree a collector module may import (the rest are third-party or the standard library).
LOCAL = ("collector", "common")
# Import names whose distribution is called something else.
DISTRIBUTION_OF = {"jwt": "pyjwt", "prometheus_client": "prometheus-client"}


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


def source_date_epoch() -> str:
    """The time every file in the wheel is stamped with: the last commit's, so building the same
    commit twice gives the same wheel (and PEX file); outside a git checkout, 1980-01-01 (the
    earliest a zip file can say)."""
    if "SOURCE_DATE_EPOCH" in os.environ:
        return os.environ["SOURCE_DATE_EPOCH"]
    git = shutil.which("git")
    if git is None:
        return "315532800"
    done = subprocess.run([git, "log", "-1", "--format=%ct"], cwd=ROOT, capture_output=True, text=True,
                          check=False)  # fmt: skip
    return done.stdout.strip() if done.returncode == 0 and done.stdout.strip() else "315532800"


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
            check=True, env={**os.environ, "SOURCE_DATE_EPOCH": source_date_epoch()},
        )  # fmt: skip
    built = sorted(set(out.glob("versus_collector-*.whl")) - before) or sorted(
        out.glob("versus_collector-*.whl")
    )
    return built[-1]


def wheelhouse(into: Path) -> list[Path]:
    """The locked collector dependencies for this platform, as wheels in ``into``, each checked
    against the lock's hashes (pip refuses any other file); never built from source."""
    into.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
         "--require-hashes", "--only-binary", ":all:", "--dest", str(into), "--requirement", str(LOCK)],
        check=True, timeout=600, env=clean_env(), stdout=subprocess.DEVNULL,
    )  # fmt: skip
    return sorted(into.glob("*.whl"))


def artifact_stem(wheel: Path) -> str:
    version = wheel.name.split("-")[1]
    return f"versus-collector-{version}-{platform.system().lower()}-{platform.machine()}"


def build_pex(wheel: Path, out: Path, wheels: list[Path] | None = None) -> Path:
    """The release artifact: ``wheel`` and the locked dependencies (``wheels``, else downloaded
    from the lock) as one PEX file in ``out``, named ``versus-collector-<version>-<os>-<arch>.pex``.
    Nothing is resolved: pex takes exactly the given wheels. ``--venv`` makes it unpack into a
    virtual environment on first run, after which it starts as fast as an installed wheel."""
    target = out / f"{artifact_stem(wheel)}.pex"
    with tempfile.TemporaryDirectory(prefix="versus-wheelhouse-") as tmp:
        deps = wheels if wheels is not None else wheelhouse(Path(tmp))
        subprocess.run(
            [sys.executable, "-m", "pex", str(wheel), *map(str, deps), "--intransitive", "--no-pypi",
             "--console-script", "versus-collector", "--venv", "--python-shebang", "/usr/bin/env python3",
             "--no-emit-warnings", "--output-file", str(target)],
            check=True, timeout=600, env=clean_env(), stdout=subprocess.DEVNULL,
        )  # fmt: skip
    return target


def build_sbom(wheel: Path, wheels: list[Path], out: Path) -> Path:
    """The release's SBOM beside its PEX file (``<stem>.cdx.json``): CycloneDX JSON whose root
    component is this collector version and whose components are exactly ``wheels`` - their names,
    versions, package URLs and licences as cyclonedx-bom reads them from an environment holding
    nothing else, and each wheel's SHA-256 (one of the hashes the lock lists for that version)."""
    version = wheel.name.split("-")[1]
    target = out / f"{artifact_stem(wheel)}.cdx.json"
    with tempfile.TemporaryDirectory(prefix="versus-sbom-") as tmp:
        env = Path(tmp) / "env"
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True, timeout=120)
        subprocess.run(
            # By requirement from a local index, not by file: pip records no direct URL, so the
            # SBOM names each package by its PyPI package URL, not by a temporary path.
            [sys.executable, "-m", "pip", "--python", str(env / "bin" / "python"), "install", "--quiet",
             "--disable-pip-version-check", "--no-index", "--no-compile", "--find-links",
             str(wheels[0].parent), *(f"{n}=={v}" for n, v in map(_name_version, wheels))],
            check=True, timeout=600, env=clean_env(),
        )  # fmt: skip
        project = tomllib.loads(TEMPLATE.read_text())["project"]
        root = Path(tmp) / "pyproject.toml"
        root.write_text(
            "[project]\n"
            f"name = {json.dumps(project['name'])}\nversion = {json.dumps(version)}\n"
            f"description = {json.dumps(project['description'])}\n"
            f"license = {json.dumps(project['license'])}\n"
            f"dependencies = {json.dumps(project['dependencies'])}\n"
        )
        subprocess.run(
            [str(Path(sys.executable).parent / "cyclonedx-py"), "environment", "--pyproject", str(root),
             "--mc-type", "application", "--sv", SBOM_SPEC, "--of", "JSON", "--output-reproducible",
             "--validate", "-o", str(target), str(env / "bin" / "python")],
            check=True, timeout=300, env=clean_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )  # fmt: skip
    document = json.loads(target.read_text())
    digests = {_name_version(w): file_sha256(w) for w in wheels}
    for component in document.get("components", []):
        digest = digests.get((canonicalize_name(component["name"]), component.get("version", "")))
        if digest is not None:
            component["hashes"] = [{"alg": "SHA-256", "content": digest}]
    target.write_text(json.dumps(document, indent=2, sort_keys=False) + "\n")
    return target


def _name_version(wheel: Path) -> tuple[str, str]:
    name, version, *_ = parse_wheel_filename(wheel.name)
    return canonicalize_name(name), str(version)


def build_release(out: Path, version: str | None = None) -> tuple[Path, Path, Path]:
    """What ``make collector-release`` builds into ``out``: the wheel, the PEX file and its SBOM,
    all from the same locked wheels."""
    wheel = build(out, version)
    with tempfile.TemporaryDirectory(prefix="versus-wheelhouse-") as tmp:
        wheels = wheelhouse(Path(tmp))
        return wheel, build_pex(wheel, out, wheels), build_sbom(wheel, wheels, out)


# The installer's own packages, in every virtual environment: not counted as the collector's size.
TOOLING = ("pip", "setuptools", "_distutils_hack", "pkg_resources", "distutils-precedence.pth")


def clean_env() -> dict[str, str]:
    """This environment without anything that would put this tree or its venv on the path."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}


def install_clean(wheel: Path, venv: Path) -> None:
    """A new virtual environment at ``venv`` with the locked dependencies (hash-checked, PyPI or
    pip's cache), then ``wheel`` on top without resolving anything: how an operator installs the
    collector by hand (docs/collector.md)."""
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, "--require-hashes", "--requirement", str(LOCK)],
                   check=True, timeout=400, env=clean_env(), cwd=venv)  # fmt: skip
    subprocess.run([*pip, "--no-deps", str(wheel)], check=True, timeout=400, env=clean_env(), cwd=venv)


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
    parser.add_argument("--pex", action="store_true",
                        help="also build the release artifact (a PEX file) and its SBOM")  # fmt: skip
    args = parser.parse_args()
    if args.pex:
        wheel, pex, sbom = build_release(args.out, args.version)
        # The lock beside them, for hosts that install the wheel by hand (docs/collector.md).
        lock = args.out / f"versus-collector-{wheel.name.split('-')[1]}-requirements.txt"
        shutil.copyfile(LOCK, lock)
        for path in (wheel, pex, sbom, lock):
            print(path)
    else:
        print(build(args.out, args.version))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
