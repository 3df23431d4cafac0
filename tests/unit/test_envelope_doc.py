"""docs/envelope.md's worked example agrees with the vectors."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_worked_example_matches_the_vector() -> None:
    doc = (ROOT / "docs" / "envelope.md").read_text()
    block = re.search(r"<!-- canonical-example:(\w+) -->\n```\n(.*?)```", doc, re.DOTALL)
    assert block is not None
    name, body = block.group(1), block.group(2)
    # Each line: length prefix, field bytes, then a comment.
    documented = "".join("".join(line.split()[:2]) for line in body.strip().splitlines())
    cases = {
        case["name"]: case
        for path in (ROOT / "vectors" / "envelope").glob("*.json")
        for case in json.loads(path.read_text())["cases"]
    }
    assert documented == cases[name]["canonical_hex"]
