"""The platform side: a seeded mix of reads and mutations over a few devices, and what came of it."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import random
import time
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf.timestamp_pb2 import Timestamp
from versus.router.v1 import task_pb2, task_router_pb2_grpc
from versus.router.v1 import task_router_pb2 as pb

from common.error_mapping import GRPC_CODE_METADATA_KEY

# (operation, op_class, weight): reads, repeatable mutations with a check, one-shot mutations.
MIX = (
    ("echo", task_pb2.OP_CLASS_READ, 2),
    ("append", task_pb2.OP_CLASS_MUTATE_RECONCILABLE, 1),
    ("apply_once", task_pb2.OP_CLASS_MUTATE_TERMINAL, 1),
)
TERMINAL = {"success", "failed", "expired", "cancelled", "indeterminate"}


# Besides the mix: a mutation submitted as a read (the router must refuse the lie), and an
# operation no collector offers (it must wait in the queue and expire, never run).
LIE_SHARE = 0.02
UNOFFERED_SHARE = 0.02
# Mutations that fail cleanly (nothing changed) or that the device does not confirm.
FAIL_SHARE = 0.05
UNCLEAR_SHARE = 0.05
# Tasks the platform cancels a moment after submitting, whatever state they reached.
CANCEL_SHARE = 0.05


@dataclass
class Submitted:
    key: str
    operation: str
    target: str
    task_id: str = ""  # empty: never accepted (refused, or every attempt failed)
    refused: str = ""  # stable code of a definite refusal
    state: str = ""
    params: dict[str, object] = field(default_factory=dict)
    lie: bool = False  # submitted under the wrong op_class
    cancel_code: str = ""  # what CancelTask answered ("ok" or its refusal code)


@dataclass
class Workload:
    """Submits ``rate`` tasks per second for ``seconds`` and records every answer."""

    seed: int
    devices: int
    site_id: str
    deadline_s: float
    tasks: list[Submitted] = field(default_factory=list)
    # (monotonic time, what failed): errors that are only acceptable inside a fault window.
    errors: list[tuple[float, str]] = field(default_factory=list)

    async def run(self, channel: grpc.aio.Channel, rate: float, seconds: float) -> None:
        rng = random.Random(self.seed)
        stub: Any = task_router_pb2_grpc.TaskRouterServiceStub(channel)
        pending: set[asyncio.Task[None]] = set()
        ends = time.monotonic() + seconds
        n = 0
        while time.monotonic() < ends:
            operation, op_class, _ = rng.choices(MIX, weights=[w for *_, w in MIX])[0]
            # A delay inside the task leaves time for a fault to land mid-execute.
            params: dict[str, object] = {"sleep": round(rng.uniform(0, 1.5), 2)}
            draw = rng.random()
            lie = False
            if draw < LIE_SHARE:
                operation, op_class, lie = "append", task_pb2.OP_CLASS_READ, True
            elif draw < LIE_SHARE + UNOFFERED_SHARE:
                operation, op_class = "nonexistent", task_pb2.OP_CLASS_READ
            elif operation != "echo":
                extra = rng.random()
                if extra < FAIL_SHARE:
                    params["fail"] = True
                elif extra < FAIL_SHARE + UNCLEAR_SHARE:
                    params["unclear"] = True
            item = Submitted(f"chaos-{self.seed}-{n}", operation, f"dev-{rng.randrange(self.devices)}",
                             params=params, lie=lie)  # fmt: skip
            cancel_after = rng.uniform(0, 3) if rng.random() < CANCEL_SHARE else None
            self.tasks.append(item)
            task = asyncio.create_task(self._submit(stub, item, op_class, params, cancel_after))
            pending.add(task)
            task.add_done_callback(pending.discard)
            n += 1
            await asyncio.sleep(rng.expovariate(rate))
        await asyncio.gather(*pending)

    async def _submit(
        self, stub: Any, item: Submitted, op_class: Any, params: dict[str, object], cancel_after: float | None
    ) -> None:
        await self._submit_once(stub, item, op_class, params)
        if cancel_after is None or not item.task_id:
            return
        await asyncio.sleep(cancel_after)
        try:
            await stub.CancelTask(pb.CancelTaskRequest(task_id=item.task_id, reason="chaos"), timeout=10)
            item.cancel_code = "ok"
        except grpc.aio.AioRpcError as exc:
            item.cancel_code = _versus_code(exc) or exc.code().name
            if exc.code() not in (grpc.StatusCode.FAILED_PRECONDITION,):
                self.errors.append((time.monotonic(), f"CancelTask {exc.code().name} {item.cancel_code}"))

    async def _submit_once(
        self, stub: Any, item: Submitted, op_class: Any, params: dict[str, object]
    ) -> None:
        deadline = Timestamp()
        deadline.FromDatetime(dt.datetime.now(dt.UTC) + dt.timedelta(seconds=self.deadline_s))
        request = pb.SubmitTaskRequest(
            provider="stub", operation=item.operation, op_class=op_class, target_ref=item.target,
            site_id=self.site_id, tenant_id="chaos", params=json.dumps(params).encode(),
            idempotency_key=item.key, deadline=deadline,
        )  # fmt: skip
        # Retried with the same idempotency key while the control plane is unavailable.
        for _ in range(20):
            sent = time.monotonic()
            try:
                reply = await stub.SubmitTask(request, timeout=10)
            except grpc.aio.AioRpcError as exc:
                code = _versus_code(exc)
                if exc.code() in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.INVALID_ARGUMENT):
                    item.refused = code or exc.code().name
                    return
                failed = f"SubmitTask {exc.code().name} {code}" + _why(exc, sent)
                self.errors.append((time.monotonic(), failed))
                await asyncio.sleep(1.0)
                continue
            item.task_id = reply.task.task_id
            return

    async def settle(self, channel: grpc.aio.Channel, within_s: float) -> None:
        """Wait until every accepted task is terminal (or the time is up); record final states."""
        stub: Any = task_router_pb2_grpc.TaskRouterServiceStub(channel)
        ends = time.monotonic() + within_s
        open_items = [t for t in self.tasks if t.task_id]
        while open_items and time.monotonic() < ends:
            still = []
            for item in open_items:
                try:
                    reply = await stub.GetTask(pb.GetTaskRequest(task_id=item.task_id), timeout=10)
                except grpc.aio.AioRpcError as exc:
                    self.errors.append((time.monotonic(), f"GetTask {exc.code().name}"))
                    still.append(item)
                    continue
                item.state = task_pb2.TaskState.Name(reply.task.state).removeprefix("TASK_STATE_").lower()
                if item.state not in TERMINAL:
                    still.append(item)
            open_items = still
            if open_items:
                await asyncio.sleep(1.0)


def _why(exc: grpc.aio.AioRpcError, sent: float) -> str:
    """How long the failed call took and what gRPC said, to read a violation by ("Socket closed",
    "failed to connect to all addresses", a deadline)."""
    details = (exc.details() or "").splitlines()
    return f" [after {time.monotonic() - sent:.1f}s: {details[0][:120] if details else '-'}]"


def _versus_code(exc: grpc.aio.AioRpcError) -> str:
    metadata: Any = exc.trailing_metadata() or ()
    for key, value in metadata:
        if key == GRPC_CODE_METADATA_KEY:
            return str(value)
    return ""
