"""Known vulnerabilities in the locked dependencies: pip-audit against every lock in locks/.

    python -m tools.audit [--lock NAME ...] [--service pypi|osv]          # make audit

Each lock is audited as written (``--no-deps --disable-pip``: the pins are the whole set, nothing is
resolved or installed), against PyPI's JSON API (the default) or OSV. Exit status: 0 when every
pinned package was looked up and none has a known vulnerability, 1 when one has (each is listed
with its advisory and the versions that fix it), 2 when the advisory source could not be asked
about every package - an audit that looked at nothing must not read as a clean one.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tools.locks import BY_NAME, LOCKS

ADVISORY_HOST = {"pypi": "pypi.org (its JSON API)", "osv": "api.osv.dev"}


class Unreachable(Exception):
    """pip-audit gave no report (the advisory source did not answer at all)."""


def audit(lock: str, service: str) -> dict[str, Any]:
    """pip-audit's JSON report of one lock."""
    done = subprocess.run(
        [str(Path(sys.executable).parent / "pip-audit"), "--requirement", str(BY_NAME[lock].path),
         "--no-deps", "--disable-pip", "--vulnerability-service", service, "--format", "json",
         "--progress-spinner", "off"],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    try:
        report: dict[str, Any] = json.loads(done.stdout)
    except json.JSONDecodeError:
        raise Unreachable(f"pip-audit gave no report on {lock}: {done.stderr.strip()[-600:]}") from None
    return report


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lock", action="append", choices=[lock.name for lock in LOCKS])
    parser.add_argument("--service", choices=sorted(ADVISORY_HOST), default="pypi")
    args = parser.parse_args(argv)
    vulnerable = unaudited = total = 0
    for lock in args.lock or [lock.name for lock in LOCKS]:
        try:
            report = audit(lock, args.service)
        except Unreachable as exc:
            print(exc, file=sys.stderr)
            return 2
        for dep in report.get("dependencies", []):
            total += 1
            if "skip_reason" in dep:
                unaudited += 1
                print(f"{lock}: {dep['name']} {dep.get('version', '')}: not audited ({dep['skip_reason']})")
            for vuln in dep.get("vulns", []):
                vulnerable += 1
                fixed = ", ".join(vuln.get("fix_versions", [])) or "no fixed version yet"
                print(f"{lock}: {dep['name']} {dep['version']}: {vuln['id']} (fixed in {fixed})")
    print(f"{total} pins audited against {ADVISORY_HOST[args.service]}: {vulnerable} known vulnerabilities, "
          f"{unaudited} not looked up", file=sys.stderr)  # fmt: skip
    if vulnerable:
        return 1
    if unaudited:
        host = ADVISORY_HOST[args.service]
        print(f"the advisory source did not answer for every package: run `make audit` where {host} "
              "can be reached (docs/development.md)", file=sys.stderr)  # fmt: skip
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
