"""Protocol 7's frames from a client in another language (Node.js, tests/support/frame_client.js):
its bodies are written by JSON.stringify, keys in insertion order and non-ASCII as it is, and its
tokens bind those bytes; the real gateway takes them with no canonical JSON on either side. The
same client writing protocol 6 (a body object, which the gateway hashes in canonical form) is
refused: the trap protocol 7 removes (docs/protocol.md, "Exact frame bodies")."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import websockets
from cryptography.hazmat.primitives import serialization

from tests.integration import test_gateway_collector as gw

CLIENT = Path(__file__).resolve().parents[1] / "support" / "frame_client.js"
stack = gw.stack  # the same real enrollment + router + gateway stack


def _node_frames(key_pem: Path, collector_id: str) -> list[str]:
    node = shutil.which("node")
    assert node, "Node.js is a test dependency (make system-deps installs nodejs)"
    done = subprocess.run(
        [node, str(CLIENT), str(key_pem), collector_id],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    frames: list[str] = json.loads(done.stdout)
    return frames


async def test_a_node_client_needs_no_canonical_json_from_protocol_seven(
    stack: gw.Stack, tmp_path: Path
) -> None:
    c = await stack.enroll("col-node")
    key_pem = tmp_path / "key.pem"
    key_pem.write_bytes(
        c.key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    claim, bye, bye_v6 = _node_frames(key_pem, c.collector_id)
    # What makes these frames a test: bytes Python's canonical form would not have written.
    assert '\\"wait_s\\":0,\\"session_id\\"' in claim and "arrêt" in bye
    url = stack.url.replace("http://", "ws://") + gw.API + "/control"
    headers = c.headers_for("GET", gw.API + "/control")
    async with websockets.connect(url, additional_headers=headers, open_timeout=5) as ws:
        answers: dict[str, Any] = {}
        for text in (claim, bye_v6, bye):
            await ws.send(text)
            answer = json.loads(await ws.recv())
            answers[answer["id"]] = answer
    assert (answers["claim"]["status"], answers["claim"]["v"]) == (204, 7)
    # Protocol 6 hashed the body object's canonical form: another encoder's bytes do not match it.
    assert answers["bye6"]["status"] == 401
    assert answers["bye6"]["body"]["error"]["code"] == "bearer_wrong_body"
    assert answers["bye"]["status"] == 200, answers["bye"]
