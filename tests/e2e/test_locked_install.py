"""Installs from the lock are reproducible (issue 26): a clean virtual environment installed from
locks/dev.txt today is byte-for-byte the environment these tests run in (installed from the same
lock by `make venv`, on another day on a developer's machine or minutes ago in CI), and holds
exactly the locked set. Both are made by the one script every make target installs with
(tools/install_lock.sh)."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.markers import Marker
from packaging.utils import canonicalize_name

from tools.collector_dist import clean_env, site_packages
from tools.locks import BY_NAME, ROOT, parse_lock

pytestmark = pytest.mark.timeout(900)

# This checkout, installed editable by `make venv` beside the lock: not part of the lock.
PROJECT = "versus-control-plane"
PROJECT_SCRIPTS = {"versus-cp", "versus-collector"}


def _is_project_file(relative: str) -> bool:
    return relative.startswith(("__editable__", "versus_control_plane-"))


def _digest(path: Path, venv: Path) -> str:
    """A file's SHA-256, with the environment's absolute path written as VENV: the console scripts
    the installer writes into bin/ start with it (their shebang), and so do the activate scripts.
    A RECORD lists those scripts' hashes, so its lines for bin/ are left out: the scripts
    themselves are compared. Everything else is compared exactly as installed."""
    data = path.read_bytes().replace(str(venv.resolve()).encode(), b"VENV")
    if path.name == "RECORD" and path.parent.name.endswith(".dist-info"):
        data = b"\n".join(line for line in data.splitlines() if not line.startswith(b"../../../bin/"))
    return hashlib.sha256(data).hexdigest()


def inventory(venv: Path) -> dict[str, str]:
    """Every file installed into ``venv`` (site-packages and bin/), by path, with its digest.
    Bytecode caches are left out: CPython stamps each with its source file's modification time,
    the moment of the install, and writes them when a module is first imported."""
    files: dict[str, str] = {}
    site = site_packages(venv)
    for path in site.rglob("*"):
        relative = path.relative_to(site).as_posix()
        if path.is_file() and "__pycache__" not in path.parts and not _is_project_file(relative):
            files[f"site-packages/{relative}"] = _digest(path, venv)
    for path in (venv / "bin").iterdir():
        if path.is_file() and not path.is_symlink() and path.name not in PROJECT_SCRIPTS:
            files[f"bin/{path.name}"] = _digest(path, venv)
    return files


def freeze(venv: Path) -> list[str]:
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "freeze", "--all", "--disable-pip-version-check"],
        capture_output=True, text=True, check=True, env=clean_env(), timeout=120,
    )  # fmt: skip
    return [
        line for line in done.stdout.splitlines()
        if not line.startswith(("-e ", "#"))
        and canonicalize_name(line.split("==")[0].split(" @ ")[0]) != PROJECT
    ]  # fmt: skip


def test_a_clean_install_from_the_lock_is_this_environment_byte_for_byte(tmp_path: Path) -> None:
    here = Path(sys.prefix)
    assert here != Path(sys.base_prefix), "the tests run in the project's virtual environment"
    # Another checkout's .venv: same name (the activate scripts' prompt says it), another path.
    fresh = tmp_path / "another-clone" / ".venv"
    # From the interpreter this environment was made from, as `make venv` does.
    base = Path(sys.base_prefix) / "bin" / "python3"
    subprocess.run(
        [str(ROOT / "tools" / "install_lock.sh"), str(fresh), str(ROOT / "locks" / "dev.txt")],
        # Without bytecode: caches are not compared (see inventory), and this one never runs.
        env={**clean_env(), "PYTHON": str(base), "INSTALL_NO_BYTECODE": "1"},
        check=True, cwd=tmp_path, timeout=800,
    )  # fmt: skip

    # Exactly the locked set: every pin that applies here, at its version, and nothing else.
    locked = {
        f"{p.name}=={p.version}"
        for p in parse_lock(BY_NAME["dev"].path.read_text())
        if not p.marker or Marker(p.marker).evaluate()
    }
    installed = freeze(fresh)
    assert {
        f"{canonicalize_name(line.split('==')[0])}=={line.split('==')[1]}" for line in installed
    } == locked

    # The same packages, and the same bytes in every file, as the environment of this run.
    assert freeze(here) == installed
    ours, theirs = inventory(here), inventory(fresh)
    assert sorted(set(ours) ^ set(theirs)) == []
    differing = sorted(path for path in ours if ours[path] != theirs[path])
    assert differing == [], f"{len(differing)} of {len(ours)} files differ"
    assert len(ours) > 10_000  # the whole environment was compared, not an empty listing
