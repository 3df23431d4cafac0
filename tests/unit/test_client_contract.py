"""docs/protocol.md, "The client contract", against the code on both sides of it: the numbers are the
reference collector's and the gateway's, the worked examples verify with the gateway's own
checks, and the contract client (tests/support/contract_client.py), written from the document
alone, imports nothing of this project and agrees with every golden vector."""

from __future__ import annotations

import ast
import base64
import datetime as dt
import inspect
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from collector import client as reference
from collector import gateway_errors, ws_control
from collector.agent_state import RunOptions, backoff
from common.config.settings import Settings
from common.trust import collector_jwt, report_signature
from common.trust.report_signature import ReportStatement
from gateway.control_ws import MAX_IN_FLIGHT
from gateway.parking.hub import LIVENESS_WINDOW_S
from tests.support import contract_client as contract
from tests.support import contract_envelope
from tools import gen_contract_vectors

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "protocol.md").read_text()
VECTORS = json.loads((ROOT / "vectors" / "protocol" / "client_contract.json").read_text())


def _public_key() -> ec.EllipticCurvePublicKey:
    key = serialization.load_pem_public_key(VECTORS["public_key_pem"].encode())
    assert isinstance(key, ec.EllipticCurvePublicKey)
    return key


PUBLIC = _public_key()


def _numbers_table() -> dict[str, list[float]]:
    block = DOC.split("<!-- client-contract-numbers -->", 1)[1].split("\n\n", 1)[0]
    rows = [line.split("|")[1:3] for line in block.strip().splitlines()[2:]]
    return {name.strip(): [float(n) for n in re.findall(r"\d+(?:\.\d+)?", value)] for name, value in rows}


def test_the_documented_numbers_are_the_ones_the_code_uses() -> None:
    hold = Settings.model_fields["claim_hold_s"]
    socket_hold = Settings.model_fields["socket_claim_hold_s"]
    backoff_defaults = inspect.signature(backoff).parameters
    run = RunOptions(state_dir=Path("/nonexistent"))
    expected = {
        "claim answer deadline": [reference.CLAIM_ANSWER_GRACE_S],
        "default `wait_s`": [run.claim_wait_s, 0, max(m.le for m in hold.metadata if hasattr(m, "le"))],
        "idle `wait_s` on the control socket": [
            run.socket_claim_wait_s,
            max(m.le for m in socket_hold.metadata if hasattr(m, "le")),
        ],
        "backoff": [0, backoff_defaults["cap"].default, backoff_defaults["base"].default, 2, 0],
        "`Retry-After`": [gateway_errors.MAX_RETRY_AFTER_S, 2],
        "control socket opening": [ws_control.OPEN_TIMEOUT_S],
        "socket steady after": [reference.WS_STEADY_S],
        "HTTPS fallback lasts": [reference.WS_RETRY_S],
        "bearer token lifetime": [
            collector_jwt.DEFAULT_LIFETIME_S,
            collector_jwt.MAX_LIFETIME_S,
            collector_jwt.LEEWAY_S,
        ],
        "in flight per socket": [MAX_IN_FLIGHT],
        "routable after the last claim": [LIVENESS_WINDOW_S],
    }
    assert _numbers_table() == expected
    assert run.max_backoff_s == backoff_defaults["cap"].default == contract.BACKOFF_CAP_S
    assert hold.default == run.claim_wait_s
    # The contract client holds the same numbers, from the document.
    assert (contract.CLAIM_GRACE_S, contract.OPEN_TIMEOUT_S, contract.STEADY_S, contract.HTTPS_FOR_S) == (
        reference.CLAIM_ANSWER_GRACE_S,
        ws_control.OPEN_TIMEOUT_S,
        reference.WS_STEADY_S,
        reference.WS_RETRY_S,
    )
    assert contract.RETRY_AFTER_MAX_S == gateway_errors.MAX_RETRY_AFTER_S
    assert set(contract.FATAL) == set(reference_fatal())


def reference_fatal() -> list[str]:
    from collector.claim_loop import FATAL_CLAIM_CODES

    return list(FATAL_CLAIM_CODES)


def test_the_contract_client_imports_nothing_of_this_project() -> None:
    allowed = {"httpx", "websockets", "cryptography", "tests"}
    for module in (contract, contract_envelope):
        tree = ast.parse(Path(str(module.__file__)).read_text())
        for node in ast.walk(tree):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            for name in names:
                top = name.split(".")[0]
                assert top in sys.stdlib_module_names or top in allowed, (module.__name__, name)
                if top == "tests":
                    assert name.startswith("tests.support.contract_"), name


def test_the_vectors_are_current() -> None:
    assert (
        ROOT / "vectors" / "protocol" / "client_contract.json"
    ).read_text() == gen_contract_vectors.render()


@pytest.mark.parametrize("example", VECTORS["bearers"], ids=lambda e: e["name"])
def test_each_worked_bearer_passes_the_gateways_checks(example: dict[str, Any]) -> None:
    claims = collector_jwt.verify(example["token"], PUBLIC, VECTORS["now"])
    claims.check_request(example["method"], example["path"])
    claims.check_body(example["body_utf8"].encode())
    assert claims.collector_id == VECTORS["collector_id"]
    header, payload, _ = example["token"].split(".")
    assert base64.urlsafe_b64decode(header + "==").decode() == example["header_json"]
    assert base64.urlsafe_b64decode(payload + "==").decode() == example["claims_json"]
    if not example["body_utf8"]:
        assert json.loads(example["claims_json"])["bsh"] in DOC  # the empty body's digest, as written


def test_the_worked_report_signature_passes_the_routers_check() -> None:
    r = VECTORS["report"]
    statement = ReportStatement(
        VECTORS["collector_id"],
        r["dispatch_id"],
        r["outcome"],
        r["result_utf8"].encode(),
        r["error_code"],
        r["error_message"],
    )
    report_signature.verify(r["token"], PUBLIC, statement)


def test_the_contract_clients_tokens_and_signatures_pass_the_gateways_checks() -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    body = '{"wait_s":25,"note":"wörld"}'.encode()
    token = contract.bearer(key, "col-c", "FRAME", "/api/collector/v1/claim", body)
    claims = collector_jwt.verify(token, key.public_key(), int(dt.datetime.now(dt.UTC).timestamp()))
    claims.check_request("FRAME", "/api/collector/v1/claim")
    claims.check_body(body)
    me = contract.Identity("https://gw", "col-c", key, None, {})  # type: ignore[arg-type]
    signature = contract.report_signature(me, "dsp-1", "failed", b"\x00\x01", "device_error", "näh")
    report_signature.verify(
        signature,
        key.public_key(),
        ReportStatement("col-c", "dsp-1", "failed", b"\x00\x01", "device_error", "näh"),
    )


def _envelope_cases() -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    out = []
    for path in sorted((ROOT / "vectors" / "envelope").glob("v1-*.json")):
        doc = json.loads(path.read_text())
        keys = {k["kid"]: k for k in doc["keys"]}
        out += [(f"{path.stem}/{case['name']}", case, keys) for case in doc["cases"]]
    return out


@pytest.mark.parametrize(
    ("name", "case", "keys"), _envelope_cases(), ids=lambda v: v if isinstance(v, str) else ""
)
def test_the_contract_clients_envelope_check_agrees_with_every_vector(
    name: str, case: dict[str, Any], keys: dict[str, Any]
) -> None:
    context = case["context"]
    trusted = {
        kid: (
            ed25519.Ed25519PublicKey.from_public_bytes(bytes.fromhex(keys[kid]["public_hex"])),
            dt.datetime.fromisoformat(keys[kid]["not_after"]).timestamp(),
        )
        for kid in context["trusted_kids"]
    }
    envelope = case["envelope"]
    raw = envelope.encode() if isinstance(envelope, str) else json.dumps(envelope).encode()
    now = dt.datetime.fromisoformat(context["now"]).timestamp()
    try:
        contract_envelope.verify_envelope(
            raw, trusted, context["collector_id"], now, set(context["seen_task_ids"])
        )
        verdict: dict[str, Any] = {"ok": True}
    except contract_envelope.EnvelopeRefused as exc:
        verdict = {"ok": False, "error": exc.code}
    expected = {
        "ok": case["expect"]["ok"],
        **({"error": case["expect"]["error"]} if "error" in case["expect"] else {}),
    }
    assert verdict == expected, name


def _claim_answers() -> list[dict[str, Any]]:
    answers = []
    for path in sorted((ROOT / "vectors" / "protocol").glob("v*.json")):
        answers += [a for a in json.loads(path.read_text())["gateway_answers"] if "envelope" in a]
    return answers


@pytest.mark.parametrize("answer", _claim_answers(), ids=lambda a: f"{a['transport']}-{a['name']}")
def test_the_contract_client_hands_the_verifier_the_envelopes_bytes_as_sent(answer: dict[str, Any]) -> None:
    if answer["transport"] == "wss":
        text = answer["frame"]
        raw = text[text.index('"body":') + len('"body":') : -1].encode()
    else:
        raw = answer["body"].encode()
    marker = b'"envelope":'
    assert raw[raw.index(marker) + len(marker) : -1].decode() == answer["envelope"]
