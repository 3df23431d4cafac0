"""``stub`` - a driver for tests and demos with a file-backed "device".

    echo          read                 returns its params
    append        mutate_reconcilable  appends the idempotency key to the device file; check: append.check
    append.check  read                 success if the key is in the device file, failed if not
    apply_once    mutate_terminal      appends to the device file, not safely repeatable
    dump          read                 streams {"bytes": n} bytes of output, deterministic from
                                       {"seed": s} (dump_blocks), through Task.output (protocol 4);
                                       or {"lines": n, "every": s}: n text lines, one each s seconds

Each device is a file ``<state>/stub-devices/<target_ref>``, so tests can count
exactly how often each mutation was applied. ``VERSUS_STUB_DEVICE_DIR`` puts
the devices in a directory several collectors share, as real devices are
reachable from every collector of a site (the fault-injection suite, chaos/,
runs its collectors that way). Params may ask for a delay
(``{"sleep": seconds}``, after the change; echo honours it too, and with
``{"credential": true}`` holds the device's stub credential from credentials.json,
using it at the start and again at the end, for revocation tests) to leave time
to kill the collector mid-task, for a delay before the write (``{"hold": s}``),
for a refusal that changes nothing (``{"fail": true}``), for a change the
device does not confirm (``{"unclear": true}``) or for a check that cannot
tell (``{"check_error": true}``: ``append.check`` fails with an error code). Every write is checked
against the envelope's window first and leaves its evidence (lease epoch,
dispatch, time) in ``<device>.writes``. Every delay ends early on a cancel
(``Task.pause``), so a cancel before the write leaves the device untouched and
one after it leaves the outcome to the unknown-outcome ladder.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

from collector.drivers.base import (
    DriverContext,
    DriverError,
    HeldCredential,
    Operation,
    Outcome,
    Stopped,
    Task,
)

_SAFE = re.compile(r"[^A-Za-z0-9._-]")
# Beside each device file: one JSON line per write (key, lease epoch, dispatch, expires_at, time).
WRITES_SUFFIX = ".writes"
DEVICE_DIR_ENV = "VERSUS_STUB_DEVICE_DIR"


class StubDriver:
    provider: ClassVar[str] = "stub"
    max_concurrency: ClassVar[int] = 8
    # It touches no device: in vault mode C no Vault read precedes its tasks.
    uses_credentials: ClassVar[bool] = False
    operations: ClassVar[dict[str, Operation]] = {
        "echo": Operation("read", timeout_s=30),
        "append": Operation("mutate_reconcilable", timeout_s=60, reconcile_operation="append.check"),
        "append.check": Operation("read", timeout_s=30),
        "apply_once": Operation("mutate_terminal", timeout_s=60),
        "dump": Operation("read", timeout_s=600),
    }

    def __init__(self, ctx: DriverContext):
        self.credentials = ctx.credentials
        shared = os.environ.get(DEVICE_DIR_ENV, "")
        self.devices = Path(shared) if shared else ctx.state_dir / "stub-devices"
        self.devices.mkdir(parents=True, exist_ok=True)

    def device(self, target_ref: str) -> Path:
        return self.devices / _SAFE.sub("_", target_ref)

    async def execute(self, task: Task) -> Outcome:
        params = json.loads(task.params or b"{}") if task.params.strip().startswith(b"{") else {}
        if task.operation == "echo":
            secret = self._credential(task) if params.get("credential") else None
            if params.get("sleep"):
                await task.pause(float(params["sleep"]))
            if secret is not None:
                secret["token"]  # used again at the end: a revoked credential fails the task here
            return Outcome("success", task.params)
        if task.operation == "dump":
            return await _dump(task, params)
        path = self.device(task.target_ref)
        if task.operation == "append.check":
            if params.get("check_error"):
                # The read itself went wrong (the device did not answer): says nothing either way.
                return Outcome("failed", b"", "stub_check_error", "the device did not answer the check")
            lines = path.read_text().splitlines() if path.exists() else []
            return Outcome("success" if task.idempotency_key in lines else "failed", b"")
        if task.operation in ("append", "apply_once"):
            if params.get("fail"):
                return Outcome("failed", b"", "stub_failed", "asked to fail; the device was not changed")
            if params.get("hold"):
                # Time between accepting the task and writing (a slow login, say): a stop here
                # leaves a holder that may wake up after its window.
                await task.pause(float(params["hold"]))
            task.check_window()
            self._write(path, task)
            delay = float(params.get("sleep", 0))
            if delay:
                # The change is written, its confirmation not read yet: a stop here is an unknown.
                await task.pause(delay)
            if params.get("unclear"):
                return Outcome("unknown", b"", "stub_unclear", "the device did not confirm")
            return Outcome("success", b"applied")
        raise DriverError("unknown_operation", f"stub has no operation {task.operation!r}")

    def _credential(self, task: Task) -> HeldCredential:
        """The device's stub credential (``{"stub": {target: {"token": ...}}}`` in credentials.json),
        held for the task and used once at the start."""
        raw = task.device_credential(self.credentials, "stub")
        if raw is None:
            raise DriverError("no_credentials", f"no local stub credential for {task.target_ref!r}")
        secret = task.hold(raw)
        secret["token"]
        return secret

    def _write(self, path: Path, task: Task) -> None:
        """Apply the change: the key goes into the device file, and the write's evidence (lease
        epoch, dispatch, time) into ``<device>.writes`` for checkers of the single-writer rule."""
        with path.open("a") as fh:
            fh.write(task.idempotency_key + "\n")
        evidence = {"key": task.idempotency_key, "epoch": task.lease_epoch, "dispatch": task.task_id,
                    "expires_at": task.expires_at, "at": time.time()}  # fmt: skip
        with path.with_name(path.name + WRITES_SUFFIX).open("a") as fh:
            fh.write(json.dumps(evidence, separators=(",", ":")) + "\n")


# Bytes generated per write of ``dump``.
DUMP_BLOCK = 64 * 1024


def dump_blocks(seed: str, size: int, block: int = DUMP_BLOCK) -> Iterator[bytes]:
    """The bytes ``dump`` writes for ``seed`` and ``size``, block by block (tests recompute them)."""
    rng = random.Random(seed)  # noqa: S311 - test data, not secrets
    left = size
    while left > 0:
        n = min(block, left)
        yield rng.randbytes(n)
        left -= n


async def _dump(task: Task, params: dict[str, object]) -> Outcome:
    if task.output is None:
        raise DriverError(
            "output_stream_unsupported", "this collector cannot stream output to the control plane now"
        )
    if "lines" in params:  # a slow, readable stream: what an operator watches arrive
        lines, every = int(str(params["lines"])), float(str(params.get("every", 1)))
        for n in range(1, lines + 1):
            await task.output.write(f"line {n} of {lines}\n".encode())
            if n < lines:
                await task.pause(every)  # raises Stopped on a cancel
        return Outcome("success", json.dumps({"lines": lines}).encode())
    size = int(str(params.get("bytes", 0)))
    for data in dump_blocks(str(params.get("seed", "")), size):
        if task.stop.requested:
            raise Stopped("cancelled", "stopped on a cancel")
        await task.output.write(data)
        await asyncio.sleep(0)  # let the upload run beside the driver
    return Outcome("success", json.dumps({"bytes": size}).encode())
