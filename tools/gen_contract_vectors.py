"""Regenerate vectors/protocol/client_contract.json: the worked examples of docs/protocol.md,
"The client contract" — bearer tokens for each kind of request and a report signature.

    python -m tools.gen_contract_vectors          # rewrite the file
    python -m tools.gen_contract_vectors --check  # exit 1 if the committed file differs

The key is fixed (an example, never used anywhere else) and the ECDSA signatures are
deterministic (RFC 6979), so the output is identical on every run. Each example gives the
header and claims exactly as encoded, so an implementation can compare its own encoding step
by step; any encoding of the same claims is accepted, only the values are binding.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

OUT = Path(__file__).resolve().parent.parent / "vectors" / "protocol" / "client_contract.json"
FORMAT = "versus-client-contract/1"
KEY = ec.derive_private_key(0x5EED_C011_EC70_0001, ec.SECP256R1())
COLLECTOR_ID = "col-example-1"
NOW = 1767225600  # 2026-01-01T00:00:00Z
API = "/api/collector/v1"


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _sign(header: dict[str, Any], claims: dict[str, Any]) -> dict[str, str]:
    header_json = json.dumps(header, separators=(",", ":"))
    claims_json = json.dumps(claims, separators=(",", ":"), ensure_ascii=False)
    signing_input = _b64url(header_json.encode()) + "." + _b64url(claims_json.encode())
    der = KEY.sign(signing_input.encode("ascii"), ec.ECDSA(hashes.SHA256(), deterministic_signing=True))
    r, s = decode_dss_signature(der)
    token = signing_input + "." + _b64url(r.to_bytes(32, "big") + s.to_bytes(32, "big"))
    return {"header_json": header_json, "claims_json": claims_json, "token": token}


def _bearer(name: str, method: str, path: str, body: str, jti: str) -> dict[str, Any]:
    claims = {
        "iss": COLLECTOR_ID, "sub": COLLECTOR_ID, "aud": "versus-collector-gateway", "iat": NOW,
        "exp": NOW + 60, "jti": jti, "htm": method, "htu": path,
        "bsh": _b64url(hashlib.sha256(body.encode()).digest()),
    }  # fmt: skip
    return {"name": name, "method": method, "path": path, "body_utf8": body,
            **_sign({"alg": "ES256", "typ": "JWT"}, claims)}  # fmt: skip


def document() -> dict[str, Any]:
    claim = json.dumps(
        {
            "claim_seq": 1,
            "held_task_ids": [],
            "wait_s": 25,
            "session_id": "s-1",
            "protocol": {"min": 1, "max": 7},
        },
        separators=(",", ":"),
    )
    report_claims = {
        "iss": COLLECTOR_ID, "tid": "dsp-example", "out": "success",
        "rsh": _b64url(hashlib.sha256(b'{"hello":"world"}').digest()), "ecd": "",
        "emh": _b64url(hashlib.sha256(b"").digest()), "iat": NOW,
    }  # fmt: skip
    public = KEY.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return {
        "format": FORMAT,
        "collector_id": COLLECTOR_ID,
        "public_key_pem": public.decode(),
        "now": NOW,
        "bearers": [
            _bearer("claim over HTTPS", "POST", f"{API}/claim", claim, "jti-example-0001"),
            _bearer("control socket upgrade", "GET", f"{API}/control", "", "jti-example-0002"),
            _bearer("claim frame, protocol 7", "FRAME", f"{API}/claim", claim, "jti-example-0003"),
        ],
        "report": {
            "dispatch_id": "dsp-example", "outcome": "success", "result_utf8": '{"hello":"world"}',
            "error_code": "", "error_message": "",
            **_sign({"alg": "ES256", "typ": "versus-report+jwt"}, report_claims),
        },
    }  # fmt: skip


def render() -> str:
    return json.dumps(document(), ensure_ascii=False, indent=1) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    if not args.check:
        OUT.write_text(render())
        return 0
    if not OUT.exists() or OUT.read_text() != render():
        print(f"stale: {OUT.name}; run python -m tools.gen_contract_vectors", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
