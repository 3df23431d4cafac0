"""Local credential injection on tunnels, against a real HTTPS device."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from collector.tunnel_inject import HttpInjector, injector_for
from tests.support.devices import HttpsDevice

pytestmark = pytest.mark.timeout(30)
SECRET = "device-token-7"


@pytest.fixture
def device(tmp_path: Path) -> Iterator[HttpsDevice]:
    https = HttpsDevice(tmp_path)
    yield https
    https.close()


def _injector(device: HttpsDevice) -> HttpInjector:
    credentials = {
        "http": {"lb-1": device.credentials(SECRET)},
        "tunnels": {"10.0.0.5:443": {"inject": "http", "target_ref": "lb-1"}},
    }
    injector = injector_for("10.0.0.5", 443, credentials)
    assert injector is not None
    return injector


async def _exchange(injector: HttpInjector, *chunks: bytes) -> bytes:
    """Feed the platform's bytes (then its half-close) and collect everything sent back."""
    inbox: asyncio.Queue[bytes | None] = asyncio.Queue()
    for chunk in chunks:
        inbox.put_nowait(chunk)
    inbox.put_nowait(None)
    out = bytearray()

    async def send(data: bytes) -> None:
        out.extend(data)

    await asyncio.wait_for(injector.serve(inbox.get, send), 20)
    return bytes(out)


async def test_requests_carry_the_local_credential_not_the_platforms(device: HttpsDevice) -> None:
    injector = _injector(device)
    assert SECRET not in repr(injector)
    first = b"GET /api/one HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer platform-guess\r\n\r\n"
    # Split the second request across chunks: the parser must not care where frames end.
    second = b"POST /api/two HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi"
    out = await _exchange(injector, first, second[:20], second[20:])
    assert out.count(b"HTTP/1.1 200 ") == 2
    assert b'"path":"/api/one"' in out and b'"path":"/api/two"' in out
    assert device.requests == [
        ("GET", "/api/one", f"Bearer {SECRET}"),
        ("POST", "/api/two", f"Bearer {SECRET}"),
    ]
    assert SECRET.encode() not in out


@pytest.mark.parametrize("target", [b"http://evil.example/steal", b"//evil.example/steal", b"*"])
async def test_requests_that_could_steer_the_credential_elsewhere_are_refused(
    device: HttpsDevice, target: bytes
) -> None:
    out = await _exchange(_injector(device), b"GET " + target + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 400 ")
    assert device.requests == []


async def test_malformed_http_gets_400(device: HttpsDevice) -> None:
    out = await _exchange(_injector(device), b"NOT HTTP AT ALL\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 400 ")
    assert device.requests == []


def test_tunnels_without_an_entry_stay_raw_and_bad_entries_are_clear_errors() -> None:
    assert injector_for("10.0.0.9", 22, {"tunnels": {}}) is None
    bad: list[tuple[dict[str, Any], str]] = [
        ({"tunnels": {"h:1": {"inject": "ssh"}}}, "unsupported inject mode 'ssh'"),
        ({"tunnels": {"h:1": {"inject": "http", "target_ref": "x"}}}, "no http credentials named 'x'"),
        (
            {
                "http": {"x": {"base_url": "https://h"}},
                "tunnels": {"h:1": {"inject": "http", "target_ref": "x"}},
            },
            "carry no bearer or username",
        ),
    ]
    for credentials, message in bad:
        with pytest.raises(ValueError, match=message):
            injector_for("h", 1, credentials)
    basic = injector_for(
        "h",
        1,
        {
            "http": {"x": {"base_url": "https://h", "username": "ops", "password": "pw"}},
            "tunnels": {"h:1": {"inject": "http", "target_ref": "x"}},
        },
    )
    assert basic is not None and basic.authorization == "Basic b3BzOnB3"
