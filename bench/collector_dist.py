"""The collector's own distribution: installed size and start-up time, beside the whole control plane.

    python -m bench.collector_dist [--runs 5] [--json FILE]      # make bench-collector-dist

Ours: the `versus-collector` wheel (tools/collector_dist.py) installed into a
new virtual environment; its size is everything in site-packages but pip and
setuptools. Start-up is the wall time of ``versus-collector --version`` and of
importing every module ``versus-collector run`` loads before its first request
(``collector.main``, ``collector.agent`` and the built-in drivers), best of
``--runs``.

Beside it, same run: the same measurements on this tree's development
environment (``.venv``: the control plane, which is what a collector host
carried before). The ratios say what a collector host saves.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tools.collector_dist import ROOT, build, clean_env, install_clean, installed_bytes

IMPORTS = "import collector.main, collector.agent, collector.drivers.ssh, collector.drivers.http"


def _best(argv: list[str], runs: int, cwd: Path) -> float:
    best = float("inf")
    for _ in range(runs):
        began = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True, env=clean_env(), cwd=cwd)
        best = min(best, time.perf_counter() - began)
    return best


def measure(python: Path, exe: Path, runs: int, cwd: Path) -> dict[str, float]:
    return {
        "version_s": _best([str(exe), "--version"], runs, cwd),
        "import_s": _best([str(python), "-c", IMPORTS], runs, cwd),
    }


def _env_facts(venv: Path, runs: int, cwd: Path) -> dict[str, float]:
    bin_dir = venv / "bin"
    return {"installed_mib": installed_bytes(venv) / 2**20,
            **measure(bin_dir / "python", bin_dir / "versus-collector", runs, cwd)}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-collector-dist-") as tmp:
        work = Path(tmp)
        venv = work / "venv"
        install_clean(build(work / "dist"), venv)
        ours = _env_facts(venv, args.runs, work)
        # The development environment (an editable install of this tree) runs this tree's collector.
        whole = _env_facts(ROOT / ".venv", args.runs, ROOT)
    result: dict[str, Any] = {
        "collector_wheel": ours,
        "control_plane_env": whole,
        "ratios": {k: ours[k] / whole[k] for k in ours},
        "python": sys.version.split()[0],
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
