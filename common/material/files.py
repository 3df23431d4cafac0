"""A host's copy of the key and CA material: read it into a bundle, write a bundle over it.

The marker ``<state>/material.json`` says which material the copy is
(``material_id``), which version of the shared row it was written from, and in
which mode. The services' readers (common/trust/keystore.py, common/trust/ca_store.py) follow
their index files' mtimes, so a bundle written here reaches running processes
without a restart.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from common.config.state_dir import write_private, write_public
from common.errors import ConfigError
from common.material.bundle import FILES, PRIVATE_MODE, TREES, Bundle, managed, write_order

MARKER = "material.json"


@dataclass(frozen=True, slots=True)
class Marker:
    material_id: str
    version: int
    mode: str


def read_marker(state: Path) -> Marker | None:
    path = state / MARKER
    try:
        doc = json.loads(path.read_text())
        return Marker(str(doc["material_id"]), int(doc["version"]), str(doc["mode"]))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{path} is unreadable ({type(exc).__name__}); remove it to adopt again") from None


def write_marker(state: Path, marker: Marker) -> None:
    doc = {"material_id": marker.material_id, "version": marker.version, "mode": marker.mode}
    write_public(state / MARKER, (json.dumps(doc) + "\n").encode())


def _paths(state: Path) -> list[str]:
    found = [name for name in FILES if (state / name).is_file()]
    for tree in TREES:
        root = state / tree
        if root.is_dir():
            for path in root.rglob("*"):
                rel = path.relative_to(state).as_posix()
                if path.is_file() and managed(rel):
                    found.append(rel)
    return sorted(found)


def has_material(state: Path) -> bool:
    return any(_paths(state))


def read_bundle(state: Path, material_id: str) -> Bundle:
    """This host's material as a bundle (each file with its private or public mode)."""
    files: dict[str, tuple[int, bytes]] = {}
    for rel in _paths(state):
        path = state / rel
        mode = PRIVATE_MODE if path.stat().st_mode & 0o077 == 0 else 0o644
        files[rel] = (mode, path.read_bytes())
    return Bundle(material_id, files)


def apply_bundle(state: Path, bundle: Bundle) -> int:
    """Make this host's copy equal to ``bundle``: changed files written atomically (index files
    last), files the bundle no longer has removed. Returns how many files changed."""
    changed = 0
    for rel in write_order(list(bundle.files)):
        mode, data = bundle.files[rel]
        path = state / rel
        try:
            same = path.read_bytes() == data and (path.stat().st_mode & 0o777) == mode
        except FileNotFoundError:
            same = False
        if same:
            continue
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        (write_private if mode == PRIVATE_MODE else write_public)(path, data)
        changed += 1
    for rel in _paths(state):
        if rel not in bundle.files:
            os.unlink(state / rel)
            changed += 1
    return changed
