"""Refusing a client-streamed upload so that every client sees the refusal's code.

A server may answer a client stream before reading all of it (a header it refuses, an artifact
longer than declared). The sender is then still writing, and grpcio's asyncio client turns a write
that meets the finished call into the call's own status - ``INTERNAL`` "Internal error from Core",
with no trailers - instead of the server's answer (grpc/grpc#36066). Whether a client hits it
depends on how much of the stream its flow-control window had taken when the answer came, i.e. on
the upload's size and on timing. Reading the rest of the stream first (and dropping it) lets the
client finish writing, so it reads the real status. The reading is bounded in bytes and in time:
past either, the refusal goes out anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import TypeVar

M = TypeVar("M")

# Beyond this much (or this long) of a refused stream, the answer goes out without waiting for the
# client to finish writing.
DRAIN_MAX_BYTES = 64 * 1024 * 1024
DRAIN_MAX_S = 30.0


async def drain(
    requests: AsyncIterator[M],
    size_of: Callable[[M], int],
    max_bytes: int = DRAIN_MAX_BYTES,
    max_s: float = DRAIN_MAX_S,
) -> int:
    """Read and drop what is left of ``requests``; return the bytes dropped.

    Stops at the stream's end, past ``max_bytes``, after ``max_s`` seconds, or when the stream
    breaks (the client went away): the caller answers with its refusal in every case."""
    dropped = 0
    # TimeoutError: the time is up; anything else: the stream broke. Either way, answer now.
    with contextlib.suppress(Exception):
        async with asyncio.timeout(max_s):
            async for message in requests:
                dropped += size_of(message)
                if dropped > max_bytes:
                    break
    return dropped
