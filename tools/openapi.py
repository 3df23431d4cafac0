"""Write (or check) docs/openapi.json, the collector API's OpenAPI document.

python -m tools.openapi           # rewrite docs/openapi.json
python -m tools.openapi --check   # exit 1 if it is stale
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from gateway.app import GatewayConfig, create_app

OUT = Path(__file__).resolve().parent.parent / "docs" / "openapi.json"


def document() -> dict[str, Any]:
    app = create_app(GatewayConfig("postgresql://unused@localhost/x", "redis://localhost/0", "unused:1"))
    return app.openapi()


def render() -> str:
    return json.dumps(document(), indent=2, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if not OUT.exists() or OUT.read_text() != text:
            print("docs/openapi.json is stale; run python -m tools.openapi", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
