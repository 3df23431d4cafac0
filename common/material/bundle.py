"""The key and CA material of a deployment as one value: what replicas share (common/material/shared.py).

A bundle is the files under the state directory that must be the same on every
replica: the dispatch and release key sets (``keys/``), the Collector and
gateway CAs (``ca/``) and vault mode B's default master key file. Files that
are per host (the gateway's server certificate, embedded server data, tokens)
are not in it.

Sealed, it is AES-256-GCM under the operator's material key
(common/trust/master_keys.py), bound to the row's name and version so a sealed copy
moved to another row or replayed as another version does not open. Pure code:
paths and bytes in, bytes out.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from common.errors import ConfigError
from common.trust.master_keys import CREDENTIALS_MASTER_FILE, MasterKeys, SealBroken, UnknownMasterKey

FORMAT = "versus-material/1"
# Under the state directory: the trees and single files a bundle carries.
TREES = ("keys", "ca")
FILES = (CREDENTIALS_MASTER_FILE,)
# Index files name the others; a reader that sees a new index must find what it names, so
# they are written after everything else (common/trust/keystore.py, common/trust/ca_store.py).
INDEX_NAMES = ("keyset.json", "trust.json")
# What a bundle must hold for a service to start from it without minting anything.
REQUIRED = ("keys/dispatch/keyset.json", "keys/release/keyset.json", "ca/trust.json")
PRIVATE_MODE = 0o600
PUBLIC_MODE = 0o644


@dataclass(frozen=True, slots=True)
class Bundle:
    """The material's id and its files: relative path to (mode, bytes). ``repr`` names paths only."""

    material_id: str
    files: Mapping[str, tuple[int, bytes]] = field(repr=False)

    def __repr__(self) -> str:
        return f"Bundle(material_id={self.material_id!r}, files={sorted(self.files)!r})"

    def missing(self) -> list[str]:
        """Required files the bundle lacks."""
        return [path for path in REQUIRED if path not in self.files]

    def summary(self) -> dict[str, Any]:
        """Public facts for operators: each key set's version and key ids, each kind's CA ids."""
        out: dict[str, Any] = {}
        for purpose in ("dispatch", "release"):
            meta = self._json(f"keys/{purpose}/keyset.json")
            if meta is not None:
                out[purpose] = {
                    "version": int(meta.get("version", 1)),
                    "kids": [str(k.get("kid")) for k in meta.get("keys", [])],
                }
        trust = self._json("ca/trust.json")
        if trust is not None:
            out["ca_version"] = int(trust.get("version", 1))
            for kind in ("collector", "gateway"):
                entry = trust.get(kind) or {}
                out[f"{kind}_cas"] = [str(c.get("id")) for c in entry.get("cas", [])]
        return out

    def _json(self, path: str) -> dict[str, Any] | None:
        item = self.files.get(path)
        if item is None:
            return None
        try:
            value = json.loads(item[1])
        except ValueError:
            return None
        return value if isinstance(value, dict) else None


def write_order(paths: list[str]) -> list[str]:
    """``paths`` with index files last, so a reader never meets an index naming a missing file."""
    return sorted(paths, key=lambda p: (p.rsplit("/", 1)[-1] in INDEX_NAMES, p))


def managed(path: str) -> bool:
    """Whether a path relative to the state directory belongs in a bundle."""
    name = path.rsplit("/", 1)[-1]
    if name.startswith("."):  # lock files and the temporary files of atomic writes
        return False
    return path in FILES or path.split("/", 1)[0] in TREES


def encode(bundle: Bundle) -> bytes:
    files = {
        path: {"mode": mode, "data": base64.b64encode(data).decode("ascii")}
        for path, (mode, data) in sorted(bundle.files.items())
    }
    return json.dumps({"format": FORMAT, "material_id": bundle.material_id, "files": files}).encode()


def decode(raw: bytes) -> Bundle:
    try:
        doc = json.loads(raw)
        if doc.get("format") != FORMAT:
            raise ValueError("not a versus material bundle")
        files: dict[str, tuple[int, bytes]] = {}
        for path, item in doc["files"].items():
            if not managed(path) or ".." in path.split("/") or path.startswith("/"):
                raise ValueError(f"bundle names a path outside the material: {path!r}")
            mode = PRIVATE_MODE if int(item["mode"]) == PRIVATE_MODE else PUBLIC_MODE
            files[path] = (mode, base64.b64decode(item["data"], validate=True))
        return Bundle(str(doc["material_id"]), files)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ConfigError(f"the shared key material does not parse: {exc}") from None


def _aad(name: str, version: int) -> bytes:
    return json.dumps(["versus material v1", name, version]).encode()


def seal(keys: MasterKeys, name: str, version: int, bundle: Bundle) -> tuple[str, bytes]:
    """The bundle sealed as version ``version`` of row ``name``: (material key id, sealed bytes)."""
    return keys.seal(encode(bundle), _aad(name, version))


def unseal(keys: MasterKeys, name: str, version: int, kid: str, sealed: bytes) -> Bundle:
    """The bundle of a sealed row; :class:`ConfigError` with the reason when it does not open."""
    try:
        return decode(keys.open(kid, sealed, _aad(name, version)))
    except UnknownMasterKey:
        raise ConfigError(
            f"the shared key material is sealed with material key {kid!r}, which "
            f"VERSUS_MATERIAL_KEY_FILE does not hold (it holds {', '.join(sorted(keys.keys))})"
        ) from None
    except SealBroken:
        raise ConfigError(
            f"the shared key material (version {version}) does not open under material key {kid!r}: "
            "the key file is not the one it was sealed with, or the row was altered"
        ) from None


def public_part(bundle: Bundle) -> Bundle:
    """The bundle without its private files: what a gateway host receives."""
    return Bundle(bundle.material_id, {p: f for p, f in bundle.files.items() if f[0] != PRIVATE_MODE})
