"""Enrollment over HTTP: the gateway app on a real socket, EnrollmentService over gRPC, real PostgreSQL."""

from __future__ import annotations

import asyncio
import datetime as dt
import io
import json
import logging
import subprocess
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import uvicorn
from cryptography.hazmat.primitives import serialization
from sqlalchemy import select, update

from common.access.api_tokens import TokenAuthenticator
from common.access.rbac import Role
from common.db import engine as db_engine
from common.db.schema import collectors, enrollment_tokens
from common.embedded.process import free_port
from common.grpc.server import GrpcServer
from common.telemetry.logs import configure_logging
from common.trust.ca_store import CaStore
from common.trust.keys import KeyPurpose, KeySet
from common.trust.trust_bundle import BundleSource
from enrollment.authority import Authority
from enrollment.server import registrations
from enrollment.service import EnrollmentConfig, EnrollmentService
from enrollment.store import EnrollmentStore
from gateway.app import GatewayConfig, create_app
from tests.support.access import mint
from tests.support.collector_auth import SignRequests, bound_token
from tests.support.pki import csr_pem, p256, p384, rsa_key

# Every test also fails if a credential reaches the log (tests/support/logs.py).
pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("no_secret_logged")]


NOW = int(time.time())


@dataclass
class Stack:
    service: EnrollmentService
    url: str
    site_id: str


@pytest.fixture
async def stack(database_url: str, redis_url: str, tmp_path: Path) -> AsyncIterator[Stack]:
    engine = db_engine.create_async(database_url)
    service = EnrollmentService(
        EnrollmentStore(engine),
        Authority.from_source(BundleSource(CaStore(tmp_path))),
        lambda: KeySet.create(KeyPurpose.DISPATCH, NOW),
        lambda: KeySet.create(KeyPurpose.RELEASE, NOW),
        EnrollmentConfig("it.versus", "https://gw.it:8443", ("gw.it:8443",), "gw.it"),
    )
    grpc_server = GrpcServer(
        "enrollment", "127.0.0.1", free_port(), registrations(service), TokenAuthenticator(engine)
    )
    await grpc_server.start()
    token = await mint(engine, Role.SERVICE)
    app = create_app(
        GatewayConfig(database_url, redis_url, grpc_server.address, body_deadline_s=1.0, service_token=token)
    )
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, lifespan="on"))
    task = asyncio.create_task(server.serve())
    while not server.started:  # noqa: ASYNC110 - uvicorn exposes only this flag
        await asyncio.sleep(0.01)
    site = await service.create_site("site-a", "tenant-a", "manual", None)
    yield Stack(service, f"http://127.0.0.1:{port}", site.site_id)
    server.should_exit = True
    await task
    await grpc_server.stop(0)
    await engine.dispose()


async def _post(stack: Stack, path: str, body: object, **kwargs: object) -> httpx.Response:
    async with httpx.AsyncClient(base_url=stack.url, timeout=10) as client:
        return await client.post(path, json=body, **kwargs)  # type: ignore[arg-type]


async def _token(stack: Stack, max_uses: int = 1, approval: str = "auto") -> tuple[str, str]:
    issued = await stack.service.issue_token(
        stack.site_id, max_uses=max_uses, ttl_seconds=600, approval_mode=approval
    )
    return issued.plaintext, issued.token.token_id


async def _uses(stack: Stack, token_id: str) -> int:
    async with stack.service.store.engine.connect() as conn:
        q = select(enrollment_tokens.c.uses).where(enrollment_tokens.c.token_id == token_id)
        return int((await conn.execute(q)).scalar_one())


async def test_enroll_response_has_the_documented_shape(stack: Stack) -> None:
    token, _ = await _token(stack)
    reply = await _post(stack, "/api/collector/v1/enroll", {
        "token": token, "csr_pem": csr_pem(p256(), "col-shape"),
        "collector": {"hostname": "h", "os": "linux", "arch": "amd64", "version": "1.4.2"},
    })  # fmt: skip
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert set(body) == {
        "collector_id", "status", "cert_chain_pem", "ca_bundle_pem", "gateway", "auth",
        "dispatch_keys", "release_keys", "key_versions", "site_id", "policy",
    }  # fmt: skip
    assert body["key_versions"] == {"dispatch": 1, "release": 1, "trust": 1}
    assert body["gateway"] == {"addrs": ["gw.it:8443"], "server_name": "gw.it"}
    assert body["auth"] == {"mode": "bearer", "audience": "versus-collector-gateway"}
    assert body["policy"] == {"vault_mode": "local", "heartbeat_interval_s": 25, "max_concurrency": {"*": 8}}
    assert set(body["dispatch_keys"][0]) == {"kid", "alg", "pub", "not_after"}
    assert body["dispatch_keys"][0]["kid"].startswith("dsp-")
    assert body["release_keys"][0]["kid"].startswith("rel-")
    assert (body["collector_id"], body["status"], body["site_id"]) == ("col-shape", "active", stack.site_id)


async def test_every_token_failure_looks_the_same(stack: Stack) -> None:
    revoked, revoked_id = await _token(stack)
    await stack.service.store.revoke_token(revoked_id, "test")
    expired, expired_id = await _token(stack)
    async with stack.service.store.engine.begin() as conn:
        await conn.execute(
            update(enrollment_tokens)
            .where(enrollment_tokens.c.token_id == expired_id)
            .values(expires_at=dt.datetime.now(dt.UTC) - dt.timedelta(seconds=1))
        )
    bodies = set()
    for token in ("vst_" + "x" * 43, "garbage", revoked, expired):
        reply = await _post(
            stack, "/api/collector/v1/enroll", {"token": token, "csr_pem": csr_pem(p256(), "c1")}
        )
        assert reply.status_code == 401
        bodies.add(reply.text)
    assert bodies == {'{"error":{"code":"invalid_token","message":"the enrollment token is not valid"}}'}


@pytest.mark.parametrize(
    ("csr", "status", "code"),
    [
        (lambda: csr_pem(rsa_key(), "col-rsa"), 400, "csr_key_unsupported"),
        (lambda: csr_pem(p384(), "col-384"), 400, "csr_key_unsupported"),
        (lambda: csr_pem(p256(), None), 400, "csr_cn_missing"),
        (
            lambda: "-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n",
            400,
            "csr_invalid",
        ),
    ],
)
async def test_bad_csrs_over_http(stack: Stack, csr, status: int, code: str) -> None:  # type: ignore[no-untyped-def]
    token, token_id = await _token(stack)
    reply = await _post(stack, "/api/collector/v1/enroll", {"token": token, "csr_pem": csr()})
    assert (reply.status_code, reply.json()["error"]["code"]) == (status, code)
    assert await _uses(stack, token_id) == 0


async def test_collision_and_malformed_bodies(stack: Stack) -> None:
    token, token_id = await _token(stack, max_uses=3)
    assert (
        await _post(stack, "/api/collector/v1/enroll", {"token": token, "csr_pem": csr_pem(p256(), "c")})
    ).is_success
    clash = await _post(stack, "/api/collector/v1/enroll", {"token": token, "csr_pem": csr_pem(p256(), "c")})
    assert (clash.status_code, clash.json()["error"]["code"]) == (409, "collector_id_taken")
    not_json = await _post(
        stack,
        "/api/collector/v1/enroll",
        None,
        content=b"{nope",
        headers={"content-type": "application/json"},
    )
    assert (not_json.status_code, not_json.json()["error"]["code"]) == (400, "invalid_body")
    wrong_type = await _post(
        stack, "/api/collector/v1/enroll", None, content=b"{}", headers={"content-type": "text/plain"}
    )
    assert (wrong_type.status_code, wrong_type.json()["error"]["code"]) == (415, "unsupported_media_type")
    missing = await _post(stack, "/api/collector/v1/enroll", {"token": token})
    assert (missing.status_code, missing.json()["error"]["code"]) == (400, "invalid_body")
    assert await _uses(stack, token_id) == 1


async def test_oversized_body_is_refused(stack: Stack) -> None:
    token, token_id = await _token(stack)
    huge = {"token": token, "csr_pem": "x" * (70 * 1024)}
    declared = await _post(stack, "/api/collector/v1/enroll", huge)
    assert (declared.status_code, declared.json()["error"]["code"]) == (413, "body_too_large")

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(20):
            yield b"x" * 4096

    async with httpx.AsyncClient(base_url=stack.url) as client:
        streamed = await client.post(
            "/api/collector/v1/enroll", content=chunks(), headers={"content-type": "application/json"}
        )
    assert (streamed.status_code, streamed.json()["error"]["code"]) == (413, "body_too_large")
    assert await _uses(stack, token_id) == 0


async def test_body_that_trickles_in_is_cut_off(stack: Stack) -> None:
    token, token_id = await _token(stack)
    body = json.dumps({"token": token, "csr_pem": csr_pem(p256(), "col-slow")}).encode()
    host, port = stack.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(
        b"POST /api/collector/v1/enroll HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
    )
    started = time.monotonic()
    for i in range(0, len(body), 20):
        writer.write(body[i : i + 20])
        await writer.drain()
        await asyncio.sleep(0.2)
        if time.monotonic() - started > 3:
            break
    response = await asyncio.wait_for(reader.read(4096), 5)
    writer.close()
    assert b" 408 " in response.split(b"\r\n", 1)[0]
    assert b'"code":"body_timeout"' in response
    assert await _uses(stack, token_id) == 0


async def test_openssl_csr_enrolls_and_openssl_verifies_the_certificate(stack: Stack, tmp_path: Path) -> None:
    key, csr = tmp_path / "key.pem", tmp_path / "csr.pem"
    subprocess.run(
        ["openssl", "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-subj", "/CN=col-openssl", "-keyout", str(key), "-out", str(csr)],
        check=True, capture_output=True,
    )  # fmt: skip
    token, _ = await _token(stack)
    reply = await _post(stack, "/api/collector/v1/enroll", {"token": token, "csr_pem": csr.read_text()})
    assert reply.status_code == 200, reply.text
    leaf = tmp_path / "leaf.pem"
    leaf.write_text(
        reply.json()["cert_chain_pem"].split("-----END CERTIFICATE-----")[0] + "-----END CERTIFICATE-----\n"
    )
    bundle = tmp_path / "bundle.pem"
    bundle.write_text(reply.json()["ca_bundle_pem"])
    verified = subprocess.run(
        ["openssl", "verify", "-purpose", "sslclient", "-CAfile", str(bundle), str(leaf)],
        capture_output=True,
        text=True,
    )
    assert verified.returncode == 0, verified.stderr
    assert verified.stdout.strip().endswith(": OK")
    text = subprocess.run(
        ["openssl", "x509", "-noout", "-text", "-in", str(leaf)], capture_output=True, text=True
    ).stdout
    assert f"URI:spiffe://it.versus/site/{stack.site_id}/collector/col-openssl" in text
    assert "CA:FALSE" in text


async def test_bearer_endpoints_pending_approval_and_renewal(stack: Stack) -> None:
    token, _ = await _token(stack, approval="manual")
    key = p256()
    enrolled = await _post(
        stack, "/api/collector/v1/enroll", {"token": token, "csr_pem": csr_pem(key, "col-b")}
    )
    assert enrolled.json()["status"] == "pending"

    def bearer(k=key, sub: str = "col-b") -> SignRequests:  # type: ignore[no-untyped-def]
        return SignRequests(k, sub)

    async with httpx.AsyncClient(base_url=stack.url) as client:
        status = await client.get("/api/collector/v1/enrollment", auth=bearer())
        assert status.json()["status"] == "pending"
        # A pending collector may poll but not renew.
        refused = await client.post(
            "/api/collector/v1/renew", auth=bearer(), json={"csr_pem": csr_pem(key, "col-b")}
        )
        assert (refused.status_code, refused.json()["error"]["code"]) == (403, "collector_pending")
        await stack.service.approve("col-b", "test")
        assert (await client.get("/api/collector/v1/enrollment", auth=bearer())).json()["status"] == "active"
        new_key = p256()
        renewed = await client.post(
            "/api/collector/v1/renew", auth=bearer(), json={"csr_pem": csr_pem(new_key, "col-b")}
        )
        assert renewed.status_code == 200, renewed.text
        # The old key no longer authenticates; the new one does.
        old = await client.get("/api/collector/v1/enrollment", auth=bearer())
        assert (old.status_code, old.json()["error"]["code"]) == (401, "bearer_bad_signature")
        assert (await client.get("/api/collector/v1/enrollment", auth=bearer(new_key))).status_code == 200
        nobody = {
            "Authorization": "Bearer "
            + bound_token(new_key, "col-nobody", "GET", "/api/collector/v1/enrollment")
        }
        for headers, code in [
            ({}, "bearer_missing"),
            ({"Authorization": "Bearer not.a.jwt"}, "bearer_malformed"),
            (nobody, "bearer_bad_signature"),
        ]:
            reply = await client.get("/api/collector/v1/enrollment", headers=headers)
            assert (reply.status_code, reply.json()["error"]["code"]) == (401, code)
        # An expired certificate can no longer authenticate.
        async with stack.service.store.engine.begin() as conn:
            await conn.execute(
                update(collectors)
                .where(collectors.c.collector_id == "col-b")
                .values(cert_not_after=dt.datetime.now(dt.UTC) - dt.timedelta(seconds=1))
            )
        expired = await client.get("/api/collector/v1/enrollment", auth=bearer(new_key))
        assert (expired.status_code, expired.json()["error"]["code"]) == (401, "certificate_expired")


async def test_enrollment_logs_hold_no_secrets(stack: Stack) -> None:
    stream = io.StringIO()
    configure_logging(fmt="json", level="DEBUG", cache=False)
    logging.getLogger().handlers[0].setStream(stream)  # type: ignore[attr-defined]
    try:
        issued = await stack.service.issue_token(
            stack.site_id, max_uses=1, ttl_seconds=60, approval_mode="auto"
        )
        key = p256()
        pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ).decode()
        await _post(
            stack, "/api/collector/v1/enroll", {"token": issued.plaintext, "csr_pem": csr_pem(key, "col-log")}
        )
        await _post(stack, "/api/collector/v1/enroll", {"token": issued.plaintext + "x", "csr_pem": pem})
    finally:
        configure_logging(cache=False)
    output = stream.getvalue()
    assert "collector enrolled" in output
    secret_part = issued.plaintext.removeprefix("vst_")
    assert secret_part not in output
    assert pem.splitlines()[1] not in output
    assert "BEGIN PRIVATE KEY" not in output
