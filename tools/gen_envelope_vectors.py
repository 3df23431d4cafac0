"""Regenerate vectors/envelope/*.json deterministically.

    python -m tools.gen_envelope_vectors          # rewrite the files
    python -m tools.gen_envelope_vectors --check  # exit 1 if the committed files differ

Keys come from fixed seeds and Ed25519 signatures are deterministic, so the
output is identical on every run. Each case's ``canonical_hex`` is what a
verifier computes from the case's envelope ("" when the envelope cannot be
decoded); see vectors/envelope/README.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from tools import envelope_case_kit as kit
from tools.envelope_cases import limit_cases, malformed_cases, rule_cases, valid_cases

OUT_DIR = Path(__file__).resolve().parent.parent / "vectors" / "envelope"
FORMAT = "versus-envelope-vectors/1"


def documents() -> dict[str, dict[str, Any]]:
    keys = [kit.key_json(k) for k in kit.ALL_KEYS]
    return {
        "v1-valid.json": {"format": FORMAT, "keys": keys, "cases": valid_cases()},
        "v1-rules.json": {"format": FORMAT, "keys": keys, "cases": rule_cases()},
        "v1-malformed.json": {"format": FORMAT, "keys": keys, "cases": malformed_cases()},
        "v1-limits.json": {"format": FORMAT, "keys": keys, "cases": limit_cases()},
    }


def render(doc: dict[str, Any]) -> str:
    return json.dumps(doc, ensure_ascii=False, indent=1) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    stale = []
    for name, doc in documents().items():
        path = OUT_DIR / name
        text = render(doc)
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
    if stale:
        print(f"stale vectors: {', '.join(stale)}; run python -m tools.gen_envelope_vectors", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
