"""Per-feature protocol floors (placement), resume verdicts, how a collector stops a task on a cancel,
and how it streams a task's output over a failing link: code above the adapters, fed values
(docs/protocol.md)."""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from collector import output as output_module
from collector.drivers.base import DriverContext, Outcome, Task
from collector.drivers.stub import StubDriver, dump_blocks
from collector.gateway_errors import GatewayRefused, GatewayUnavailable
from collector.output import TaskOutput, UploadFailed, saved_digest
from collector.running import RunningTasks, stopped_outcome
from common import protocol
from common.errors import InvalidArgument
from router.dispatch import placement
from router.dispatch.cancels import Verdict, verdict
from router.dispatch.placement import Candidate, OperationCap, PlacementRequest, ProviderCap
from router.dispatch.submit import SubmitRequest, fingerprint, validate
from router.output.streams import Appended, place

NOW = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)


def _cand(cid: str, version: int, **kw: Any) -> Candidate:
    ops = {"echo": OperationCap("read")}
    values: dict[str, Any] = {
        "collector_id": cid, "site_id": "s1", "tenant_id": "t1", "active": True, "draining": False,
        "live": True, "fips": False, "providers": {"stub": ProviderCap(4, ops)}, "protocol": version,
    }  # fmt: skip
    values.update(kw)
    return Candidate(**values)


def _req(*features: str) -> PlacementRequest:
    return PlacementRequest("stub", "echo", "read", "s1", "t1", "dev-1", features=tuple(features))


# --- floors -----------------------------------------------------------------------------------------
def test_every_feature_has_a_floor_within_the_versions_this_build_speaks() -> None:
    assert protocol.FEATURE_FLOORS, "at least one feature has a floor"
    for feature, floor in protocol.FEATURE_FLOORS.items():
        assert protocol.MIN_PROTOCOL_VERSION < floor <= protocol.PROTOCOL_VERSION, feature
        assert feature in protocol.HISTORY[floor], f"the history of version {floor} names {feature}"


def test_an_unknown_feature_is_refused_with_the_known_ones_named() -> None:
    with pytest.raises(InvalidArgument) as refused:
        protocol.floor_of("teleport")
    assert refused.value.code == "feature_unknown"
    assert "cancel" in refused.value.message
    assert protocol.check_features(["cancel", "cancel"]) == ("cancel",)
    assert protocol.features_floor(()) == (1, "")
    assert protocol.features_floor(["cancel"]) == (3, "cancel")


def test_a_task_needing_a_feature_goes_only_to_collectors_at_its_floor() -> None:
    old, new = _cand("old", 1), _cand("new", 3)
    assert [c.collector_id for c in placement.eligible(_req("cancel"), [old, new])] == ["new"]
    # Everything else still runs on the old collector: the floor is a placement rule.
    assert {c.collector_id for c in placement.eligible(_req(), [old, new])} == {"old", "new"}


def test_the_condition_names_the_floor_only_when_the_floor_is_what_keeps_the_task_waiting() -> None:
    assert placement.shortfall(_req("cancel"), [_cand("old", 2)]) == "needs protocol ≥ 3 for cancel"
    # A collector at the floor exists (merely busy): the floor is not the reason.
    busy = _cand("new", 3, in_flight={"stub": 4})
    assert placement.shortfall(_req("cancel"), [_cand("old", 2), busy]) is None
    # No collector would take it even at the floor (none live): not the floor either.
    assert placement.shortfall(_req("cancel"), [_cand("old", 2, live=False)]) is None
    assert placement.shortfall(_req(), [_cand("old", 1)]) is None


def test_submitted_features_are_validated_and_part_of_the_request_fingerprint() -> None:
    base = SubmitRequest("stub", "echo", "read", "dev-1", "s1", "t1", b"", "k1", NOW + dt.timedelta(hours=1))
    validate(base, NOW)
    with_cancel = SubmitRequest(**{**_fields(base), "features": ("cancel",)})
    validate(with_cancel, NOW)
    assert fingerprint(with_cancel) != fingerprint(base)
    unsorted = SubmitRequest(**{**_fields(base), "features": ("cancel", "cancel")})
    with pytest.raises(InvalidArgument) as refused:
        validate(unsorted, NOW)
    assert refused.value.code == "features_invalid"


def _fields(req: SubmitRequest) -> dict[str, Any]:
    return {name: getattr(req, name) for name in SubmitRequest.__dataclass_fields__}


# --- resume verdicts ----------------------------------------------------------------------------------
def _held(**kw: Any) -> dict[str, Any]:
    row = {
        "dispatch_id": "d1", "kind": "execute", "state": "running", "reported_at": None,
        "task_state": "running", "current_dispatch_id": "d1", "cancel_requested_at": None,
    }  # fmt: skip
    row.update(kw)
    return row


def test_verdicts_on_held_tasks() -> None:
    assert verdict(_held()) is Verdict.CONTINUE
    assert verdict(_held(cancel_requested_at=NOW)) is Verdict.CANCEL
    # Nobody waits for it: unknown here, moved to another dispatch, or the task ended.
    assert verdict(None) is Verdict.TERMINATE
    assert verdict(_held(current_dispatch_id="d2", task_state="dispatched")) is Verdict.TERMINATE
    assert verdict(_held(state="unknown", task_state="reconciling")) is Verdict.TERMINATE
    assert verdict(_held(task_state="cancelled")) is Verdict.TERMINATE
    # Already answered: its report is on its way again.
    assert verdict(_held(state="success", reported_at=NOW, task_state="success")) is Verdict.CONTINUE
    # A reconcile-read decides how the task ends, cancel or not.
    reconcile = _held(kind="reconcile", task_state="reconciling", cancel_requested_at=NOW)
    assert verdict(reconcile) is Verdict.CONTINUE


# --- stopping a task on the collector -----------------------------------------------------------------
def test_what_a_stopped_task_reports_depends_on_whether_its_writes_began() -> None:
    task = Task("d1", "append", "dev", "k", b"", 1)
    assert stopped_outcome(task, read=False).status == "cancelled"
    task.stop.writes_started = True
    unclear = stopped_outcome(task, read=False)
    assert (unclear.status, unclear.error_code) == ("unknown", "cancelled_mid_change")
    assert stopped_outcome(task, read=True).status == "cancelled"


def _stub_task(tmp_path: Path, operation: str, **params: float) -> tuple[StubDriver, Task]:
    driver = StubDriver(DriverContext(tmp_path))
    return driver, Task("d1", operation, "dev", "key-1", json.dumps(params).encode(), 1)


async def _cancel_soon(running: RunningTasks, verdicts: dict[str, str], grace_s: float) -> None:
    while "d1" not in running:  # noqa: ASYNC110 - polls the registry the code under test fills
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)
    running.apply(verdicts, grace_s)


@pytest.mark.parametrize(
    ("operation", "params", "read", "status", "applied"),
    [
        ("echo", {"sleep": 30}, True, "cancelled", 0),
        # Stopped while holding before its write: the device is untouched.
        ("append", {"hold": 30}, False, "cancelled", 0),
        # Stopped after its write, before the device confirmed: the outcome is unknown.
        ("append", {"sleep": 30}, False, "unknown", 1),
    ],
)
async def test_a_cooperative_driver_stops_at_once_on_a_cancel(
    tmp_path: Path, operation: str, params: dict[str, float], read: bool, status: str, applied: int
) -> None:
    driver, task = _stub_task(tmp_path, operation, **params)
    running = RunningTasks()
    stopper = asyncio.ensure_future(_cancel_soon(running, {"d1": "cancel"}, grace_s=30))
    async with asyncio.timeout(5):  # far below the 30 s the driver would otherwise take
        outcome = await running.run(task, driver.execute(task), 60, read)
    await stopper
    assert outcome.status == status
    assert not task.stop.forced
    device = driver.device("dev")
    assert (device.read_text().splitlines() if device.exists() else []).count("key-1") == applied


async def test_a_driver_that_ignores_the_cancel_is_stopped_by_force_after_the_grace() -> None:
    async def stubborn() -> Outcome:
        await asyncio.sleep(30)  # not Task.pause: deaf to the stop signal
        return Outcome("success")

    task = Task("d1", "echo", "dev", "k", b"", 1)
    running = RunningTasks()
    stopper = asyncio.ensure_future(_cancel_soon(running, {"d1": "cancel"}, grace_s=0.2))
    async with asyncio.timeout(5):
        outcome = await running.run(task, stubborn(), 60, read=True)
    await stopper
    assert task.stop.forced and outcome.status == "cancelled"
    assert "by force" in outcome.error_message


async def test_terminate_stops_at_once_and_continue_changes_nothing() -> None:
    async def slow() -> Outcome:
        await asyncio.sleep(0.3)
        return Outcome("success", b"done")

    task = Task("d1", "echo", "dev", "k", b"", 1)
    running = RunningTasks()
    stopper = asyncio.ensure_future(_cancel_soon(running, {"d1": "continue", "other": "terminate"}, 0.1))
    assert await running.run(task, slow(), 60, read=True) == Outcome("success", b"done")
    await stopper
    task = Task("d1", "echo", "dev", "k", b"", 1)
    stopper = asyncio.ensure_future(_cancel_soon(running, {"d1": "terminate"}, grace_s=30))
    async with asyncio.timeout(5):
        outcome = await running.run(task, asyncio.sleep(30, Outcome("success")), 60, read=True)
    await stopper
    assert task.stop.forced and outcome.status == "cancelled"
    assert len(running) == 0


# --- streamed output on the collector -----------------------------------------------------------------
class FlakyServer:
    """The control plane's rules for output (router/output/streams.py ``place``), over a link that fails: some
    requests never arrive, some answers are lost after the chunk was stored."""

    def __init__(self) -> None:
        self.stored = bytearray()
        self.calls = 0

    async def send(self, dispatch_id: str, offset: int, data: bytes) -> int:
        self.calls += 1
        if self.calls % 5 == 1:
            raise GatewayUnavailable("the request never arrived")
        where = place(offset, len(self.stored))
        if where is not Appended.APPENDED:
            raise GatewayRefused(409, f"output_{where.value}", "resume", {"acked": len(self.stored)})
        self.stored += data
        if self.calls % 5 == 3:
            raise GatewayUnavailable("stored, but the answer was lost")
        return len(self.stored)


async def test_an_output_reaches_the_control_plane_whole_across_lost_requests_and_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(output_module, "CHUNK", 1000)
    server = FlakyServer()
    out = TaskOutput(tmp_path, "d1", server.send, max_backoff_s=0.01)
    written = hashlib.sha256()
    for block in dump_blocks("seed", 25_000, block=777):
        await out.write(block)
        written.update(block)
    async with asyncio.timeout(10):
        length, sha = await out.finish()
    assert (length, sha) == (25_000, written.hexdigest())
    assert hashlib.sha256(server.stored).hexdigest() == sha
    assert server.calls > 25  # every lost request and answer was made good
    out.remove()
    assert not any((tmp_path / "output").iterdir())


async def test_a_refused_output_stops_the_upload_and_says_why(tmp_path: Path) -> None:
    async def quota(dispatch_id: str, offset: int, data: bytes) -> int:
        raise GatewayRefused(429, "output_quota_exceeded", "the tenant holds too much output")

    out = TaskOutput(tmp_path, "d2", quota)
    await out.write(b"x" * 10)
    with pytest.raises(UploadFailed) as failed:
        await out.finish()
    assert failed.value.code == "output_quota_exceeded"


async def test_a_task_that_writes_no_output_creates_nothing(tmp_path: Path) -> None:
    async def never(dispatch_id: str, offset: int, data: bytes) -> int:
        raise AssertionError("nothing to send")

    out = TaskOutput(tmp_path, "d3", never)
    assert not out.started and not (tmp_path / "output").exists()


async def test_a_finished_upload_leaves_its_digest_for_a_report_resent_after_a_restart(
    tmp_path: Path,
) -> None:
    server = FlakyServer()
    server.calls = 1  # no lost requests for this one
    out = TaskOutput(tmp_path, "d4", server.send)
    await out.write(b"abc" * 100)
    digest = await out.finish()
    # A collector restarted before its report was acknowledged reports the same output.
    assert saved_digest(tmp_path, "d4") == digest == (300, hashlib.sha256(b"abc" * 100).hexdigest())
    out.remove()
    assert saved_digest(tmp_path, "d4") is None
