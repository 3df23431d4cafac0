"""Hostile input at the gateway's edge: request framing, WebSocket abuse, and what reaches the logs.

Each case asserts the answer (status, close code, stable code), that nothing changed, and where
secrets are involved that none reached the log. Token forgeries and body validation live in
test_gateway_collector.py; enrollment abuse in test_gateway_enroll.py.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import logging
import os
import struct
from urllib.parse import urlsplit

import httpx
import pytest
import websockets
from sqlalchemy import func, select

from common.db.schema import audit_events, dispatches
from common.telemetry.logs import configure_logging
from tests.integration import test_gateway_collector as gw

# Every test also fails if a credential reaches the log (tests/support/logs.py).
pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("no_secret_logged")]


stack = gw.stack  # the same real enrollment + router + gateway stack
API = gw.API


async def _raw(stack: gw.Stack, request: bytes, read_s: float = 3.0) -> tuple[bytes, bool]:
    """Send bytes on a fresh TCP connection; what the server answers, and whether it then closed.

    Reading stops when the server closes or after ``read_s`` of silence.
    """
    parts = urlsplit(stack.url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    writer.write(request)
    await writer.drain()
    received, closed = b"", False
    try:
        while chunk := await asyncio.wait_for(reader.read(65536), read_s):
            received += chunk
        closed = True
    except TimeoutError:
        pass
    finally:
        writer.close()
    return received, closed


def _statuses(answer: bytes) -> list[int]:
    return [int(line.split()[1]) for line in answer.split(b"\r\n") if line.startswith(b"HTTP/1.1 ")]


async def _claims_seen(stack: gw.Stack, collector_id: str) -> float | None:
    # Every authenticated claim is a heartbeat: its absence shows the request never reached the app.
    score: float | None = await stack.redis.zscore("versus:live", collector_id)
    return score


@pytest.mark.parametrize(
    "framing",
    [
        pytest.param(b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n", id="content-length-and-chunked"),
        pytest.param(b"Content-Length: 2\r\nContent-Length: 40\r\n", id="two-content-lengths"),
        pytest.param(b"Transfer-Encoding: gzip, chunked\r\nTransfer-Encoding: x\r\n", id="unknown-coding"),
        pytest.param(b"Content-Length: -1\r\n", id="negative-length"),
        pytest.param(b"Content-Length: 1_0\r\n", id="malformed-length"),
    ],
)
async def test_ambiguous_request_framing_is_refused_before_the_app(stack: gw.Stack, framing: bytes) -> None:
    # Request smuggling needs two parsers to disagree on where a body ends. The server's parser
    # refuses any ambiguous framing with 400 and closes the connection, so the request never
    # reaches the app and the bytes after it are never read as a second request.
    c = await stack.enroll(f"col-frame-{abs(hash(framing)) % 10_000}")
    bearer = c.headers_for("POST", API + "/claim", b"{}")["Authorization"].encode()
    smuggled = b"POST " + API.encode() + b"/claim HTTP/1.1\r\nHost: gw\r\nAuthorization: " + bearer
    smuggled += b"\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
    body = b"0\r\n\r\n" + smuggled
    request = (
        b"POST " + API.encode() + b"/claim HTTP/1.1\r\nHost: gw\r\nAuthorization: " + bearer + b"\r\n"
        b"Content-Type: application/json\r\n" + framing + b"\r\n" + body
    )
    answer, closed = await _raw(stack, request)
    assert _statuses(answer) == [400], answer[:300]
    assert closed  # the connection ends with the refusal: nothing after it is parsed
    assert await _claims_seen(stack, c.collector_id) is None  # neither request was served


async def test_a_declared_body_over_the_limit_is_refused_without_reading_it(stack: gw.Stack) -> None:
    c = await stack.enroll("col-huge-cl")
    head = (
        b"POST "
        + API.encode()
        + b"/report HTTP/1.1\r\nHost: gw\r\nAuthorization: "
        + c.headers_for("POST", API + "/report")["Authorization"].encode()
        + b"\r\nContent-Type: application/json\r\nContent-Length: 1073741824\r\n\r\n{"
    )
    answer, _ = await _raw(stack, head)
    assert _statuses(answer) == [413]
    assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "body_too_large"


async def test_a_compression_offer_is_declined_and_a_compressed_frame_closes_the_socket(
    stack: gw.Stack,
) -> None:
    # No permessage-deflate, so no decompression bomb: the offer is declined at the handshake and a
    # frame claiming compression (RSV1) is a protocol error.
    c = await stack.enroll("col-deflate")
    url = stack.url.replace("http://", "ws://") + API + "/control"
    async with websockets.connect(
        url, additional_headers=c.headers_for("GET", API + "/control"), compression="deflate", open_timeout=5
    ) as ws:
        assert ws.response is not None
        assert "Sec-WebSocket-Extensions" not in ws.response.headers
    parts = urlsplit(stack.url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    key = base64.b64encode(os.urandom(16))
    writer.write(
        b"GET " + API.encode() + b"/control HTTP/1.1\r\nHost: gw\r\nUpgrade: websocket\r\n"
        b"Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: " + key + b"\r\n"
        b"Sec-WebSocket-Extensions: permessage-deflate\r\n"
        b"Authorization: " + c.headers_for("GET", API + "/control")["Authorization"].encode() + b"\r\n\r\n"
    )
    handshake = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert handshake.startswith(b"HTTP/1.1 101") and b"permessage-deflate" not in handshake.lower()
    payload = b"\x00" * 64
    mask = os.urandom(4)
    masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    writer.write(bytes([0x80 | 0x40 | 0x1, 0x80 | len(payload)]) + mask + masked)  # FIN, RSV1, text
    await writer.drain()
    frame = await asyncio.wait_for(reader.read(2 + 125), 5)
    writer.close()
    assert frame[0] == 0x88  # a close frame
    assert struct.unpack("!H", frame[2:4])[0] == 1002  # protocol error


async def test_a_binary_frame_on_the_control_socket_is_refused_with_4400(stack: gw.Stack) -> None:
    c = await stack.enroll("col-binary")
    async with await gw._ws(stack, c) as ws:
        await ws.send(json.dumps({"v": 1, "id": "a", "type": "claim", "body": {"wait_s": 0}}).encode())
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await asyncio.wait_for(ws.recv(), 5)
    assert closed.value.rcvd is not None
    assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (4400, "malformed_frame")


async def test_a_report_frame_about_another_collectors_task_is_refused_and_changes_nothing(
    stack: gw.Stack,
) -> None:
    owner, intruder = await stack.enroll("col-owner"), await stack.enroll("col-intruder")
    await stack.publish(owner)
    await stack.post("/claim", {"wait_s": 0}, owner)
    await stack.submit("t-foreign-ws")
    claimed = (await stack.post("/claim", {}, owner)).json()
    async with await gw._ws(stack, intruder) as ws:
        body = {"task_id": claimed["dispatch_id"], "outcome": "success", "result_b64": ""}
        await ws.send(json.dumps({"v": 1, "id": "r", "type": "report", "body": body}))
        reply = json.loads(await asyncio.wait_for(ws.recv(), 5))
        assert (reply["status"], reply["body"]["error"]["code"]) == (403, "not_your_dispatch")
        # The refusal answers the frame; the socket stays usable for the intruder's own work.
        await ws.send(json.dumps({"v": 1, "id": "c", "type": "claim", "body": {"wait_s": 0}}))
        assert json.loads(await asyncio.wait_for(ws.recv(), 5))["status"] == 204
    async with stack.service.store.engine.connect() as conn:
        state = await conn.scalar(
            select(dispatches.c.state).where(dispatches.c.dispatch_id == claimed["dispatch_id"])
        )
        attempts = await conn.scalar(
            select(func.count())
            .select_from(audit_events)
            .where(audit_events.c.action == "report.foreign_dispatch")
            .where(audit_events.c.actor == "col-intruder")
        )
    assert state == "dispatched" and attempts == 1


async def test_refused_requests_leave_no_credential_in_the_logs(stack: gw.Stack) -> None:
    stream = io.StringIO()
    configure_logging(fmt="json", level="DEBUG", cache=False)
    logging.getLogger().handlers[0].setStream(stream)  # type: ignore[attr-defined]
    c = await stack.enroll("col-logs")
    valid = c.headers_for("POST", API + "/claim", b"{bad")["Authorization"].removeprefix("Bearer ")
    header, claims, signature = valid.split(".")
    tampered = f"{header}.{claims}.{signature[:-4]}AAAA"
    try:
        async with httpx.AsyncClient(base_url=stack.url) as client:
            for token in (valid, tampered, valid + "x"):
                for path in ("/claim", "/report", "/capabilities"):
                    await client.post(
                        API + path, content=b"{bad", headers={"Authorization": f"Bearer {token}"}
                    )
        url = stack.url.replace("http://", "ws://") + API + "/control"
        with pytest.raises(websockets.InvalidStatus):
            await websockets.connect(url, additional_headers={"Authorization": f"Bearer {tampered}"})
    finally:
        configure_logging(cache=False)
    lines = [json.loads(line) for line in stream.getvalue().splitlines() if line.startswith("{")]
    refused = [
        line for line in lines if line.get("event") == "request" and 400 <= line.get("status", 0) < 500
    ]
    assert len(refused) >= 9  # the refusals were logged, as JSON lines
    output = stream.getvalue()
    for secret in (signature, tampered.rsplit(".", 1)[1], claims):
        assert secret not in output


@pytest.mark.parametrize(
    ("path", "body"),
    [
        # Found by schemathesis: NUL reached PostgreSQL (which refuses it in text) and answered 500.
        (
            "/capabilities",
            {
                "capability_epoch": 1,
                "providers": [{"provider": "\x00", "max_concurrency": 1, "operations": []}],
            },
        ),
        # Found by schemathesis: non-ASCII "base64" raised ValueError past the base64 check: 500.
        ("/report", {"task_id": "dsp-1", "outcome": "failed", "result_b64": "\x80"}),
        ("/report", {"task_id": "dsp-1", "outcome": "failed", "error_message": "half a pair \ud800"}),
        ("/report", {"task_id": "dsp-1", "outcome": "failed", "error_code": "line\nbreak"}),
        ("/claim", {"wait_s": 0, "held_task_ids": ["dsp-\x00"]}),
        # Found by make fuzz: claim_seq and capability_epoch past PostgreSQL's BIGINT answered 500;
        # free slots past protobuf's uint32 are bounded alongside (at most max_concurrency).
        ("/claim", {"wait_s": 0, "claim_seq": 2**63}),
        ("/claim", {"wait_s": 0, "capacity": {"stub": 2**32}}),
        ("/capabilities", {"capability_epoch": 2**63, "providers": []}),
        ("/enroll", {"token": "vst_x", "csr_pem": "x", "collector": {"hostname": "host\x00"}}),
    ],
    ids=[
        "nul-provider",
        "non-ascii-base64",
        "lone-surrogate",
        "control-char-code",
        "nul-task-id",
        "huge-claim-seq",
        "huge-capacity",
        "huge-epoch",
        "nul-hostname",
    ],
)
async def test_values_the_database_cannot_store_are_refused_as_invalid_body(
    stack: gw.Stack, path: str, body: dict[str, object]
) -> None:
    c = await stack.enroll(f"col-text-{abs(hash(path + json.dumps(body))) % 100_000}")
    # json.dumps escapes a lone surrogate as \ud800, as a hostile client would send it.
    headers = {"content-type": "application/json"}
    reply = await stack.post(path, None, c, headers=headers, content=json.dumps(body).encode())
    assert (reply.status_code, reply.json()["error"]["code"]) == (400, "invalid_body"), reply.text
    # The same body over the control socket gets the same answer, and the socket stays open.
    if path != "/enroll":
        async with await gw._ws(stack, c) as ws:
            await ws.send(json.dumps({"v": 1, "id": "t", "type": path.strip("/"), "body": body}))
            answer = json.loads(await asyncio.wait_for(ws.recv(), 5))
            assert (answer["status"], answer["body"]["error"]["code"]) == (400, "invalid_body")


async def test_a_limited_token_raced_over_http_enrolls_exactly_its_uses(stack: gw.Stack) -> None:
    # Twenty collectors race one three-use token through the gateway: three identities, and the
    # losers get the same answer as any invalid token.
    from common.db.schema import collectors
    from tests.support.pki import csr_pem, p256

    issued = await stack.service.issue_token(stack.site_id, max_uses=3, ttl_seconds=600, approval_mode="auto")
    async with httpx.AsyncClient(base_url=stack.url, timeout=30) as client:
        replies = await asyncio.gather(
            *(
                client.post(
                    API + "/enroll",
                    json={"token": issued.plaintext, "csr_pem": csr_pem(p256(), f"col-race-{i}")},
                )
                for i in range(20)
            )
        )
    statuses = sorted(r.status_code for r in replies)
    assert statuses == [200] * 3 + [401] * 17
    assert {r.json()["error"]["code"] for r in replies if r.status_code == 401} == {"invalid_token"}
    async with stack.service.store.engine.connect() as conn:
        enrolled = await conn.scalar(
            select(func.count()).select_from(collectors).where(collectors.c.collector_id.like("col-race-%"))
        )
    assert enrolled == 3
