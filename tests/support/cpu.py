"""CPU time per test, for finding what makes the suite slow on a 2-core machine
(docs/development.md, "Test time"): ``VERSUS_RECORD_CPU=FILE pytest ...`` writes each test's
CPU-seconds (setup, call and teardown; the test process and every child it waited for, so a
control plane counts when its `up` is stopped) to FILE as JSON, most expensive first. Each session
merges into FILE: ``VERSUS_RECORD_CPU=/tmp/cpu.json make test`` gives the whole suite."""

from __future__ import annotations

import fcntl
import json
import os
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

ENV = "VERSUS_RECORD_CPU"
_spent: defaultdict[str, float] = defaultdict(float)


def _cpu() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


_START = pytest.StashKey[float]()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if os.environ.get(ENV):
        item.stash[_START] = _cpu()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    if call.when == "teardown" and _START in item.stash:
        # On the teardown report, which reaches the controller from an xdist worker too.
        report: pytest.TestReport = outcome.get_result()  # type: ignore[attr-defined]
        report.user_properties.append(("cpu_s", _cpu() - item.stash[_START]))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    for name, value in report.user_properties:
        if name == "cpu_s" and report.when == "teardown":
            _spent[report.nodeid] += float(str(value))


def pytest_sessionfinish(session: pytest.Session) -> None:
    out = os.environ.get(ENV)
    if out and not os.environ.get("PYTEST_XDIST_WORKER") and _spent:
        path = Path(out)
        # Merged with what other sessions wrote there (`make test` runs three at once).
        with open(path.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            merged = json.loads(path.read_text()) if path.exists() else {}
            merged.update({k: round(v, 1) for k, v in _spent.items()})
            ordered = dict(sorted(merged.items(), key=lambda kv: -float(kv[1])))
            path.write_text(json.dumps(ordered, indent=1) + "\n")
