"""A collector written from docs/protocol.md, "The client contract", and the documents it names —
nothing else. It imports nothing of this project (tests/unit/test_client_contract.py checks), so
what it gets right is what the documents say, not what the reference collector happens to share
with the gateway: its tokens, frames, CSR, envelope checks and report signatures are its own.

What it implements: enrollment with a pinned CA (not the successor of a CA rotating at that
moment), both transports with the contract's choice between them, protocol versions 1 to 7 (it
runs one task at a time and reports it before claiming again, so it holds nothing when it
claims: verdicts never concern it, and every revoke is answered ``not_held``), the envelope's
every verification step, and signed reports. Its one driver, ``contract/echo``, answers a read
with the task's parameters.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import random
import secrets
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx
import websockets
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from cryptography.x509.oid import NameOID

from tests.support.contract_envelope import EnvelopeRefused, verify_envelope

API = "/api/collector/v1"
PROVIDER, OPERATION = "contract/echo", "echo"
# The contract's numbers (docs/protocol.md, "The numbers").
CLAIM_GRACE_S = 15.0
OPEN_TIMEOUT_S = 10.0
STEADY_S = 30.0
HTTPS_FOR_S = 60.0
TOKEN_LIFETIME_S = 60
BACKOFF_CAP_S = 60.0
RETRY_AFTER_MAX_S = 300.0
OFFER = {"min": 1, "max": 7}
FATAL = frozenset({"collector_revoked", "collector_denied", "certificate_expired", "session_superseded"})


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def digest(data: bytes) -> str:
    return b64url(hashlib.sha256(data).digest())


def jws(key: ec.EllipticCurvePrivateKey, header: Mapping[str, Any], claims: Mapping[str, Any]) -> str:
    """A compact ES256 JWS: the signature as raw r‖s, 32 bytes each, not DER."""
    signing_input = b64url(json.dumps(header).encode()) + "." + b64url(json.dumps(claims).encode())
    r, s = decode_dss_signature(key.sign(signing_input.encode("ascii"), ec.ECDSA(hashes.SHA256())))
    return signing_input + "." + b64url(r.to_bytes(32, "big") + s.to_bytes(32, "big"))


def bearer(key: ec.EllipticCurvePrivateKey, collector_id: str, method: str, path: str, body: bytes) -> str:
    now = int(time.time())
    claims = {"iss": collector_id, "sub": collector_id, "aud": "versus-collector-gateway", "iat": now,
              "exp": now + TOKEN_LIFETIME_S, "jti": secrets.token_urlsafe(16), "htm": method, "htu": path,
              "bsh": digest(body)}  # fmt: skip
    return jws(key, {"alg": "ES256", "typ": "JWT"}, claims)


def backoff(attempt: int, retry_after_s: float | None) -> float:
    delay = random.uniform(0, min(BACKOFF_CAP_S, 2.0**attempt))
    if retry_after_s is not None:
        delay = max(delay, random.uniform(retry_after_s, 2 * retry_after_s))
    return delay


def retry_after(value: str | None) -> float | None:
    if value is None or not value.strip().isdigit():
        return None  # an HTTP date, or anything else, is ignored
    return min(float(value), RETRY_AFTER_MAX_S)


class Failed(Exception):
    """A call that failed without a refusal: back off and try again."""

    def __init__(self, why: str, retry_after_s: float | None = None):
        super().__init__(why)
        self.retry_after_s = retry_after_s


class Refused(Exception):
    def __init__(self, status: int, code: str):
        super().__init__(f"{status} {code}")
        self.status, self.code = status, code


def _spki_pin(cert: x509.Certificate) -> str:
    spki = cert.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return "sha256/" + base64.b64encode(hashlib.sha256(spki).digest()).decode()


async def pinned_context(url: str, pin: str) -> ssl.SSLContext:
    """TLS trusting only the gateway CA whose key the pin names, fetched without verification."""
    unverified = ssl.create_default_context()
    unverified.check_hostname, unverified.verify_mode = False, ssl.CERT_NONE
    async with httpx.AsyncClient(verify=unverified) as http:
        offered = (await http.get(url + API + "/trust")).json()["gateway_ca_pem"]
    pinned = [c for c in x509.load_pem_x509_certificates(offered.encode()) if _spki_pin(c) == pin]
    if not pinned:
        raise Refused(0, "ca_pin_mismatch")
    return ssl.create_default_context(cadata=pinned[0].public_bytes(serialization.Encoding.PEM).decode())


@dataclass
class Identity:
    url: str
    collector_id: str
    key: ec.EllipticCurvePrivateKey = field(repr=False)
    tls: ssl.SSLContext
    dispatch_keys: dict[str, tuple[ed25519.Ed25519PublicKey, float]]


async def enroll(url: str, pin: str, token: str, collector_id: str) -> Identity:
    tls = await pinned_context(url, pin)
    key = ec.generate_private_key(ec.SECP256R1())
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, collector_id)]))
        .sign(key, hashes.SHA256())
    )
    body = {"token": token, "csr_pem": csr.public_bytes(serialization.Encoding.PEM).decode()}
    async with httpx.AsyncClient(verify=tls) as http:
        reply = await http.post(url + API + "/enroll", json=body)
    if reply.status_code != 200:
        raise Refused(reply.status_code, reply.json()["error"]["code"])
    answer = reply.json()
    tls = ssl.create_default_context(cadata=answer["ca_bundle_pem"])
    keys = {
        k["kid"]: (
            ed25519.Ed25519PublicKey.from_public_bytes(base64.b64decode(k["pub"])),
            _rfc3339(k["not_after"]),
        )
        for k in answer["dispatch_keys"]
    }
    return Identity(url, answer["collector_id"], key, tls, keys)


def _rfc3339(text: str) -> float:
    import datetime as dt

    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def report_signature(
    me: Identity, dispatch_id: str, outcome: str, result: bytes, code: str, message: str
) -> str:
    claims = {"iss": me.collector_id, "tid": dispatch_id, "out": outcome, "rsh": digest(result), "ecd": code,
              "emh": digest(message.encode()), "iat": int(time.time())}  # fmt: skip
    return jws(me.key, {"alg": "ES256", "typ": "versus-report+jwt"}, claims)


@dataclass
class Answer:
    status: int
    raw: bytes  # the body's bytes as received; b"" for none
    headers: dict[str, str]  # names lowercased: headers are read case-insensitively


def _error_code(raw: bytes | bytearray) -> str:
    try:
        return str(json.loads(raw)["error"]["code"])
    except (ValueError, KeyError, TypeError):
        return ""


class Transport:
    """The control socket when it works, per-call HTTPS when it does not ("Which transport")."""

    def __init__(self, me: Identity, https_for_s: float = HTTPS_FOR_S, socket: bool = True):
        self.me = me
        self.version = 1  # until a claim settles one
        self.https_for_s = https_for_s
        self.https_until = 0.0 if socket else float("inf")
        self._http = httpx.AsyncClient(base_url=me.url + API, verify=me.tls, timeout=30)
        self._ws: Any = None
        self._opened = 0.0
        self._reader: asyncio.Task[None] | None = None
        self._pending: dict[str, asyncio.Future[Answer]] = {}
        self._next_id = 0
        self.used: list[str] = []  # the transport of each call, for the tests to read

    async def close(self) -> None:
        await self._drop()
        await self._http.aclose()

    async def call(self, kind: str, body: Mapping[str, Any], timeout_s: float) -> Answer:
        if time.monotonic() >= self.https_until and self._ws is None:
            await self._open()
        answer = await (
            self._frame(kind, body, timeout_s) if self._ws is not None else self._post(kind, body, timeout_s)
        )
        if answer.status >= 500:
            raise Failed(f"{kind}: {answer.status}", retry_after(answer.headers.get("retry-after")))
        if answer.status >= 400:
            code = _error_code(answer.raw)
            if code == "version_unsupported":
                self.version = 1
            raise Refused(answer.status, code)
        return answer

    async def _open(self) -> None:
        host = urlsplit(self.me.url).netloc
        path = API + "/control"
        try:
            self._ws = await websockets.connect(
                f"wss://{host}{path}",
                ssl=self.me.tls,
                additional_headers={
                    "Authorization": "Bearer " + bearer(self.me.key, self.me.collector_id, "GET", path, b"")
                },
                compression=None,
                open_timeout=OPEN_TIMEOUT_S,
                max_size=3 * 1024 * 1024,
            )
        except websockets.InvalidStatus as exc:
            if exc.response.status_code == 503 and _error_code(exc.response.body):
                raise Failed("upgrade: 503", retry_after(exc.response.headers.get("Retry-After"))) from None
            self.https_until = time.monotonic() + self.https_for_s  # a proxy's answer, or a 4xx
            return
        except (ConnectionRefusedError, ConnectionResetError):
            raise Failed("upgrade: no connection") from None
        except (OSError, websockets.WebSocketException, TimeoutError):
            self.https_until = time.monotonic() + self.https_for_s
            return
        self._opened = time.monotonic()
        self._reader = asyncio.create_task(self._read(self._ws))

    async def _read(self, ws: Any) -> None:
        try:
            async for text in ws:
                frame = json.loads(text)
                body = text[text.index('"body":') + len('"body":') : -1]  # the frame's last member
                raw = b"" if frame["body"] is None else body.encode()
                headers = {k.lower(): str(v) for k, v in (frame.get("headers") or {}).items()}
                future = self._pending.pop(str(frame["id"]), None)
                if future is not None and not future.done():
                    future.set_result(Answer(int(frame["status"]), raw, headers))
        except websockets.WebSocketException:
            pass
        finally:
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(ConnectionError("control socket closed"))

    async def _drop(self) -> tuple[int | None, float]:
        """Close the socket; the gateway's close code and how long it was open."""
        ws, self._ws = self._ws, None
        if ws is None:
            return None, 0.0
        await ws.close()
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)
        return ws.close_code, time.monotonic() - self._opened

    async def _frame(self, kind: str, body: Mapping[str, Any], timeout_s: float) -> Answer:
        self._next_id += 1
        frame_id = str(self._next_id)
        if self.version >= 7:
            member: Any = json.dumps(body, ensure_ascii=False)
            bound = member.encode()
        else:
            member, bound = body, json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
        auth = bearer(self.me.key, self.me.collector_id, "FRAME", f"{API}/{kind}", bound)
        future = self._pending[frame_id] = asyncio.get_running_loop().create_future()
        try:
            await self._ws.send(
                json.dumps({"v": self.version, "id": frame_id, "type": kind, "auth": auth, "body": member})
            )
            async with asyncio.timeout(timeout_s):
                answer: Answer = await future
                self.used.append("wss")
                return answer
        except (websockets.WebSocketException, OSError, TimeoutError):
            self._pending.pop(frame_id, None)
            code, lived = await self._drop()
            if code in (1001, 1012) or lived >= STEADY_S:
                raise Failed(f"{kind}: the socket went away ({code})") from None
            self.https_until = time.monotonic() + self.https_for_s  # cut early: a proxy, likely
            raise Failed(f"{kind}: the socket dropped within {lived:.0f} s") from None

    async def _post(self, kind: str, body: Mapping[str, Any], timeout_s: float) -> Answer:
        path = f"{API}/{kind}"
        content = json.dumps(body).encode()
        headers = {
            "Authorization": "Bearer " + bearer(self.me.key, self.me.collector_id, "POST", path, content),
            "Content-Type": "application/json",
            "X-Versus-Protocol": str(self.version),
        }
        try:
            reply = await self._http.post("/" + kind, content=content, headers=headers, timeout=timeout_s)
        except httpx.HTTPError as exc:
            raise Failed(f"{kind}: {type(exc).__name__}") from None
        self.used.append("https")
        return Answer(reply.status_code, reply.content, {k.lower(): v for k, v in reply.headers.items()})


class ContractCollector:
    """Claims, verifies, runs ``contract/echo`` and reports, one task at a time."""

    def __init__(self, me: Identity, transport: Transport | None = None):
        self.me = me
        self.transport = transport or Transport(me)
        self.session_id = secrets.token_urlsafe(12)
        self.claim_seq = 0
        self.offset_s = 0.0  # the control plane's clock minus ours
        self.seen: set[str] = set()
        self.reports: dict[str, dict[str, Any]] = {}  # dispatch id: the gateway's answer
        self.refusals: dict[str, str] = {}  # dispatch id: the envelope's refusal code
        self.fatal: str | None = None
        self.failures = 0  # calls that failed and were backed off from

    async def publish(self) -> dict[str, Any]:
        operation = {"name": OPERATION, "op_class": "read", "timeout_s": 30, "parallel_safe": True}
        manifest = {
            "capability_epoch": 1,
            "providers": [{"provider": PROVIDER, "max_concurrency": 1, "operations": [operation]}],
        }
        return dict(json.loads((await self.transport.call("capabilities", manifest, 30)).raw))

    async def claim_once(self, wait_s: float) -> str | None:
        """One claim and what it brought: the dispatch id handled, or None."""
        self.claim_seq += 1
        body = {"claim_seq": self.claim_seq, "held_task_ids": [], "capacity": {PROVIDER: 1}, "wait_s": wait_s,
                "session_id": self.session_id, "protocol": OFFER}  # fmt: skip
        sent = time.time()
        answer = await self.transport.call("claim", body, wait_s + CLAIM_GRACE_S)
        received = time.time()
        if answer.status == 204:
            self._settle(answer.headers.get("x-versus-protocol"))
            self._clock(
                sent, received, answer.headers["x-versus-server-time-ms"], answer.headers["x-versus-held-ms"]
            )
            return None
        head = json.loads(answer.raw)
        self._settle(head.get("protocol"))
        self._clock(sent, received, head["server_time_ms"], head.get("held_ms", 0))
        for revoke in head.get("revokes", []):  # nothing is held across a claim here
            results = {d: "not_held" for d in revoke["dispatch_ids"]}
            await self.transport.call(
                "revoked", {"revocation_id": revoke["revocation_id"], "results": results}, 30
            )
        if "envelope" not in head:
            return None
        raw = answer.raw[answer.raw.index(b'"envelope":') + len(b'"envelope":') : -1]  # its last member
        dispatch_id = str(head["dispatch_id"])
        try:
            env = verify_envelope(
                raw, self.me.dispatch_keys, self.me.collector_id, time.time() + self.offset_s, self.seen
            )
        except EnvelopeRefused as exc:
            self.refusals[dispatch_id] = exc.code
            await self.report(dispatch_id, "refused", b"", exc.code, "refused by the contract client")
            return dispatch_id
        self.seen.add(env["task_id"])
        await self.report(dispatch_id, "success", env["params_bytes"])  # the echo driver
        return dispatch_id

    async def report(
        self, dispatch_id: str, outcome: str, result: bytes, code: str = "", message: str = ""
    ) -> None:
        signature = report_signature(self.me, dispatch_id, outcome, result, code, message)
        body = {"task_id": dispatch_id, "outcome": outcome, "result_b64": base64.b64encode(result).decode(),
                "error_code": code, "error_message": message, "signature": signature}  # fmt: skip
        attempt = 0
        while True:  # until it is answered
            try:
                self.reports[dispatch_id] = json.loads((await self.transport.call("report", body, 30)).raw)
                return
            except Failed as exc:
                self.failures += 1
                await asyncio.sleep(backoff(attempt, exc.retry_after_s))
                attempt += 1

    async def serve(self, stop: asyncio.Event, wait_s: float = 25.0) -> None:
        """Claim until stopped, backing off after failures; stops for good on a fatal refusal."""
        attempt = 0
        while not stop.is_set():
            try:
                await self.claim_once(wait_s)
                attempt = 0
                continue
            except Failed as exc:
                delay = backoff(attempt, exc.retry_after_s)
            except Refused as exc:
                if exc.code in FATAL:
                    self.fatal = exc.code
                    return
                delay = backoff(attempt, None)
            self.failures += 1
            attempt += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)

    def _settle(self, version: object) -> None:
        if isinstance(version, int | str) and str(version).isdigit():
            self.transport.version = int(version)

    def _clock(self, sent: float, received: float, server_ms: object, held_ms: object) -> None:
        # The server stamped its time when it answered: after the hold, about mid-way in what is left.
        trip = received - sent - int(str(held_ms)) / 1000
        self.offset_s = int(str(server_ms)) / 1000 - (received - max(trip, 0.0) / 2)
