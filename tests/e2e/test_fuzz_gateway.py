"""Schemathesis against the gateway's published OpenAPI document, over real TLS: no input may cause a 5xx.

Every operation of docs/openapi.json is called with generated bodies (valid
and invalid ones) as an enrolled, active collector whose bearer token is
minted fresh for each request, so the fuzzing reaches past authentication into
body validation and the router. Every answer must be below 500 and every
refusal must carry the stable error body. The default test command runs a
bounded number of examples per operation; ``make fuzz`` runs many more
(``VERSUS_FUZZ_EXAMPLES``) with fresh random draws.
"""

from __future__ import annotations

import json
import os
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from cryptography.hazmat.primitives.asymmetric import ec
from hypothesis import HealthCheck, settings

from tests.e2e.harness import ControlPlane, run_cli, service_env
from tests.support.collector_auth import bound_token
from tests.support.pki import csr_pem, p256

OPENAPI = Path(__file__).resolve().parents[2] / "docs" / "openapi.json"
EXAMPLES = int(os.environ.get("VERSUS_FUZZ_EXAMPLES", "30"))
# Each example is one request of a few milliseconds; generous for make fuzz's thousands.
pytestmark = pytest.mark.timeout(max(300, EXAMPLES))
# A generated claim may ask the gateway to hold it for up to 25 s; fuzzing wants answers.
MAX_FUZZ_WAIT_S = 0.2

schema = schemathesis.openapi.from_path(OPENAPI)


@dataclass
class Target:
    url: str
    ca_file: str
    collector_id: str
    key: ec.EllipticCurvePrivateKey

    def sign(self, request: Any) -> Any:
        """A requests auth hook: a bearer token bound to the request exactly as it is sent."""
        body = request.body or b""
        body = body.encode() if isinstance(body, str) else body
        token = bound_token(self.key, self.collector_id, request.method, request.path_url, body)
        request.headers["Authorization"] = "Bearer " + token
        return request


def _cli(args: list[str], env: dict[str, str]) -> Any:
    done = run_cli([*args, "--json"], env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    root = tmp_path_factory.mktemp("fuzz")
    cp = ControlPlane(service_env(root / "state"), root / "up.log").start()
    try:
        site = _cli(["sites", "create", "fuzz-site", "--tenant", "fuzz"], cp.env)["site"]["site_id"]
        token = _cli(["tokens", "issue", "--site", site, "--max-uses", "1"], cp.env)["plaintext"]
        key = p256()
        enrolled = httpx.post(
            cp.gateway_url + "/api/collector/v1/enroll",
            json={"token": token, "csr_pem": csr_pem(key, "col-fuzz")},
            verify=ssl.create_default_context(cafile=cp.ca_file),
            timeout=30,
        )
        assert enrolled.status_code == 200, enrolled.text
        yield Target(cp.gateway_url, str(cp.ca_file), "col-fuzz", key)
    finally:
        cp.stop()


def _bounded(case: Any) -> None:
    # A claim without wait_s is held for the server's full 25 s hold: ask for a short one instead.
    body = case.body
    if not (case.path.endswith("/claim") and isinstance(body, dict)):
        return
    wait = body.get("wait_s")
    numeric = isinstance(wait, int | float) and not isinstance(wait, bool)
    if wait is None or (numeric and wait > MAX_FUZZ_WAIT_S):
        body["wait_s"] = MAX_FUZZ_WAIT_S


@schema.parametrize()
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=os.environ.get("HYPOTHESIS_PROFILE") != "explore",
    suppress_health_check=list(HealthCheck),
)
def test_no_generated_request_makes_the_gateway_fail(case: Any, target: Target) -> None:
    _bounded(case)
    response = case.call(
        base_url=target.url,
        auth=target.sign,
        verify=target.ca_file,
        timeout=30,
    )
    detail = f"{case.method} {case.path} body={str(case.body)[:300]!r} -> {response.status_code}"
    assert response.status_code < 500, detail + f": {response.text[:300]}"
    if response.status_code >= 400:
        error = response.json()["error"]
        assert isinstance(error["code"], str) and error["code"] and isinstance(error["message"], str), detail
