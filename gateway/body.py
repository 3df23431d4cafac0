"""Reading request bodies with an explicit size limit and deadline.

A body over the limit is refused as soon as the limit is passed (or at once
when Content-Length announces it); a body that does not arrive completely
within the deadline is refused, so a slow sender cannot hold a worker.
"""

from __future__ import annotations

import asyncio

from starlette.requests import ClientDisconnect, Request

from common.errors import InvalidArgument, PayloadTooLarge, RequestTimeout, UnsupportedMediaType

# Defaults for collector API bodies (docs/gateway.md lists every limit).
BODY_DEADLINE_S = 10.0


async def read_json_body(request: Request, limit: int) -> bytes:
    """:func:`read_body` for endpoints that take JSON: anything but ``application/json`` is 415."""
    media_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media_type != "application/json":
        raise UnsupportedMediaType("the body must be application/json", code="unsupported_media_type")
    return await read_body(request, limit)


async def read_body(request: Request, limit: int) -> bytes:
    """The whole body, at most ``limit`` bytes, arriving within the app's body deadline."""
    deadline_s: float = getattr(request.app.state, "body_deadline_s", BODY_DEADLINE_S)
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise InvalidArgument("Content-Length is not a number", code="bad_content_length")
        if int(declared) > limit:
            raise PayloadTooLarge(f"request body is {declared} bytes, limit {limit}", code="body_too_large")
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(deadline_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise PayloadTooLarge(f"request body exceeds {limit} bytes", code="body_too_large")
                chunks.append(chunk)
    except TimeoutError:
        raise RequestTimeout(
            f"request body did not arrive within {deadline_s:.0f}s", code="body_timeout"
        ) from None
    except ClientDisconnect:
        raise InvalidArgument("client disconnected while sending the body", code="body_incomplete") from None
    return b"".join(chunks)
