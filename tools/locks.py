"""The dependency locks: every Python package any part of this project installs, pinned with hashes.

    python -m tools.locks refresh [--upgrade | --upgrade-package NAME ...]   # make lock / lock-upgrade
    python -m tools.locks check                                            # make lock-check (CI)

Each lock in ``locks/`` is resolved by ``uv pip compile`` from its inputs (a
``pyproject.toml`` and its extras, or a ``.in`` file) with ``--generate-hashes``
and ``--universal`` (one file for every Linux architecture and Python 3.11+ a
collector or control plane may run on; a package needed on one only carries an
environment marker). Installs require hashes (``--require-hashes``): the installer
refuses any file whose SHA-256 the lock does not list, and any dependency the lock
does not pin, so a fresh clone gets exactly the locked files on any day
(docs/development.md). ``make`` installs with uv (tools/install_lock.sh), itself
installed by pip from the ``installer`` lock; production hosts use plain pip.

Locks that describe parts of one environment agree with each other: the collector
and the development lock are resolved under the control plane's lock as a
constraint, so the collector a customer runs has exactly the versions the tests
ran.

``check`` works offline. Each lock's first line records a digest of its inputs
(the requirement strings of its sources, the pins of the locks it is constrained
by, and the resolver's options); when a ``pyproject.toml`` or ``.in`` changes, the
digest no longer matches and the check fails until ``make lock`` runs. It also
checks that every pin satisfies every direct requirement naming it and carries
hashes, so a lock edited by hand cannot disagree with ``pyproject.toml`` either.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
LOCK_DIR = ROOT / "locks"
# The resolver's options, part of every digest: a change of them is a change of the lock.
PYTHON_VERSION = "3.11"
COMPILE_OPTIONS = ("--generate-hashes", "--universal", "--python-version", PYTHON_VERSION)
DIGEST_PREFIX = "# inputs-sha256: "
REFRESH_COMMAND = "make lock"


@dataclass(frozen=True)
class Lock:
    """One lock file: ``sources`` are paths relative to the root (a pyproject.toml or a .in file),
    ``extras`` the pyproject's optional dependency groups it includes, ``constraints`` the locks
    whose pins it must keep."""

    name: str
    sources: tuple[str, ...]
    extras: tuple[str, ...] = ()
    constraints: tuple[str, ...] = ()
    purpose: str = field(default="", compare=False)

    @property
    def path(self) -> Path:
        return LOCK_DIR / f"{self.name}.txt"


# In resolution order: a lock comes after the locks it is constrained by.
LOCKS: tuple[Lock, ...] = (
    Lock("control-plane", ("pyproject.toml",),
         purpose="what the control plane runs on (production installs)"),
    Lock("collector", ("packaging/collector/pyproject.toml",), constraints=("control-plane",),
         purpose="the collector release: its wheelhouse, PEX file and SBOM"),
    Lock("dev", ("pyproject.toml", "locks/bootstrap.in"), ("dev",), ("control-plane",),
         purpose="the development and CI environment, .venv"),
    Lock("bench", ("pyproject.toml", "locks/bootstrap.in"), ("dev", "bench"), ("dev",),
         purpose="benchmarks and their peers, .venv-bench"),
    Lock("mitmproxy", ("locks/mitmproxy.in",), purpose="the TLS-inspecting proxy of the tests, .venv-mitm"),
    Lock("salt", ("locks/salt.in",), purpose="SaltStack, the benchmarks' peer, .venv-salt"),
    Lock("installer", ("locks/installer.in",), constraints=("dev",),
         purpose="uv, which installs every lock into its environment (tools/install_lock.sh)"),
)  # fmt: skip
BY_NAME = {lock.name: lock for lock in LOCKS}


class LockError(Exception):
    """A lock disagrees with its inputs; the message says which and how to fix it."""


# --- reading inputs and locks (pure) --------------------------------------------------------------
def source_requirements(root: Path, source: str, extras: Sequence[str]) -> list[str]:
    """The requirement strings ``source`` declares (a pyproject's dependencies and ``extras``, or a
    .in file's lines without comments), normalised by packaging."""
    path = root / source
    if path.name == "pyproject.toml":
        project = tomllib.loads(path.read_text())["project"]
        declared = list(project.get("dependencies", []))
        optional = project.get("optional-dependencies", {})
        for extra in extras:
            if extra not in optional:
                raise LockError(f"{source} has no optional dependency group {extra!r}")
            declared += optional[extra]
    else:
        declared = [line.split("#", 1)[0].strip() for line in path.read_text().splitlines()]
    return [str(Requirement(r)) for r in declared if r]


@dataclass(frozen=True, slots=True)
class Pin:
    name: str
    version: str
    marker: str
    hashes: tuple[str, ...]


def parse_lock(text: str) -> list[Pin]:
    """The pins of a lock file as ``uv pip compile --generate-hashes`` writes it (a requirement and
    its ``--hash`` options joined by backslash continuations; ``#`` comments)."""
    pins: list[Pin] = []
    for line in re.sub(r"\\\n", " ", text).splitlines():
        line = line.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        requirement, *options = line.split("--hash=")
        try:
            req = Requirement(requirement.strip())
        except InvalidRequirement as exc:
            raise LockError(f"not a requirement: {requirement.strip()[:80]!r} ({exc})") from None
        specs = list(req.specifier)
        if len(specs) != 1 or specs[0].operator != "==" or "*" in specs[0].version:
            raise LockError(f"not pinned to one version: {str(req)[:80]!r}")
        hashes = tuple(o.strip() for o in options)
        if not all(re.fullmatch(r"sha256:[0-9a-f]{64}", h) for h in hashes):
            raise LockError(f"{req.name}: a --hash that is not sha256:<64 hex digits>")
        marker = str(req.marker) if req.marker is not None else ""
        pins.append(Pin(canonicalize_name(req.name), specs[0].version, marker, hashes))
    return pins


def pins_text(pins: Iterable[Pin]) -> list[str]:
    return sorted(f"{p.name}=={p.version}" + (f"; {p.marker}" if p.marker else "") for p in pins)


def digest(lock: Lock, root: Path, constraint_pins: dict[str, list[Pin]]) -> str:
    """What the lock was made from: if any of it changes, the lock must be made again."""
    inputs = {
        "options": list(COMPILE_OPTIONS),
        "sources": {s: source_requirements(root, s, lock.extras) for s in lock.sources},
        "constraints": {c: pins_text(constraint_pins[c]) for c in lock.constraints},
    }
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()


def recorded_digest(text: str) -> str | None:
    first = text.split("\n", 1)[0]
    return first.removeprefix(DIGEST_PREFIX).strip() if first.startswith(DIGEST_PREFIX) else None


def disagreements(lock: Lock, root: Path, text: str, constraint_pins: dict[str, list[Pin]]) -> list[str]:
    """Why ``text`` (the lock's content) does not lock ``lock``'s inputs; empty when it does."""
    problems: list[str] = []
    if recorded_digest(text) != digest(lock, root, constraint_pins):
        problems.append(f"{lock.path.name}: its inputs changed since it was made ({', '.join(lock.sources)})")
    pins = parse_lock(text)
    by_name: dict[str, list[Pin]] = {}
    for pin in pins:
        by_name.setdefault(pin.name, []).append(pin)
        if not pin.hashes:
            problems.append(f"{lock.path.name}: {pin.name}=={pin.version} has no --hash")
    environment: dict[str, str] = {k: str(v) for k, v in default_environment().items()}
    environment["python_version"] = PYTHON_VERSION
    for source in lock.sources:
        for raw in source_requirements(root, source, lock.extras):
            req = Requirement(raw)
            for extra in ("", *lock.extras):
                if req.marker is None or req.marker.evaluate({**environment, "extra": extra}):
                    break
            else:
                continue  # a requirement for another platform
            candidates = by_name.get(canonicalize_name(req.name), [])
            if not candidates:
                problems.append(f"{lock.path.name}: {source} requires {req.name}, which is not locked")
            for pin in candidates:
                if not req.specifier.contains(pin.version, prereleases=True):
                    problems.append(
                        f"{lock.path.name}: {pin.name}=={pin.version} is outside {source}'s {req}"
                    )
    for name in lock.constraints:
        held = {p.name: p.version for p in constraint_pins[name]}
        for pin in pins:
            if pin.name in held and held[pin.name] != pin.version:
                problems.append(
                    f"{lock.path.name}: {pin.name}=={pin.version} differs from {name}.txt's {held[pin.name]}"
                )
    return problems


def check(root: Path = ROOT, locks: Sequence[Lock] = LOCKS) -> list[str]:
    """Every disagreement between the locks in ``root``/locks and their inputs."""
    problems: list[str] = []
    pins: dict[str, list[Pin]] = {}
    for lock in locks:
        path = root / "locks" / f"{lock.name}.txt"
        if not path.is_file():
            problems.append(f"{path.name} is missing")
            continue
        text = path.read_text()
        try:
            pins[lock.name] = parse_lock(text)
            missing = [c for c in lock.constraints if c not in pins]
            if missing:
                continue  # reported as missing above
            problems += disagreements(lock, root, text, pins)
        except LockError as exc:
            problems.append(f"{path.name}: {exc}")
    return problems


# --- refreshing (runs uv) -----------------------------------------------------------------------
def uv() -> str:
    """uv from this environment (pinned in the dev lock), beside the running interpreter."""
    candidate = Path(sys.executable).parent / "uv"
    return str(candidate) if candidate.exists() else "uv"


def refresh(lock: Lock, upgrade: bool, packages: Sequence[str]) -> bool:
    """Resolve ``lock`` again with uv; existing pins are kept unless upgrades are asked for. The
    file is replaced only when its content changes (so `make` rebuilds no environment for
    nothing); returns whether it did."""
    with tempfile.TemporaryDirectory(prefix="versus-lock-") as tmp:
        out = Path(tmp) / lock.path.name
        if lock.path.exists():
            shutil.copyfile(lock.path, out)  # uv keeps the pins of the file it writes over
        command = [uv(), "pip", "compile", *lock.sources, *COMPILE_OPTIONS, "--quiet",
                   "--custom-compile-command", REFRESH_COMMAND, "--output-file", str(out)]  # fmt: skip
        for extra in lock.extras:
            command += ["--extra", extra]
        for name in lock.constraints:
            command += ["--constraint", str(BY_NAME[name].path.relative_to(ROOT))]
        if upgrade:
            command.append("--upgrade")
        for package in packages:
            command += ["--upgrade-package", package]
        subprocess.run(command, check=True, cwd=ROOT, env={**os.environ, "UV_NO_CONFIG": "1"}, timeout=600)
        body = out.read_text()
    if recorded_digest(body) is not None:
        body = body.split("\n", 1)[1]
    pins = {name: parse_lock(BY_NAME[name].path.read_text()) for name in lock.constraints}
    text = f"{DIGEST_PREFIX}{digest(lock, ROOT, pins)}\n{body}"
    if lock.path.exists() and lock.path.read_text() == text:
        return False
    lock.path.write_text(text)
    return True


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="action", required=True)
    fresh = sub.add_parser("refresh", help="resolve the locks again (keeping pins unless told to upgrade)")
    fresh.add_argument("--upgrade", action="store_true", help="take the newest versions the inputs allow")
    fresh.add_argument("--upgrade-package", action="append", default=[], metavar="NAME")
    sub.add_parser("check", help="fail when a lock disagrees with its inputs (offline)")
    args = parser.parse_args(argv)
    if args.action == "refresh":
        for lock in LOCKS:
            changed = refresh(lock, args.upgrade, args.upgrade_package)
            print(f"{lock.path.relative_to(ROOT)} ({lock.purpose}): {'changed' if changed else 'unchanged'}")
        return 0
    problems = check()
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        print(
            f"the locks disagree with their inputs: run `{REFRESH_COMMAND}` and commit locks/",
            file=sys.stderr,
        )
        return 1
    print(f"{len(LOCKS)} locks agree with their inputs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
