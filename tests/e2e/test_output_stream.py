"""A 256 MiB task output streamed through real processes while the gateway and then the router are
SIGKILLed mid-stream: resumed from the acked offset, byte-identical at the end (SHA-256), with the
gateway's and router's memory bounded throughout (measured; docs/protocol.md "Output streams")."""

from __future__ import annotations

import datetime as dt
import hashlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import psutil
import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from versus.router.v1 import task_pb2, task_router_pb2_grpc
from versus.router.v1 import task_router_pb2 as pb

from chaos.stack import ChaosStack, Proc
from collector.drivers.stub import dump_blocks
from common.grpc.client import sync_channel

pytestmark = pytest.mark.timeout(600)

SIZE = 256 * 1024 * 1024
SEED = "e2e-256"
# How much a process may grow while the output passes through it: far below the output's size, so
# a hop that held the output (or a large part of it) would pass it. Chunks are 1 MiB.
GROWTH_BOUND = 64 * 1024 * 1024


class RssMeter:
    """Samples the resident memory of processes (by name) every 100 ms, across their restarts."""

    def __init__(self, procs: dict[str, Proc]):
        self.procs = procs
        self.peak: dict[str, int] = dict.fromkeys(procs, 0)
        self.baseline = {name: self._rss(proc) for name, proc in procs.items()}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def _rss(proc: Proc) -> int:
        try:
            return int(psutil.Process(proc.proc.pid).memory_info().rss) if proc.proc else 0
        except psutil.Error:
            return 0

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            for name, proc in self.procs.items():
                self.peak[name] = max(self.peak[name], self._rss(proc))

    def __enter__(self) -> RssMeter:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[ChaosStack]:
    running = ChaosStack(tmp_path)
    running.start(collectors=1)
    yield running
    running.stop()


def _expected_sha256() -> str:
    sha = hashlib.sha256()
    for block in dump_blocks(SEED, SIZE):
        sha.update(block)
    return sha.hexdigest()


def _wait(stub: Any, task_id: str, predicate: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            task = stub.GetTask(pb.GetTaskRequest(task_id=task_id), timeout=5).task
        except grpc.RpcError:  # the router may be restarting: ask again
            time.sleep(0.2)
            continue
        if predicate(task):
            return task
        time.sleep(0.1)
    raise AssertionError(f"task {task_id} did not get there in {timeout}s")


def _restart(proc: Proc, stack: ChaosStack) -> None:
    proc.kill()  # SIGKILL: no drain, no goodbye
    proc.start()
    stack.wait_ready()


def test_a_256_mib_output_survives_a_gateway_and_a_router_kill_and_arrives_whole(
    stack: ChaosStack,
) -> None:
    expected = _expected_sha256()
    created = stack.cli("access", "create", "e2e-output", "--role", "platform", "--all-tenants")
    token = str(created["plaintext"])
    channel = sync_channel(f"127.0.0.1:{stack.env['VERSUS_ROUTER_PORT']}", token)
    stub = task_router_pb2_grpc.TaskRouterServiceStub(channel)
    deadline = Timestamp()
    deadline.FromDatetime(dt.datetime.now(dt.UTC) + dt.timedelta(minutes=8))
    watched = {"gateway": stack.services["gateway"], "router": stack.services["router"]}
    with RssMeter({**watched, "collector": stack.collectors[0]}) as rss:
        task_id = stub.SubmitTask(
            pb.SubmitTaskRequest(
                provider="stub", operation="dump", op_class=task_pb2.OP_CLASS_READ, target_ref="dev-dump",
                site_id=stack.site_id, tenant_id="chaos", idempotency_key="dump-256",
                params=f'{{"bytes": {SIZE}, "seed": "{SEED}"}}'.encode(), deadline=deadline,
                features=["output_stream"],
            ),
            timeout=10,
        ).task.task_id  # fmt: skip
        # Mid-stream: the gateway first, then the router, each killed and started again.
        _wait(stub, task_id, lambda t: t.output_length >= 48 * 1024 * 1024, 240)
        _restart(stack.services["gateway"], stack)
        at_router_kill = _wait(stub, task_id, lambda t: t.output_length >= 128 * 1024 * 1024, 240)
        assert at_router_kill.state != task_pb2.TASK_STATE_SUCCESS, "the kill must land mid-stream"
        _restart(stack.services["router"], stack)
        settled = (task_pb2.TASK_STATE_SUCCESS, task_pb2.TASK_STATE_FAILED)
        done = _wait(stub, task_id, lambda t: t.state in settled, 300)
    assert done.state == task_pb2.TASK_STATE_SUCCESS, (done.error_code, done.history)
    assert (done.output_length, done.output_sha256) == (SIZE, expected)
    # A platform reads it back, from the start and from an offset, and gets the same bytes.
    sha, length, last = hashlib.sha256(), 0, None
    for message in stub.ReadOutput(pb.ReadOutputRequest(task_id=task_id), timeout=300):
        assert message.offset == length
        sha.update(message.data)
        length += len(message.data)
        last = message
    assert (length, sha.hexdigest()) == (SIZE, expected)
    assert last is not None and last.complete and last.sha256 == expected
    tail = b"".join(
        m.data for m in stub.ReadOutput(pb.ReadOutputRequest(task_id=task_id, offset=SIZE - 1000))
    )
    end = b""
    for block in dump_blocks(SEED, SIZE):
        end = (end + block)[-1000:]
    assert tail == end
    channel.close()
    # Resumed, not restarted: the collector moved to the control plane's ack after the kills.
    log = stack.collectors[0].log_path.read_text(errors="replace")
    assert "output not delivered; retrying" in log or "output resumes" in log
    measured = {n: f"{rss.baseline[n] / 2**20:.0f} -> {p / 2**20:.0f} MiB" for n, p in rss.peak.items()}
    print("RSS before the stream -> peak:", measured)  # noqa: T201 - docs/protocol.md quotes these
    for name in ("gateway", "router", "collector"):
        assert rss.baseline[name] > 0 and rss.peak[name] - rss.baseline[name] < GROWTH_BOUND, measured
