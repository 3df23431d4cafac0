"""pip-audit for real against the collector lock (tools/audit.py): every pin is either looked up
or reported as not looked up, and the exit status says which happened. Here, where PyPI's JSON
API does not answer, that is exit 2 with every package listed; where it answers, 0 or 1."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tools.locks import BY_NAME, ROOT, parse_lock

pytestmark = pytest.mark.timeout(300)


def test_the_collector_lock_is_audited_package_by_package() -> None:
    done = subprocess.run([sys.executable, "-m", "tools.audit", "--lock", "collector"], cwd=ROOT,
                          capture_output=True, text=True, timeout=280, check=False)  # fmt: skip
    summary = re.search(r"(\d+) pins audited against .*: (\d+) known vulnerabilities, (\d+) not looked up",
                        done.stderr)  # fmt: skip
    if summary is None:  # pip-audit could not even start asking
        assert done.returncode == 2 and "gave no report" in done.stderr, done.stderr
        return
    audited, vulnerable, unaudited = map(int, summary.groups())
    assert audited == len(parse_lock(BY_NAME["collector"].path.read_text()))
    assert done.returncode == (1 if vulnerable else 2 if unaudited else 0), done.stdout + done.stderr
    # Each package not looked up, and each advisory, on a line of its own.
    assert done.stdout.count(": not audited (") == unaudited
    assert done.stdout.count(" (fixed in ") == vulnerable
