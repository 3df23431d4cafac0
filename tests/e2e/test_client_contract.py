"""A collector written from docs/protocol.md's client contract alone (tests/support/contract_client.py,
which imports nothing of this project) against a real control plane: it enrolls with the enroll
command's pin, publishes its driver, claims, verifies, runs and reports over the control socket
(settling protocol 7, whose frames bind their body's text) and over HTTPS, and rides out a link
that drops its socket, as the contract's transport table says."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import secrets
import shlex
from collections.abc import Callable
from typing import Any

import pytest
from versus.router.v1 import task_pb2

from tests.e2e.collector_harness import Platform
from tests.e2e.harness import ControlPlane
from tests.support.contract_client import PROVIDER, ContractCollector, Transport, enroll
from tests.support.tcp_proxy import CuttableProxy

pytestmark = pytest.mark.timeout(180)


def _enroll_command(issued: dict[str, Any]) -> tuple[str, str]:
    """The URL and the pin of the enroll command an operator copies from `tokens issue`."""
    argv = shlex.split(issued["enroll_command"])
    return argv[argv.index("--url") + 1], argv[argv.index("--ca-pin") + 1]


async def _run(platform: Platform, site_id: str, collector: ContractCollector, key: str) -> None:
    """One echo task, submitted, claimed, verified, run and reported; the platform sees the result."""
    params = {"hello": "wörld", "key": key}
    task_id = await asyncio.to_thread(
        platform.submit, site_id, "echo", "read", f"dev-{key}", params, key, provider=PROVIDER
    )
    for _ in range(5):
        if await collector.claim_once(wait_s=5) is not None:
            break
    task = await asyncio.to_thread(platform.wait_state, task_id, {"success", "failed", "expired"})
    assert task_pb2.TaskState.Name(task.state) == "TASK_STATE_SUCCESS", collector.refusals
    assert json.loads(task.result) == params


async def _until(predicate: Callable[[], bool], timeout_s: float = 60) -> None:
    async with asyncio.timeout(timeout_s):
        while not predicate():  # noqa: ASYNC110 - the client's record of its calls signals nothing
            await asyncio.sleep(0.1)


async def _scenario(cp: ControlPlane, platform: Platform) -> None:
    site_id = cp.api.create_site(f"site-contract-{secrets.token_hex(3)}")["site"]["site_id"]
    issued = cp.api.issue_token(site_id)
    url, pin = _enroll_command(issued)
    me = await enroll(url, pin, issued["plaintext"], f"contract-{secrets.token_hex(4)}")
    collector = ContractCollector(me)
    try:
        assert (await collector.publish())["accepted"] is True
        assert await collector.claim_once(wait_s=0.5) is None  # a 204, its headers read from the frame
        assert collector.transport.version == 7  # settled by the first claim, written in version 1
        await _run(platform, site_id, collector, f"wss-{secrets.token_hex(3)}")
        assert set(collector.transport.used) == {"wss"}
        assert all(r["state"] == "success" for r in collector.reports.values())
    finally:
        await collector.transport.close()

    collector.transport = Transport(me, socket=False)
    try:
        assert await collector.claim_once(wait_s=0.5) is None  # a 204 over HTTPS
        assert collector.transport.version == 7
        await _run(platform, site_id, collector, f"https-{secrets.token_hex(3)}")
        assert set(collector.transport.used) == {"https"}
    finally:
        await collector.transport.close()

    # Through a link that drops the socket: within its first 30 s, so HTTPS for a while (2 s here,
    # 60 s by the contract), then the socket again; nothing is lost on the way.
    proxy = CuttableProxy(int(url.rsplit(":", 1)[1]))
    via_proxy = dataclasses.replace(me, url=f"https://localhost:{proxy.port}")
    collector.transport = Transport(via_proxy, https_for_s=2)
    stop = asyncio.Event()
    serving = asyncio.create_task(collector.serve(stop, wait_s=3))
    try:
        await _until(lambda: "wss" in collector.transport.used)
        assert proxy.cut() >= 1
        key = f"cut-{secrets.token_hex(3)}"
        task_id = await asyncio.to_thread(
            platform.submit, site_id, "echo", "read", f"dev-{key}", {"k": key}, key, provider=PROVIDER
        )
        task = await asyncio.to_thread(platform.wait_state, task_id, {"success", "failed", "expired"})
        assert task_pb2.TaskState.Name(task.state) == "TASK_STATE_SUCCESS"
        used = collector.transport.used
        assert "https" in used[used.index("wss") :], used  # the drop sent it to HTTPS
        back = len(used)
        await _until(lambda: "wss" in collector.transport.used[back:])
        assert collector.fatal is None
    finally:
        stop.set()
        await serving
        await collector.transport.close()


def test_a_client_written_from_the_contract_alone_enrolls_claims_and_reports(
    shared_control_plane: ControlPlane,
) -> None:
    platform = Platform(shared_control_plane)
    try:
        asyncio.run(_scenario(shared_control_plane, platform))
    finally:
        platform.close()
