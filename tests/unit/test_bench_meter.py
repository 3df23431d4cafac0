"""The benchmarks' CPU meter counts PostgreSQL backends that ended between its snapshots
(bench/measure.py): a pool that opens and closes connections under load must not hide their work."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

from bench.measure import REAPED, CpuMeter

# A stand-in postmaster: it starts a backend that burns CPU for a moment and reaps it once it ends.
POSTMASTER = """
import subprocess, sys, time
sys.stdin.readline()
burn = "import time\\nend = time.process_time() + 0.4\\nwhile time.process_time() < end: pass"
subprocess.run([sys.executable, "-c", burn])
print("reaped", flush=True)
time.sleep(60)
"""


def test_a_backend_that_ended_between_snapshots_is_counted(tmp_path: Path) -> None:
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    postmaster = subprocess.Popen(
        [sys.executable, "-c", POSTMASTER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        stack = SimpleNamespace(
            cp=SimpleNamespace(proc=idle),
            postgres=SimpleNamespace(pid=postmaster.pid),
            redis=SimpleNamespace(pid=0),
        )
        meter = CpuMeter(stack)  # type: ignore[arg-type]
        time.sleep(0.2)  # the interpreter's own start-up is before the first snapshot
        before = meter.snapshot()
        assert postmaster.stdin is not None and postmaster.stdout is not None
        postmaster.stdin.write("go\n")
        postmaster.stdin.flush()
        assert postmaster.stdout.readline().strip() == "reaped"
        after = meter.snapshot()
        assert REAPED in after["postgres"]
        # The backend's 0.4 s, though it neither existed at the first snapshot nor at the second.
        assert CpuMeter.delta(before, after)["postgres"] >= 0.35
    finally:
        for proc in (idle, postmaster):
            proc.kill()
            proc.communicate()
