"""Two `versus-cp router` processes on one database: one writer per device, one claim per dispatch."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import IO, Any

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp
from sqlalchemy import insert, select
from versus.router.v1 import collector_bridge_pb2 as bpb
from versus.router.v1 import collector_bridge_pb2_grpc, task_pb2, task_router_pb2_grpc
from versus.router.v1 import task_router_pb2 as pb

from common.access.rbac import Role
from common.db import engine as db_engine
from common.db.schema import collectors, sites, tasks
from common.envelope.verify import VerifyContext, verify
from common.grpc.client import aio_channel
from common.trust.keys import KeyPurpose, trusted
from common.trust.keystore import KeyStore
from tests.e2e.harness import service_env, wait_grpc_serving
from tests.support.access import mint_at
from tests.support.collector_key import PUBLIC_DER, signed

pytestmark = pytest.mark.timeout(180)

DEVICES = [f"sw-{i}" for i in range(5)]
COLLECTORS = [f"col-{i}" for i in range(4)]
SUBMITTERS, TASKS_EACH = 20, 2


class _NoJournal:
    def lookup(self, idempotency_key: str) -> None:
        return None


async def _seed(database_url: str) -> None:
    engine = db_engine.create_async(database_url)
    async with engine.begin() as conn:
        await conn.execute(insert(sites).values(site_id="site-x", name="x", tenant_id="t"))
        for cid in COLLECTORS:
            await conn.execute(
                insert(collectors).values(
                    collector_id=cid, site_id="site-x", tenant_id="t", status="active",
                    public_key_der=PUBLIC_DER, public_key_sha256=b"h", cert_pem="", cert_serial="1",
                    cert_not_after=dt.datetime.now(dt.UTC) + dt.timedelta(days=1),
                )
            )  # fmt: skip
    await engine.dispose()


def _start_router(env: dict[str, str], log_path: Path) -> tuple[subprocess.Popen[bytes], IO[bytes]]:
    log = open(log_path, "wb")  # noqa: SIM115 - closed by the test
    return subprocess.Popen(
        [sys.executable, "-m", "versus_cp", "router"], env=env, stdout=log, stderr=log
    ), log


async def test_two_router_processes(tmp_path: Path, database_url: str, redis_url: str) -> None:
    await _seed(database_url)
    state = tmp_path / "state"
    procs, ports = [], []
    for i in range(2):
        env = service_env(state, DATABASE_URL=database_url, REDIS_URL=redis_url)
        ports.append(int(env["VERSUS_ROUTER_PORT"]))
        procs.append(_start_router(env, tmp_path / f"router{i}.log"))
    try:
        for (proc, _), port in zip(procs, ports, strict=True):
            wait_grpc_serving(port, proc)
        keys = trusted(KeyStore(state, KeyPurpose.DISPATCH).load().public_keys(int(time.time())))
        platform, service = (
            await mint_at(database_url, Role.PLATFORM),
            await mint_at(database_url, Role.SERVICE),
        )
        platform_channels = [aio_channel(f"127.0.0.1:{p}", platform) for p in ports]
        service_channels = [aio_channel(f"127.0.0.1:{p}", service) for p in ports]
        channels = [*platform_channels, *service_channels]
        routers = [task_router_pb2_grpc.TaskRouterServiceStub(c) for c in platform_channels]
        bridges = [collector_bridge_pb2_grpc.CollectorBridgeServiceStub(c) for c in service_channels]
        manifest = [bpb.ProviderCapability(provider="stub", max_concurrency=2, operations=[
            bpb.OperationCapability(name="set", op_class=task_pb2.OP_CLASS_MUTATE_TERMINAL)])]  # fmt: skip
        for i, cid in enumerate(COLLECTORS):
            await bridges[i % 2].PublishCapabilities(
                bpb.PublishCapabilitiesRequest(collector_id=cid, capability_epoch=1, providers=manifest)
            )

        writing: dict[str, str] = {}
        claimed: list[str] = []
        violations: list[str] = []
        stop = asyncio.Event()

        async def collector(index: int, cid: str) -> None:
            seq = 0
            while not stop.is_set():
                seq += 1
                bridge = bridges[(index + seq) % 2]
                reply = await bridge.Claim(
                    bpb.ClaimRequest(collector_id=cid, claim_seq=0, wait=Duration(nanos=200_000_000))
                )
                if not reply.HasField("envelope"):
                    continue
                raw = reply.envelope.envelope_json
                verify(raw, VerifyContext(cid, int(time.time()), keys, set(), _NoJournal()))
                device = json.loads(raw)["target_ref"]
                claimed.append(reply.dispatch_id)
                if device in writing:
                    violations.append(f"{device}: {writing[device]} and {reply.dispatch_id}")
                writing[device] = reply.dispatch_id
                await asyncio.sleep(random.uniform(0, 0.02))
                del writing[device]
                done = bpb.ReportRequest(collector_id=cid, task_id=reply.dispatch_id,
                                         outcome=bpb.REPORT_OUTCOME_SUCCESS)  # fmt: skip
                await bridge.Report(signed(done))

        submitted: list[str] = []

        async def submitter(n: int) -> None:
            for i in range(TASKS_EACH):
                while True:
                    deadline = Timestamp()
                    deadline.FromDatetime(dt.datetime.now(dt.UTC) + dt.timedelta(minutes=5))
                    request = pb.SubmitTaskRequest(
                        provider="stub", operation="set", op_class=task_pb2.OP_CLASS_MUTATE_TERMINAL,
                        target_ref=random.choice(DEVICES), site_id="site-x", tenant_id="t", params=b"{}",
                        idempotency_key=f"s-{n}-{i}", deadline=deadline,
                    )  # fmt: skip
                    try:
                        reply = await routers[(n + i) % 2].SubmitTask(request)
                        submitted.append(reply.task.task_id)
                        break
                    except grpc.aio.AioRpcError as exc:
                        assert exc.code() == grpc.StatusCode.FAILED_PRECONDITION, exc.details()
                        await asyncio.sleep(random.uniform(0.005, 0.03))

        workers = [asyncio.create_task(collector(i, cid)) for i, cid in enumerate(COLLECTORS)]
        await asyncio.gather(*(submitter(n) for n in range(SUBMITTERS)))
        engine = db_engine.create_async(database_url)
        try:
            for _ in range(300):
                async with engine.connect() as conn:
                    states: Counter[Any] = Counter((await conn.execute(select(tasks.c.state))).scalars())
                if states.get("success") == len(submitted):
                    break
                await asyncio.sleep(0.1)
        finally:
            await engine.dispose()
        stop.set()
        await asyncio.gather(*workers)
        for channel in channels:
            await channel.close(None)
        assert violations == []
        assert len(claimed) == len(set(claimed)) == len(submitted) == SUBMITTERS * TASKS_EACH
        assert states == {"success": len(submitted)}
    finally:
        for proc, log in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0
            log.close()
