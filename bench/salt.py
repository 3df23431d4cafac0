"""SaltStack beside this project on the same machine: the field's outbound-agent remote execution.

    python -m bench.salt [--rounds 1] [--json bench/results/salt.json]      # make bench-salt

Runs the peer script (bench/peers/salt_peer.py, vendored unchanged) under Salt's own virtual
environment (``.venv-salt``, ``make salt-deps``: Salt pins its own dependencies): one salt-master
and up to 50 minions dialling out to it over ZeroMQ on loopback. It measures one-minion
``test.echo`` latency (call → return), jobs per second with 10 minions and one target per job
(≤ 64 outstanding), CPU per job of master and minions, and master memory with idle minions — the
rows docs/benchmarks.md sets beside ours (bench/latency.py, bench/throughput.py, bench/idle.py).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
from pathlib import Path

from bench.stack import save_report

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "peers" / "salt_peer.py"


def main() -> None:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--venv", type=Path, default=ROOT / ".venv-salt")
    parser.add_argument("--json", dest="json_path", default="bench/results/salt.json")
    args = parser.parse_args()
    python = args.venv / "bin" / "python"
    if not python.exists():
        raise SystemExit(f"no Salt environment at {args.venv}: run `make salt-deps`")
    done = subprocess.run(
        [str(python), str(SCRIPT), "--rounds", str(args.rounds)],
        env={**os.environ, "SALT_PEER_VENV": str(args.venv)}, capture_output=True, text=True, timeout=3600,
        check=True,
    )  # fmt: skip
    table = done.stdout.split("SALT_PEER_JSON ")[0].strip()
    print(table)
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith("SALT_PEER_JSON "))
    args.venv = str(args.venv)
    save_report(args.json_path, "none (Salt's processes run unpinned)", args, json.loads(line[15:]))


if __name__ == "__main__":
    main()
