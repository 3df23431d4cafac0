"""Concurrent test workers never share a port range (tests/support/ports.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support.ports import EACH, START, claim_range


def test_each_claim_gets_a_range_no_holder_shares_until_none_is_left(tmp_path: Path) -> None:
    first = claim_range(START + 3 * EACH, tmp_path)
    second = claim_range(START + 3 * EACH, tmp_path)
    third = claim_range(START + 3 * EACH, tmp_path)
    assert (first, second, third) == (
        (START, START + EACH - 1), (START + EACH, START + 2 * EACH - 1),
        (START + 2 * EACH, START + 3 * EACH - 1),
    )  # fmt: skip
    assert claim_range(START + 3 * EACH, tmp_path) is None  # all held: the kernel picks ports


def test_another_process_skips_a_held_range_and_gets_it_once_its_holder_is_gone(tmp_path: Path) -> None:
    def claim_elsewhere() -> str:
        code = (
            "from pathlib import Path; from tests.support.ports import claim_range; "
            f"print(claim_range({START + 2 * EACH}, Path({str(tmp_path)!r})))"
        )
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout

    assert claim_elsewhere().strip() == str((START, START + EACH - 1))  # its holder exited: free again
    assert claim_range(START + 2 * EACH, tmp_path) == (START, START + EACH - 1)
    assert claim_elsewhere().strip() == str((START + EACH, START + 2 * EACH - 1))
