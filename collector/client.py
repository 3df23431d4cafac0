"""The collector's HTTPS client for the gateway's control channel (claim, report, capabilities)."""

from __future__ import annotations

import ssl
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from cryptography.hazmat.primitives.asymmetric import ec

from common import collector_jwt

API = "/api/collector/v1"


class GatewayUnavailable(Exception):
    """The gateway could not be reached or answered 5xx: back off and try again."""


class GatewayRefused(Exception):
    """The gateway answered 4xx; ``code`` is its stable error code."""

    def __init__(self, status: int, code: str, message: str):
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code


@dataclass
class ClaimReply:
    dispatch_id: str | None
    envelope: bytes | None
    server_time_ms: int | None


def ssl_context(ca_bundle: Path) -> ssl.SSLContext:
    """System roots plus the CAs from enrollment, so both public and internal gateway certificates work."""
    ctx = ssl.create_default_context()
    ctx.load_verify_locations(cafile=str(ca_bundle))
    return ctx


class GatewayClient:
    def __init__(
        self, base_url: str, context: ssl.SSLContext, key: ec.EllipticCurvePrivateKey, collector_id: str
    ):
        self.collector_id = collector_id
        self._key = key
        self._http = httpx.AsyncClient(base_url=base_url.rstrip("/") + API, verify=context, timeout=30)

    async def close(self) -> None:
        await self._http.aclose()

    def _headers(self) -> dict[str, str]:
        return {
            "Authorization": "Bearer " + collector_jwt.mint(self._key, self.collector_id, int(time.time()))
        }

    async def _post(self, path: str, body: dict[str, Any], timeout_s: float = 30) -> httpx.Response:
        try:
            response = await self._http.post(path, json=body, headers=self._headers(), timeout=timeout_s)
        except httpx.HTTPError as exc:
            raise GatewayUnavailable(f"{path}: {type(exc).__name__}: {exc}") from None
        if response.status_code >= 500:
            raise GatewayUnavailable(f"{path}: HTTP {response.status_code}")
        if response.status_code >= 400:
            try:
                error = response.json()["error"]
                raise GatewayRefused(response.status_code, str(error["code"]), str(error["message"]))
            except (ValueError, KeyError, TypeError):
                raise GatewayRefused(
                    response.status_code, f"http_{response.status_code}", response.text[:200]
                ) from None
        return response

    async def claim(self, body: dict[str, Any], hold_s: float) -> ClaimReply:
        response = await self._post("/claim", body, timeout_s=hold_s + 15)
        if response.status_code == 204:
            stamp = response.headers.get("x-versus-server-time")
            return ClaimReply(None, None, _parse_ms(stamp))
        content = response.content
        marker = b'"envelope":'
        envelope = content[content.index(marker) + len(marker) : -1]
        head = response.json()
        return ClaimReply(str(head["dispatch_id"]), envelope, int(head["server_time_ms"]))

    async def report(self, body: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = (await self._post("/report", body)).json()
        return result

    async def capabilities(self, body: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = (await self._post("/capabilities", body)).json()
        return result


def _parse_ms(stamp: str | None) -> int | None:
    if not stamp:
        return None
    import datetime as dt

    try:
        return int(dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() * 1000)
    except ValueError:
        return None
