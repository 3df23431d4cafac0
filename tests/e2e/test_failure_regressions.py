"""Correctness under failure, against real collector processes (docs/reliability.md).

Each test reproduces one way the control plane used to break a promise: a stale holder
writing after its lease passed on, a reconcile-read poisoning the journal, a Redis flush
turning healthy work into unknown outcomes, reads given up after three attempts, and a
permanent envelope refusal re-routed until the deadline. Safety is judged from the
devices' own files and the task as PostgreSQL holds it (through GetTask), never from
the router's memory of what it did.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import redis

from common.error_mapping import GRPC_CODE_METADATA_KEY
from tests.e2e.collector_harness import Collector, Platform, cli_json, wait_for
from tests.e2e.harness import ControlPlane, control_plane_for

pytestmark = pytest.mark.timeout(240)

SETTLED = {"success", "failed", "indeterminate", "expired", "cancelled"}


def _code(exc: grpc.RpcError) -> str:
    metadata: Any = exc.trailing_metadata() or ()
    return next((str(value) for key, value in metadata if key == GRPC_CODE_METADATA_KEY), "")


def _state_name(task: object) -> str:
    from versus.router.v1 import task_pb2

    return task_pb2.TaskState.Name(task.state).removeprefix("TASK_STATE_").lower()  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def cp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """One control plane for the module (each test brings its own site and collectors): starting
    one per test cost more than the tests themselves. Not the shared one: a test here flushes Redis."""
    yield from control_plane_for(tmp_path_factory, "control-plane")


def _collector(
    cp: ControlPlane, tmp_path: Path, name: str, site_id: str = "", shared: bool = False
) -> Collector:
    devices = tmp_path / "devices" if shared else None
    collector = Collector(cp, tmp_path / name, tmp_path / f"{name}.log", devices=devices)
    collector.enroll(site_id)
    return collector


def test_a_stale_holder_never_writes_after_its_lease_passed_on(cp: ControlPlane, tmp_path: Path) -> None:
    """SIGSTOP the holder of a mutation until the router gave up on it, then SIGCONT it."""
    a = _collector(cp, tmp_path, "a", shared=True)
    b = _collector(cp, tmp_path, "b", site_id=a.site_id, shared=True)
    platform = Platform(cp)
    try:
        a.start()
        # The stub waits 3 s between accepting the task and writing: A is frozen in between.
        first = platform.submit(a.site_id, "append", "mutate_reconcilable", "dev-f", {"hold": 3}, "fence-1",
                                deadline_s=12)  # fmt: skip
        platform.wait_state(first, {"dispatched", "running"})
        a.signal(signal.SIGSTOP)
        # The deadline passes while A is silent: nobody can know, an operator decides.
        assert _state_name(platform.wait_state(first, SETTLED, timeout=60)) == "indeterminate"
        b.start()
        # The device is fenced while A's envelope could still run: a second writer is refused.
        with pytest.raises(grpc.RpcError) as refused:
            platform.submit(a.site_id, "append", "mutate_reconcilable", "dev-f", {}, "fence-2")
        assert _code(refused.value) == "device_leased"
        assert "fenced until" in str(refused.value.details())
        a.signal(signal.SIGCONT)
        # A wakes up past its window: it must not touch the device.
        wait_for(lambda: "envelope window passed before the device write" in a.log(), timeout=30)
        assert "fence-1" not in a.device("dev-f")
        # Once the fence has passed, the second mutation runs (on either collector).
        second = ""
        deadline = time.monotonic() + 90
        while not second and time.monotonic() < deadline:
            try:
                second = platform.submit(a.site_id, "append", "mutate_reconcilable", "dev-f", {}, "fence-2")
            except grpc.RpcError as exc:
                assert _code(exc) == "device_leased"
                time.sleep(1)
        assert _state_name(platform.wait_state(second, SETTLED)) == "success"
        time.sleep(2)
        assert a.device("dev-f") == ["fence-2"]
        writes = a.writes("dev-f")
        assert [w["key"] for w in writes] == ["fence-2"]
        assert all(w["at"] <= w["expires_at"] + 1 for w in writes)  # every write inside its window
    finally:
        if a.proc is not None and a.proc.poll() is None:
            a.signal(signal.SIGCONT)
        a.stop()
        b.stop()
        platform.close()


def test_a_reconcile_read_does_not_poison_the_retry(cp: ControlPlane, tmp_path: Path) -> None:
    """One collector: killed before its write, it reports unknown; the reconcile-read says "not
    applied" and the retry, on the same collector, must run rather than replay that answer."""
    collector = _collector(cp, tmp_path, "solo")
    platform = Platform(cp)
    try:
        collector.start()
        task_id = platform.submit(collector.site_id, "append", "mutate_reconcilable", "dev-r", {"hold": 3},
                                  "recon-1")  # fmt: skip
        platform.wait_state(task_id, {"dispatched", "running"})
        time.sleep(0.5)
        collector.kill()
        assert collector.device("dev-r") == []
        collector.start()
        task = platform.wait_state(task_id, SETTLED, timeout=90)
        assert (_state_name(task), task.attempts) == ("success", 2)
        assert collector.device("dev-r") == ["recon-1"]  # applied exactly once, by the retry
    finally:
        collector.stop()
        platform.close()


def test_redis_flush_costs_no_outcome(cp: ControlPlane, tmp_path: Path) -> None:
    """FLUSHALL while a terminal mutation runs: liveness is unknown, not dead; the task succeeds."""
    collector = _collector(cp, tmp_path, "flush")
    platform = Platform(cp)
    client = redis.Redis.from_url(f"unix://{cp.state_dir / 'redis' / 'redis.sock'}")
    try:
        # The default long-poll: after the flush the collector's next heartbeat is up to 25 s away,
        # and the sweeper (every 5 s) looks at its work in between.
        collector.start("--claim-wait", "25")
        task_id = platform.submit(collector.site_id, "apply_once", "mutate_terminal", "dev-x", {"sleep": 15},
                                  "flush-1")  # fmt: skip
        wait_for(lambda: collector.device("dev-x") == ["flush-1"])  # applied, report not sent yet
        client.flushall()
        seen = set()
        deadline = time.monotonic() + 60
        state = ""
        while time.monotonic() < deadline:
            state = _state_name(platform.task(task_id).task)
            seen.add(state)
            if state in SETTLED:
                break
            time.sleep(0.2)
        assert state == "success", f"states seen: {sorted(seen)}"
        assert not seen & {"unknown", "reconciling", "indeterminate"}
        assert "report refused" not in collector.log()
        assert collector.device("dev-x") == ["flush-1"]
    finally:
        client.close()
        collector.stop()
        platform.close()


def test_reads_are_retried_until_they_succeed(cp: ControlPlane, tmp_path: Path) -> None:
    """A read interrupted four times (more than the reconcile bound) is still retried."""
    collector = _collector(cp, tmp_path, "reader")
    platform = Platform(cp)
    try:
        collector.start()
        task_id = platform.submit(collector.site_id, "echo", "read", "dev-e", {"sleep": 3}, "read-1")
        for attempt in range(1, 5):

            def running(n: int = attempt) -> bool:
                task = platform.task(task_id).task
                return bool(task.attempts == n and _state_name(task) in ("dispatched", "running"))

            wait_for(running, timeout=60)
            time.sleep(0.3)
            collector.kill()
            collector.start()
        task = platform.wait_state(task_id, SETTLED, timeout=90)
        assert _state_name(task) == "success"
        assert task.attempts == 5
    finally:
        collector.stop()
        platform.close()


def test_a_permanent_refusal_ends_the_task_at_once(cp: ControlPlane, tmp_path: Path) -> None:
    """A collector that does not trust the signing key refuses every envelope: the task fails with
    that code after one attempt instead of being handed out again until its deadline."""
    collector = _collector(cp, tmp_path, "untrusting")
    keys_path = collector.state / "keys.json"
    keys = json.loads(keys_path.read_text())
    for key in keys["dispatch"]:
        key["kid"] = "not-" + key["kid"]
    keys_path.write_text(json.dumps(keys))
    platform = Platform(cp)
    try:
        collector.start()
        task_id = platform.submit(collector.site_id, "echo", "read", "dev-k", {}, "kid-1", deadline_s=120)
        task = platform.wait_state(task_id, SETTLED, timeout=20)
        assert (_state_name(task), task.error_code, task.attempts) == (
            "failed",
            "envelope_refused:unknown_kid",
            1,
        )
    finally:
        collector.stop()
        platform.close()


def test_policy_is_honoured_and_a_busy_collector_keeps_its_heartbeat(
    cp: ControlPlane, tmp_path: Path
) -> None:
    """policy.max_concurrency lowers the driver's concurrency (and the manifest); with its only
    slot busy the collector still claims every heartbeat interval, asking for nothing."""
    collector = _collector(cp, tmp_path, "policy")
    policy_path = collector.state / "policy.json"
    policy = json.loads(policy_path.read_text())
    policy.update({"max_concurrency": {"*": 1}, "heartbeat_interval_s": 1})
    policy_path.write_text(json.dumps(policy))
    platform = Platform(cp)
    try:
        collector.start("--claim-wait", "25")
        first = platform.submit(collector.site_id, "echo", "read", "dev-p1", {"sleep": 6}, "busy-1")
        platform.wait_state(first, {"dispatched", "running"})
        second = platform.submit(collector.site_id, "echo", "read", "dev-p2", {}, "busy-2")
        claims = set()
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:
            claims.add(collector.runtime().get("last_claim_at"))
            time.sleep(0.2)
        # Busy, yet claiming about every second (the policy's interval, not the 25 s asked for)...
        assert len(claims) >= 3, claims
        # ... and not handed the second task while its one slot is taken.
        assert _state_name(platform.task(second).task) in ("leased", "queued")
        assert _state_name(platform.wait_state(first, SETTLED)) == "success"
        assert _state_name(platform.wait_state(second, SETTLED, timeout=20)) == "success"
    finally:
        collector.stop()
        platform.close()


def test_an_inconclusive_reconcile_read_is_asked_again_before_an_operator_decides(
    cp: ControlPlane, tmp_path: Path
) -> None:
    """The device applies the change but will not confirm it, and the check cannot tell: the
    router asks the reconcile-read three times (the bound), never retries blind, then waits for an
    operator."""
    collector = _collector(cp, tmp_path, "inconclusive")
    platform = Platform(cp)
    try:
        collector.start()
        params = {"unclear": True, "check_error": True}
        task_id = platform.submit(
            collector.site_id, "append", "mutate_reconcilable", "dev-i", params, "inc-1"
        )
        task = platform.wait_state(task_id, SETTLED, timeout=60)
        assert _state_name(task) == "indeterminate"
        assert task.attempts == 1  # never retried blind
        dispatches = cli_json(["queue", "list", "--target", "dev-i"], cp.env)["dispatches"]
        kinds = sorted(d["kind"] for d in dispatches)
        assert kinds == ["execute", "reconcile", "reconcile", "reconcile"], kinds
        assert collector.device("dev-i") == ["inc-1"]  # applied once, by the only attempt
    finally:
        collector.stop()
        platform.close()
