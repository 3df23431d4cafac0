"""Credential revocation's pure parts: names, states, and what a collector does to a running task
(docs/protocol.md, "Credential revocation")."""

from __future__ import annotations

import asyncio

import pytest

from collector.drivers.base import CredentialRevoked, HeldCredential, Outcome, Task
from collector.running import RunningTasks
from common.errors import InvalidArgument
from router.credentials.revocations import overall, parse_ref, target_state


def test_a_credential_is_named_by_provider_and_device() -> None:
    assert parse_ref("ssh:core-sw-1") == ("ssh", "core-sw-1")
    assert parse_ref("http:dev:with:colons") == ("http", "dev:with:colons")
    for bad in ("ssh", ":dev", "ssh:", "", "ssh:dev\n", "x:" + "d" * 300):
        with pytest.raises(InvalidArgument) as refused:
            parse_ref(bad)
        assert refused.value.code == "credential_ref_invalid"


def test_states_from_answers_and_targets() -> None:
    assert target_state({"d1": "scrubbed", "d2": "not_held", "d3": "killed"}) == ("revoked", "")
    state, detail = target_state({"d1": "scrubbed", "d2": "failed: OSError"})
    assert state == "failed" and "d2: failed: OSError" in detail
    assert overall([]) == "revoked"  # nothing held it
    assert overall(["revoked", "pending"]) == "pending"
    assert overall(["revoked", "unreachable", "pending"]) == "unreachable"
    assert overall(["failed", "unreachable"]) == "failed"


def test_a_held_credential_is_readable_until_scrubbed_and_never_shown() -> None:
    held = HeldCredential({"token": "s3cret"})
    assert held["token"] == "s3cret" and dict(held) == {"token": "s3cret"}
    assert "s3cret" not in repr(held)
    held.scrub()
    assert len(held) == 0
    with pytest.raises(CredentialRevoked):
        held["token"]


async def _running(tasks: RunningTasks, task: Task, pause_s: float) -> asyncio.Task[Outcome]:
    async def uses_it_twice() -> Outcome:
        secret = task.hold({"token": "s3cret"})
        await task.pause(pause_s)
        return Outcome("success", str(secret["token"]).encode())

    run = asyncio.ensure_future(tasks.run(task, uses_it_twice(), 60, read=True))
    while not task.held:  # noqa: ASYNC110 - waits for the driver to take its credential
        await asyncio.sleep(0.01)
    return run


async def test_scrub_wipes_what_the_task_holds_and_kill_also_stops_it() -> None:
    tasks = RunningTasks()
    scrubbed, killed = Task("d1", "echo", "dev", "k1", b"", 1), Task("d2", "echo", "dev", "k2", b"", 1)
    first, second = await _running(tasks, scrubbed, 0.5), await _running(tasks, killed, 30)
    assert tasks.revoke("rev-1", ["d1", "d-gone"], kill=False) == {"d1": "scrubbed", "d-gone": "not_held"}
    assert scrubbed.held[0].revoked and not first.done()  # it runs on without the credential
    assert tasks.revoke("rev-2", ["d2"], kill=True) == {"d2": "killed"}
    async with asyncio.timeout(5):
        stopped = await second
    assert (stopped.status, stopped.error_code) == ("failed", "credential_revoked") and killed.stop.forced
    # The scrubbed task fails when it needs the credential again.
    async with asyncio.timeout(5):
        failed = await first
    assert (failed.status, failed.error_code) == ("failed", "credential_revoked")


async def test_a_revocation_carried_again_answers_what_was_done_the_first_time() -> None:
    # A revocation is carried on every claim until its ack is recorded: the second delivery of a
    # kill found the task gone and answered "not_held", and the control plane kept that answer.
    tasks = RunningTasks()
    task = Task("d1", "echo", "dev", "k1", b"", 1)
    run = await _running(tasks, task, 30)
    assert tasks.revoke("rev-k", ["d1"], kill=True) == {"d1": "killed"}
    async with asyncio.timeout(5):
        await run
    assert "d1" not in tasks
    assert tasks.revoke("rev-k", ["d1"], kill=True) == {"d1": "killed"}
    assert tasks.revoke("rev-other", ["d1"], kill=True) == {"d1": "not_held"}


async def test_a_task_that_took_no_credential_is_not_held() -> None:
    tasks = RunningTasks()
    task = Task("d1", "echo", "dev", "k", b"", 1)
    run = asyncio.ensure_future(tasks.run(task, asyncio.sleep(30, Outcome("success")), 60, read=True))
    while "d1" not in tasks:  # noqa: ASYNC110 - waits for the run to register
        await asyncio.sleep(0.01)
    assert tasks.revoke("rev-1", ["d1"], kill=True) == {"d1": "not_held"}
    assert not run.done()
    run.cancel()
