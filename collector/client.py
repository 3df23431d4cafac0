"""The collector's client for the gateway's control channel (claim, report, capabilities, bye).

Every message is written in the protocol version settled on the last claim (1
until a claim settles one): the ``X-Versus-Protocol`` header over HTTPS, the
frame's ``v`` over the socket. Each claim offers this build's range
(common/protocol.py); a gateway that predates negotiation answers without a
version, which settles 1.
"""

from __future__ import annotations

import json
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
from cryptography.hazmat.primitives.asymmetric import ec

from collector.gateway_errors import GatewayRefused, GatewayUnavailable, retry_after
from collector.request_auth import SignRequests, bound_token, frame_token, signed_report
from collector.state import StatePaths
from collector.ws_control import WebSocketBlocked, WsControl
from common import protocol
from common.envelope.fence import RoundTrip
from common.telemetry.logs import get_logger

API = "/api/collector/v1"
# After the control socket fails, use per-call HTTPS for this long before trying the socket again.
WS_RETRY_S = 60.0
# A socket that served at least this long and then dropped is reconnected, not abandoned for
# HTTPS: what ended it was the gateway (a restart, a crash) or the network, not a proxy that
# breaks WebSockets — those cut a socket at once or within its first minute.
WS_STEADY_S = 30.0
# How long past its hold a claim's answer is waited for (docs/protocol.md, "The client contract"):
# a client that gives up sooner abandons answers a loaded gateway is about to send, and comes back
# as one more handshake.
CLAIM_ANSWER_GRACE_S = 15.0

log = get_logger("versus.collector.client")


@dataclass
class ClaimReply:
    dispatch_id: str | None
    envelope: bytes | None
    # The claim's round trip with the server's clock; None when the answer did not carry the time.
    round_trip: RoundTrip | None
    offers: list[dict[str, Any]] = field(default_factory=list)
    # A newer signed config (collector/signed_config.py verifies it); no task then.
    config: dict[str, Any] | None = None
    # Rotation steps of the key sets we are behind on (collector/key_sets.py); no task then.
    key_sets: dict[str, Any] | None = None
    # A newer signed trust bundle (collector/trust.py verifies it); no task then.
    trust: dict[str, Any] | None = None
    # Protocol 3: what to do with tasks we hold, by dispatch id ("continue", "cancel", "terminate"),
    # and how long a cancelled driver may take to stop before it is stopped by force.
    verdicts: dict[str, str] = field(default_factory=dict)
    cancel_grace_s: float = 10.0
    # Protocol 5: credentials to take back from running tasks (collector/running.py revoke).
    revokes: list[dict[str, Any]] = field(default_factory=list)
    # Protocol 6 (vault mode B): per dispatch id, the signed document relaying its credential.
    credentials: dict[str, Any] = field(default_factory=dict)
    # The gateway's hand-out span (W3C traceparent) beside the envelope: telemetry only, never
    # trusted (common/telemetry/span_record.py); "" when the task is not traced.
    traceparent: str = ""


def ssl_context(paths: StatePaths) -> ssl.SSLContext:
    """System roots, the CAs of the trust bundle, and the operator's ``extra-ca.pem`` if there is one
    (a TLS-inspecting proxy's CA: the bundle file is rewritten by rotations, that one never is)."""
    ctx = ssl.create_default_context()
    ctx.load_verify_locations(cafile=str(paths.ca_bundle))
    if paths.extra_ca.exists():
        ctx.load_verify_locations(cafile=str(paths.extra_ca))
    return ctx


class GatewayClient:
    """Claim, report and publish capabilities: over the WebSocket when it works, per-call HTTPS otherwise."""

    def __init__(
        self,
        base_url: str,
        context: ssl.SSLContext,
        key: ec.EllipticCurvePrivateKey,
        collector_id: str,
        *,
        prefer_websocket: bool = True,
        ws_retry_s: float = WS_RETRY_S,
    ):
        self.collector_id = collector_id
        self._key = key
        self._context = context
        self._base = base_url.rstrip("/")
        # Every request is signed as it is sent: a token bound to its method, path and body.
        self._http = httpx.AsyncClient(
            base_url=self._base + API, verify=context, timeout=30, auth=SignRequests(key, collector_id)
        )
        self._prefer_ws = prefer_websocket
        self._ws: Any = None
        self._ws_retry_at = 0.0
        self._ws_retry_s = ws_retry_s
        self.transport = "https"
        # The protocol version settled with the gateway on the last claim: what messages are written in.
        self.protocol = 1

    async def close(self) -> None:
        if self._ws is not None:
            await self._ws.close()
        await self._http.aclose()

    def bearer(self, method: str, path: str) -> str:
        """A fresh bearer token for one body-less request: ``path`` is the full path with any query."""
        return bound_token(self._key, self.collector_id, method, path)

    def _sign_frame(self, kind: str, body: bytes) -> str:
        return frame_token(self._key, self.collector_id, kind, body)

    async def _over_websocket(
        self, kind: str, body: dict[str, Any], timeout_s: float
    ) -> tuple[int, bytes, dict[str, str]] | None:
        """(status, body, headers) over the control socket, or None to use HTTPS for this call."""

        if not self._prefer_ws:
            return None
        if self._ws is None or not self._ws.open:
            if time.monotonic() < self._ws_retry_at:
                return None
            ws = WsControl(
                "wss://" + self._base.split("://", 1)[1] + API + "/control",
                self._context,
                self.bearer("GET", API + "/control"),
                self._sign_frame,
            )
            try:
                # GatewayUnavailable (down, or shedding load) goes to the caller, who backs off and
                # comes back on a socket: HTTPS would meet the same gateway.
                await ws.connect()
            except WebSocketBlocked as exc:
                self._ws_retry_at = time.monotonic() + self._ws_retry_s
                self.transport = "https"
                log.info(
                    "control socket unavailable; using per-call HTTPS",
                    reason=str(exc),
                    retry_in_s=self._ws_retry_s,
                )
                return None
            self._ws = ws
            self.transport = "websocket"
            log.info("control socket open", url=ws.url)
        try:
            result: tuple[int, bytes, dict[str, str]] = await self._ws.request(
                kind, body, timeout_s, self.protocol
            )
            return result
        except GatewayUnavailable:
            lost: WsControl = self._ws
            await lost.close()
            self._ws = None
            if lost.gateway_left or lost.lived_s >= WS_STEADY_S:
                # The gateway restarted or went away, or the link dropped a socket that had worked
                # for a while: come back on a socket once the caller has backed off.
                log.info("control socket lost; reconnecting", gateway_left=lost.gateway_left)
                raise
            # Some proxies pass HTTPS but break WebSockets: fall back now, try the socket again later.
            log.info("control socket lost; using per-call HTTPS", retry_in_s=self._ws_retry_s)
            self._ws_retry_at = time.monotonic() + self._ws_retry_s
            self.transport = "https"
            return None

    async def _call(
        self,
        kind: str,
        body: dict[str, Any],
        timeout_s: float = 30,
        on_socket: tuple[dict[str, Any], float] | None = None,
    ) -> tuple[int, bytes, httpx.Headers]:
        """``on_socket``: the body and timeout to use instead when the call goes over the socket."""
        over_ws = await self._over_websocket(kind, *(on_socket or (body, timeout_s)))
        if over_ws is not None:
            status, raw, frame_headers = over_ws
            headers = httpx.Headers(frame_headers)
        else:
            try:
                response = await self._http.post(
                    "/" + kind, json=body, timeout=timeout_s, headers={protocol.HEADER: str(self.protocol)}
                )
            except httpx.HTTPError as exc:
                raise GatewayUnavailable(f"{kind}: {type(exc).__name__}: {exc}") from None
            status, raw, headers = response.status_code, response.content, response.headers
        if status >= 500:
            raise GatewayUnavailable(f"{kind}: HTTP {status}", retry_after(headers.get("retry-after")))
        if status >= 400:
            refused = _refused(status, raw)
            if refused.code == protocol.VersionUnsupported.default_code:
                # The gateway no longer speaks what we settled (rolled back, or another replica):
                # write in version 1 until the next claim settles again.
                log.warning("gateway refused our protocol version", version=self.protocol, why=str(refused))
                self.protocol = 1
            raise refused
        return status, raw, headers

    def _settle(self, version: int) -> None:
        if version != self.protocol:
            log.info("collector protocol settled", version=version)
        self.protocol = version

    async def claim(
        self, body: dict[str, Any], hold_s: float, socket_hold_s: float | None = None
    ) -> ClaimReply:
        """Claim with ``hold_s`` as the wait; on the control socket with ``socket_hold_s`` instead,
        when given (an idle collector: the socket's pings are its heartbeat there)."""
        sent = time.time()
        offer = {"min": protocol.MIN_PROTOCOL_VERSION, "max": protocol.PROTOCOL_VERSION}
        message = {**body, "protocol": offer}
        on_socket = None
        if socket_hold_s is not None:
            on_socket = ({**message, "wait_s": socket_hold_s}, socket_hold_s + CLAIM_ANSWER_GRACE_S)
        status, raw, headers = await self._call(
            "claim", message, timeout_s=hold_s + CLAIM_ANSWER_GRACE_S, on_socket=on_socket
        )
        reply, settled = read_claim_answer(status, raw, headers, sent, time.time())
        self._settle(settled)
        return reply

    async def report(self, body: dict[str, Any]) -> dict[str, Any]:
        """Send a report, signed over what it says (the router checks it against our key)."""
        signed = signed_report(self._key, self.collector_id, body)
        result: dict[str, Any] = json.loads((await self._call("report", signed))[1])
        return result

    async def bye(self, session_id: str, reason: str) -> bool:
        """Tell the gateway this session is shutting down cleanly (protocol 2; skipped below it).
        True when the control plane recorded it; failures are the caller's to ignore."""
        if self.protocol < 2:
            return False
        _, raw, _ = await self._call("bye", {"session_id": session_id, "reason": reason}, timeout_s=5)
        return bool(json.loads(raw).get("current"))

    async def revoked(self, revocation_id: str, results: Mapping[str, str]) -> bool:
        """Tell the control plane what was scrubbed for a revocation (protocol 5)."""
        body = {"revocation_id": revocation_id, "results": dict(results)}
        return bool(json.loads((await self._call("revoked", body))[1]).get("recorded"))

    async def output(self, dispatch_id: str, offset: int, data: bytes) -> int:
        """One chunk of a task's output at ``offset`` (protocol 4, always over HTTPS); the ack: where
        the next chunk starts. A gap or overlap is :class:`GatewayRefused` with ``details["acked"]``."""
        answer = await self._https(
            "output",
            params={"task_id": dispatch_id, "offset": offset},
            content=data,
            headers={"Content-Type": "application/octet-stream", protocol.HEADER: str(self.protocol)},
        )
        return int(answer["acked"])

    async def renew(self, csr_pem: str) -> dict[str, Any]:
        """A new certificate for the collector's key (``/renew``, always over HTTPS)."""
        return await self._https("renew", json={"csr_pem": csr_pem})

    async def _https(self, name: str, **request: Any) -> dict[str, Any]:
        """POST ``/<name>`` over HTTPS whatever the transport: 5xx and network errors are
        :class:`GatewayUnavailable`, 4xx :class:`GatewayRefused`; the JSON answer otherwise."""
        try:
            response = await self._http.post("/" + name, **request)
        except httpx.HTTPError as exc:
            raise GatewayUnavailable(f"{name}: {type(exc).__name__}: {exc}") from None
        if response.status_code >= 500:
            raise GatewayUnavailable(f"{name}: HTTP {response.status_code}")
        if response.status_code >= 400:
            raise _refused(response.status_code, response.content)
        result: dict[str, Any] = response.json()
        return result

    async def capabilities(self, body: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = json.loads((await self._call("capabilities", body))[1])
        return result


def settled_version(answer: object) -> int:
    """The version a claim's answer names; absent or out of this build's range: 1 (a gateway from
    before negotiation says nothing, and 1 is what both sides always speak)."""
    try:
        version = int(answer) if isinstance(answer, (int, str)) else 1
    except ValueError:
        return 1
    return version if protocol.MIN_PROTOCOL_VERSION <= version <= protocol.PROTOCOL_VERSION else 1


def read_claim_answer(
    status: int, raw: bytes, headers: Mapping[str, str], sent: float, received: float
) -> tuple[ClaimReply, int]:
    """A claim's answer as the agent uses it, and the protocol version it settles.

    Members this build does not know are ignored; the envelope is read as the bytes between its
    member name and the end of the object (it is the answer's last member), exactly as signed.
    """
    if status == 204 or not raw:
        trip = _round_trip(
            sent, received, headers.get("x-versus-server-time-ms"), headers.get("x-versus-held-ms")
        )
        return ClaimReply(None, None, trip), settled_version(headers.get(protocol.HEADER.lower()))
    head = json.loads(raw)
    settled = settled_version(head.get("protocol"))
    trip = _round_trip(sent, received, head.get("server_time_ms"), head.get("held_ms"))
    offers = list(head.get("offers", []))
    held = _held_verdicts(head, settled)
    if isinstance(head.get("key_sets"), dict):
        return ClaimReply(None, None, trip, [], key_sets=dict(head["key_sets"]), **held), settled
    if isinstance(head.get("config"), dict):
        return ClaimReply(None, None, trip, [], dict(head["config"]), **held), settled
    if isinstance(head.get("trust"), dict):
        return ClaimReply(None, None, trip, [], trust=dict(head["trust"]), **held), settled
    if "envelope" not in head:
        return ClaimReply(None, None, trip, offers, **held), settled
    marker = b'"envelope":'
    envelope = raw[raw.index(marker) + len(marker) : -1]
    traced = head.get("traceparent")
    return ClaimReply(
        str(head["dispatch_id"]),
        envelope,
        trip,
        offers,
        **held,
        traceparent=traced if isinstance(traced, str) else "",
    ), settled


VERDICTS = frozenset({"continue", "cancel", "terminate"})


def _held_verdicts(head: Mapping[str, Any], settled: int) -> dict[str, Any]:
    """The verdicts on held tasks an answer carries (protocol 3), those we know how to act on."""
    raw = head.get("verdicts")
    if settled < protocol.floor_of("cancel") or not isinstance(raw, dict):
        return {**_revokes(head, settled), **_credentials(head, settled)}
    grace = head.get("cancel_grace_s")
    out: dict[str, Any] = {
        "verdicts": {str(k): v for k, v in raw.items() if v in VERDICTS},
        **_revokes(head, settled),
        **_credentials(head, settled),
    }
    if isinstance(grace, int | float) and not isinstance(grace, bool) and 0 < grace <= 3600:
        out["cancel_grace_s"] = float(grace)
    return out


def _credentials(head: Mapping[str, Any], settled: int) -> dict[str, Any]:
    """The relayed credentials an answer carries (protocol 6): signed documents, verified later."""
    raw = head.get("credentials")
    if settled < protocol.floor_of("relayed_credentials") or not isinstance(raw, dict):
        return {}
    return {"credentials": {str(d): doc for d, doc in raw.items() if isinstance(doc, dict)}}


def _well_formed_revoke(r: object) -> bool:
    return (
        isinstance(r, dict)
        and isinstance(r.get("revocation_id"), str)
        and r.get("action") in ("scrub", "kill")
        and isinstance(r.get("dispatch_ids"), list)
        and all(isinstance(d, str) for d in r["dispatch_ids"])
    )


def _revokes(head: Mapping[str, Any], settled: int) -> dict[str, Any]:
    """The credential revocations an answer carries (protocol 5), well formed ones only."""
    raw = head.get("revokes")
    if settled < protocol.floor_of("credential_revoke") or not isinstance(raw, list):
        return {}
    good = [
        {"revocation_id": r["revocation_id"], "action": r["action"], "dispatch_ids": list(r["dispatch_ids"]),
         "credential_ref": str(r.get("credential_ref", ""))}
        for r in raw
        if _well_formed_revoke(r)
    ]  # fmt: skip
    return {"revokes": good} if good else {}


def _refused(status: int, raw: bytes) -> GatewayRefused:
    try:
        error = json.loads(raw)["error"]
        details = error.get("details")
        return GatewayRefused(
            status, str(error["code"]), str(error["message"]), details if isinstance(details, dict) else None
        )
    except (ValueError, KeyError, TypeError):
        return GatewayRefused(status, f"http_{status}", raw[:200].decode(errors="replace"))


def _round_trip(sent: float, received: float, server_ms: object, held_ms: object) -> RoundTrip | None:
    """The claim's round trip, or None when the answer lacks the server's time (an older gateway)."""
    try:
        server = int(str(server_ms)) / 1000
        held = int(str(held_ms)) / 1000 if held_ms is not None else 0.0
    except ValueError:
        return None
    return RoundTrip(sent_s=sent, received_s=received, server_s=server, held_s=held)
