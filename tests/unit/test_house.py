"""The tree stays one a newcomer can find their way in: modules of a readable size, the layout
table of docs/architecture.md naming exactly the packages that exist; and one asyncio pitfall
kept out of the product code."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 500
# Copied unchanged from the shared peer scripts (bench/salt.py runs it under Salt's own venv):
# not ours to split.
VENDORED = {"bench/peers/salt_peer.py"}


def _tracked(pattern: str) -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", pattern],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return [p for p in out if (ROOT / p).exists()]


def test_no_hand_written_module_is_over_the_limit() -> None:
    long = {
        path: n
        for path in _tracked("*.py")
        if not path.startswith(("gen/", "tests/")) and path not in VENDORED
        if (n := len((ROOT / path).read_text().splitlines())) > MAX_LINES
    }
    assert long == {}


def _packages() -> set[str]:
    return {
        str(Path(p).parent) + "/" for p in _tracked("*__init__.py") if not p.startswith(("gen/", "tests/"))
    }


def _layout_rows() -> set[str]:
    text = (ROOT / "docs" / "architecture.md").read_text()
    table = text.split("## Code layout", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `([^`]+/)` \|", table, re.M))


def test_the_layout_table_lists_every_package() -> None:
    assert _packages() - _layout_rows() == set()


def test_every_folder_the_layout_table_names_exists() -> None:
    missing = {row for row in _layout_rows() if not (ROOT / row.split("<", 1)[0]).is_dir()}
    assert missing == set()


# Services, the collector and the chaos tools; not tests, benchmarks or tools run once.
PRODUCT = ("common/", "router/", "gateway/", "enrollment/", "console/", "collector/", "versus_cp/", "chaos/")


def test_no_product_code_bounds_a_wait_with_wait_for() -> None:
    # Python 3.11's asyncio.wait_for returns the awaited result when a cancel lands in the turn it
    # completes, and the cancel is lost: a router's shutdown once waited forever on a listener
    # that went on listening (tests/integration/test_keyed_fanout.py). asyncio.timeout does not.
    using = [
        p for p in _tracked("*.py") if p.startswith(PRODUCT) and "asyncio.wait_for(" in (ROOT / p).read_text()
    ]
    assert using == []
