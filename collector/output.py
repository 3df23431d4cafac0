"""A task's streamed output on the collector side (protocol 4, docs/protocol.md "Output streams").

The driver writes into an :class:`OutputSpool`: a file in the state directory,
hashed as it grows, so memory stays bounded whatever the output's size. An
:class:`Uploader` sends it to the gateway beside the running driver, in chunks
of at most :data:`CHUNK` bytes at their offsets, and moves on only when the
control plane acks a chunk. Any answer that names the ack (a gap, an overlap: a
resend after a lost answer, a restarted gateway or router) moves the upload to
it; an unreachable gateway is retried with backoff from where it stood. The
final report names the output's length and SHA-256 once everything is acked.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import random
from collections.abc import Awaitable, Callable
from pathlib import Path

from collector.gateway_errors import GatewayRefused, GatewayUnavailable
from common.telemetry.logs import get_logger

log = get_logger("versus.collector")

# Bytes per upload request (the gateway takes at most common.limits.MAX_OUTPUT_CHUNK).
CHUNK = 1024 * 1024
# Refusals that say where to resume from.
RESUME_CODES = frozenset({"output_gap", "output_overlap", "output_incomplete"})

Send = Callable[[str, int, bytes], Awaitable[int]]


class OutputSpool:
    """What the driver wrote, on disk, with its running length and SHA-256."""

    def __init__(self, path: Path):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "wb")  # noqa: SIM115 - closed by close()
        self._sha = hashlib.sha256()
        self.length = 0
        self.closed = False
        self.grew = asyncio.Event()

    async def write(self, data: bytes) -> None:
        """Append ``data`` (a driver's call; durable enough to upload, not fsynced)."""
        if self.closed:
            raise ValueError("the output is closed")
        if data:
            self._file.write(data)
            self._file.flush()
            self._sha.update(data)
            self.length += len(data)
            self.grew.set()

    def close(self) -> tuple[int, str]:
        """No more output; its (length, SHA-256 hex)."""
        if not self.closed:
            self._file.close()
            self.closed = True
            self.grew.set()
        return self.length, self._sha.hexdigest()

    def read(self, offset: int, size: int) -> bytes:
        with open(self.path, "rb") as fh:
            fh.seek(offset)
            return fh.read(size)

    def remove(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)


class UploadFailed(Exception):
    """The control plane will not take this output (quota, size, the task moved on)."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


class Uploader:
    """Sends one spool, chunk by chunk, to the acked end (see the module doc)."""

    def __init__(self, dispatch_id: str, spool: OutputSpool, send: Send, max_backoff_s: float = 60.0):
        self.dispatch_id = dispatch_id
        self.spool = spool
        self._send = send
        self.acked = 0
        self.max_backoff_s = max_backoff_s
        self.failed: UploadFailed | None = None

    def resume_from(self, acked: int) -> None:
        """The control plane says it holds exactly ``acked`` bytes: carry on from there."""
        self.acked = max(0, min(acked, self.spool.length))

    async def run(self) -> None:
        """Upload until the spool is closed and all of it is acked (or it is refused for good)."""
        attempt = 0
        while not (self.spool.closed and self.acked >= self.spool.length):
            if self.acked >= self.spool.length:
                self.spool.grew.clear()
                if not self.spool.closed and self.acked >= self.spool.length:
                    await self.spool.grew.wait()
                continue
            data = await asyncio.to_thread(self.spool.read, self.acked, CHUNK)
            try:
                self.acked = await self._send(self.dispatch_id, self.acked, data)
                attempt = 0
            except GatewayRefused as exc:
                if exc.code in RESUME_CODES and isinstance(exc.details.get("acked"), int):
                    log.info("output resumes from the control plane's ack", task_id=self.dispatch_id,
                             at=self.acked, acked=exc.details["acked"], code=exc.code)  # fmt: skip
                    self.resume_from(int(exc.details["acked"]))
                    continue
                if exc.code in ("bearer_replayed", "bearer_expired", "bearer_not_yet_valid"):
                    await self._pause(attempt)
                    attempt += 1
                    continue
                self.failed = UploadFailed(exc.code, str(exc))
                log.error("output refused; not sent further", task_id=self.dispatch_id, code=exc.code)
                return
            except GatewayUnavailable as exc:
                log.warning("output not delivered; retrying", task_id=self.dispatch_id, at=self.acked,
                            reason=str(exc))  # fmt: skip
                await self._pause(attempt)
                attempt += 1

    async def _pause(self, attempt: int) -> None:
        delay = min(self.max_backoff_s, 0.25 * 2**attempt) * random.uniform(0.75, 1.25)  # noqa: S311 - jitter
        await asyncio.sleep(delay)


class TaskOutput:
    """The output of one task: the spool and its upload, both started by the driver's first write
    (a task that writes nothing costs nothing). What drivers see as ``Task.output``."""

    def __init__(self, state_dir: Path, dispatch_id: str, send: Send, max_backoff_s: float = 60.0):
        self.path = state_dir / "output" / dispatch_id
        self.dispatch_id = dispatch_id
        self._send = send
        self._max_backoff_s = max_backoff_s
        self.spool: OutputSpool | None = None
        self.uploader: Uploader | None = None
        self._upload: asyncio.Task[None] | None = None

    @property
    def started(self) -> bool:
        return self.spool is not None

    async def write(self, data: bytes) -> None:
        """Append to the task's output; it streams to the control plane as it grows."""
        if self.spool is None:
            self.spool = OutputSpool(self.path)
            self.uploader = Uploader(self.dispatch_id, self.spool, self._send, self._max_backoff_s)
            self._upload = asyncio.ensure_future(self.uploader.run())
        await self.spool.write(data)

    async def finish(self) -> tuple[int, str]:
        """Close the output and wait until the control plane holds all of it; its (length, SHA-256).
        Raises :class:`UploadFailed` when the control plane refused it for good."""
        assert self.spool is not None and self.uploader is not None and self._upload is not None
        digest = self.spool.close()
        _save_digest(self.path, *digest)
        await self._upload
        if self.uploader.failed is not None:
            raise self.uploader.failed
        return digest

    async def upload_again_from(self, acked: int) -> None:
        """The control plane holds less than the report named: send the rest again from ``acked``."""
        assert self.spool is not None and self.uploader is not None
        self.uploader.resume_from(acked)
        await self.uploader.run()
        if self.uploader.failed is not None:
            raise self.uploader.failed

    def abandon(self) -> None:
        """Stop uploading (the collector stops hard); the files stay for nobody: remove them."""
        if self._upload is not None:
            self._upload.cancel()
        self.remove()

    def remove(self) -> None:
        if self.spool is not None:
            self.spool.remove()
        self.path.with_name(self.path.name + ".digest").unlink(missing_ok=True)


def _save_digest(path: Path, length: int, sha256: str) -> None:
    """Beside a closed spool: what the report names (evidence; replaced atomically)."""
    tmp = path.with_name(path.name + ".digest.tmp")
    tmp.write_text(json.dumps({"length": length, "sha256": sha256}))
    os.replace(tmp, path.with_name(path.name + ".digest"))


def saved_digest(state_dir: Path, dispatch_id: str) -> tuple[int, str] | None:
    """The digest a finished upload left (for a report re-sent after a restart), if any."""
    try:
        doc = json.loads((state_dir / "output" / f"{dispatch_id}.digest").read_text())
        return int(doc["length"]), str(doc["sha256"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
