"""The licence of every locked dependency, checked against the allow-list in locks/licenses.toml.

    python -m tools.licenses [--lock NAME ...] [--json]                # make licenses / licenses-core

Licences are read from the packages' installed metadata by pip-licenses (License-Expression,
else the License field when it is SPDX, else the trove classifiers: :func:`reading`) in the
virtual environment built from each lock, so what is checked is what was installed. Each lock's
pins are looked up there by name and version; an environment that holds another version fails
(rebuild it). Pins whose environment marker excludes this platform (Windows- or macOS-only
packages of a universal lock) are not installed here and are listed as such: nothing this project
ships or runs on Linux contains them.

A licence string is mapped to SPDX (the aliases in the allow-list) and parsed as an SPDX
expression (license-expression); it passes when every operand of an AND is allowed and at least
one operand of an OR is.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from license_expression import (
    AND,
    OR,
    ExpressionError,
    LicenseSymbol,
    LicenseWithExceptionSymbol,
    get_spdx_licensing,
)
from packaging.markers import Marker
from packaging.utils import canonicalize_name

from tools.locks import BY_NAME, LOCKS, ROOT, parse_lock

POLICY = ROOT / "locks" / "licenses.toml"
# Where each lock is installed (the Makefile builds them); control-plane and collector are subsets
# of the dev lock at the same versions (tools/locks.py constrains them), so .venv holds them too.
ENVIRONMENTS = {
    "control-plane": ".venv",
    "collector": ".venv",
    "dev": ".venv",
    "bench": ".venv-bench",
    "mitmproxy": ".venv-mitm",
    "salt": ".venv-salt",
    "installer": ".venv",  # uv: in every environment, and in the dev lock at the same version
}
MAKE_TARGET = {
    ".venv": "venv",
    ".venv-bench": "bench-deps",
    ".venv-mitm": "mitm-deps",
    ".venv-salt": "salt-deps",
}


@dataclass(frozen=True, slots=True)
class Policy:
    allowed: frozenset[str]
    aliases: Mapping[str, str]
    packages: Mapping[str, str]  # "name==version" -> SPDX expression read from the source

    @classmethod
    def load(cls, path: Path = POLICY) -> Policy:
        data = tomllib.loads(path.read_text())
        return cls(
            frozenset(data["allowed"]),
            dict(data.get("aliases", {})),
            {k: v["license"] for k, v in data.get("packages", {}).items()},
        )


@dataclass(frozen=True, slots=True)
class Verdict:
    lock: str
    name: str
    version: str
    license: str  # as the metadata says
    spdx: str  # as checked ("" when not installed on this platform)
    ok: bool
    why: str


def spdx_expression(raw: str, policy: Policy) -> str:
    """``raw`` (what pip-licenses read; several classifiers come joined by "; ") as one SPDX
    expression; classifiers together must all hold, so they are joined with AND."""
    parts = [policy.aliases.get(p.strip(), p.strip()) for p in raw.split("; ")]
    parts = [p for p in parts if p]
    return " AND ".join(f"({p})" if " " in p else p for p in parts)


def _holds(node: Any, allowed: frozenset[str]) -> bool:
    if isinstance(node, LicenseWithExceptionSymbol):
        return _holds(node.license_symbol, allowed)
    if isinstance(node, LicenseSymbol):
        return str(node.key) in allowed
    if isinstance(node, AND):
        return all(_holds(arg, allowed) for arg in node.args)
    if isinstance(node, OR):
        return any(_holds(arg, allowed) for arg in node.args)
    return False


def judge(lock: str, name: str, version: str, raw: str, policy: Policy) -> Verdict:
    """Whether package ``name`` ``version`` with licence ``raw`` may be locked."""
    expression = policy.packages.get(f"{name}=={version}") or spdx_expression(raw, policy)
    if not expression:
        return Verdict(lock, name, version, raw, "", False, "no licence in its metadata")
    licensing = get_spdx_licensing()
    try:
        parsed = licensing.parse(expression, strict=True)
    except ExpressionError as exc:
        return Verdict(lock, name, version, raw, expression, False, f"not an SPDX expression ({exc})")
    if parsed is None:
        return Verdict(lock, name, version, raw, "", False, "no licence in its metadata")
    if _holds(parsed, policy.allowed):
        return Verdict(lock, name, version, raw, str(parsed), True, "")
    unknown = [k for k in licensing.unknown_license_keys(parsed) if k not in policy.allowed]
    why = f"not an SPDX licence: {', '.join(unknown)}" if unknown else "outside locks/licenses.toml"
    return Verdict(lock, name, version, raw, str(parsed), False, why)


def reading(entry: Mapping[str, str], policy: Policy) -> str:
    """The licence a package declares, from pip-licenses' three readings of its metadata: its
    License-Expression; else its License field when that is SPDX (after the aliases); else its
    trove classifiers; else whatever the License field says (to show why it is refused)."""
    expression, field, classifiers = (
        entry.get(k, "UNKNOWN") for k in ("License-Expression", "License-Metadata", "License-Classifier")
    )
    if expression != "UNKNOWN":
        return expression
    if field != "UNKNOWN" and _is_spdx(spdx_expression(field, policy), policy):
        return field
    if classifiers != "UNKNOWN":
        return classifiers
    return "" if field == "UNKNOWN" else field


def _is_spdx(expression: str, policy: Policy) -> bool:
    licensing = get_spdx_licensing()
    try:
        parsed = licensing.parse(expression, strict=True) if expression else None
    except ExpressionError:
        return False
    return parsed is not None and all(k in policy.allowed for k in licensing.unknown_license_keys(parsed))


def installed_licenses(venv: Path, policy: Policy) -> dict[str, tuple[str, str]]:
    """name -> (version, licence) of everything installed in ``venv``, as pip-licenses reads it."""
    done = subprocess.run(
        [str(Path(sys.executable).parent / "pip-licenses"), "--python", str(venv / "bin" / "python"),
         "--from", "all", "--format", "json", "--with-system"],
        check=True, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    return {canonicalize_name(d["Name"]): (d["Version"], reading(d, policy)) for d in json.loads(done.stdout)}


def verdicts(locks: Sequence[str], policy: Policy, root: Path = ROOT) -> list[Verdict]:
    found: list[Verdict] = []
    listings: dict[str, dict[str, tuple[str, str]]] = {}
    for lock in locks:
        venv = root / ENVIRONMENTS[lock]
        if not (venv / "bin" / "python").exists():
            raise SystemExit(f"{ENVIRONMENTS[lock]} is missing: run `make {MAKE_TARGET[ENVIRONMENTS[lock]]}`")
        if ENVIRONMENTS[lock] not in listings:
            listings[ENVIRONMENTS[lock]] = installed_licenses(venv, policy)
        listing = listings[ENVIRONMENTS[lock]]
        for pin in parse_lock(BY_NAME[lock].path.read_text()):
            if pin.marker and not Marker(pin.marker).evaluate():
                found.append(
                    Verdict(lock, pin.name, pin.version, "", "", True, "not installed on this platform")
                )
                continue
            version, raw = listing.get(pin.name, ("", ""))
            if version != pin.version:
                found.append(
                    Verdict(lock, pin.name, pin.version, raw, "", False,
                            f"{ENVIRONMENTS[lock]} holds {version or 'nothing'}: rebuild it from the lock")
                )  # fmt: skip
                continue
            found.append(judge(lock, pin.name, pin.version, raw, policy))
    return found


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lock", action="append", choices=[lock.name for lock in LOCKS],
                        help="check these locks only (default: all)")  # fmt: skip
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--quiet", action="store_true", help="list only what is refused")
    args = parser.parse_args(argv)
    found = verdicts(args.lock or [lock.name for lock in LOCKS], Policy.load())
    bad = [v for v in found if not v.ok]
    if args.json:
        print(json.dumps([asdict(v) for v in found], indent=2))
    else:
        rows = [(v.lock, v.name, v.version, v.spdx or "-", "ok" if v.ok and v.spdx else
                 (v.why if v.ok else f"REFUSED: {v.why}")) for v in found]  # fmt: skip
        widths = [max(len(r[i]) for r in rows) for i in range(4)]
        for row in rows:
            if args.quiet and row[4].startswith(("ok", "not installed")):
                continue
            print("  ".join(cell.ljust(w) for cell, w in zip(row[:4], widths, strict=True)), row[4])
    packages = {(v.name, v.version) for v in found}
    print(f"{len(packages)} locked packages in {len({v.lock for v in found})} locks; {len(bad)} refused",
          file=sys.stderr)  # fmt: skip
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
