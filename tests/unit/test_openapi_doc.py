"""docs/openapi.json is the published collector API; it must match what the gateway serves."""

from __future__ import annotations

from tools import openapi


def test_published_document_is_current() -> None:
    assert openapi.OUT.read_text() == openapi.render(), (
        "run `python -m tools.openapi` and commit docs/openapi.json"
    )


def test_collector_api_is_documented() -> None:
    paths = openapi.document()["paths"]
    for path in ("claim", "report", "capabilities", "enroll", "renew", "enrollment", "trust"):
        assert f"/api/collector/v1/{path}" in paths


def test_request_bodies_are_documented() -> None:
    doc = openapi.document()
    body = doc["paths"]["/api/collector/v1/claim"]["post"]["requestBody"]["content"]["application/json"][
        "schema"
    ]
    assert body == {"$ref": "#/components/schemas/ClaimBody"}
    assert "held_task_ids" in doc["components"]["schemas"]["ClaimBody"]["properties"]
    assert "OperationIn" in doc["components"]["schemas"]  # nested models are registered too


def test_the_collector_bearer_is_declared_exactly_where_it_is_required() -> None:
    doc = openapi.document()
    scheme = doc["components"]["securitySchemes"]["CollectorBearer"]
    assert (scheme["type"], scheme["scheme"], scheme["bearerFormat"]) == ("http", "bearer", "JWT")
    secured = {
        path.rsplit("/", 1)[1]
        for path, operations in doc["paths"].items()
        for operation in operations.values()
        if operation.get("security") == [{"CollectorBearer": []}]
    }
    # Enrollment and the trust bundle come before a collector has a key; probes need no identity.
    assert secured == {"enrollment", "renew", "claim", "report", "capabilities"}


def test_every_refusal_is_declared_with_the_error_body() -> None:
    paths = openapi.document()["paths"]
    error = {"$ref": "#/components/schemas/ErrorBody"}

    def declared(path: str, method: str = "post") -> dict[str, str]:
        responses = paths[f"/api/collector/v1/{path}"][method]["responses"]
        return {
            status: r["description"]
            for status, r in responses.items()
            if status.startswith("4") and r["content"]["application/json"]["schema"] == error
        }

    enroll = declared("enroll")
    assert set(enroll) == {"400", "401", "408", "409", "413", "415"}
    assert "csr_cn_invalid" in enroll["400"] and "invalid_token" in enroll["401"]
    for path in ("claim", "report", "capabilities", "renew"):
        assert {"400", "401", "403", "413", "415"} <= set(declared(path)), path
    assert "report_not_expected" in declared("report")["412"]
    assert "session_superseded" in declared("claim")["409"]
    assert set(declared("trust", "get")) == {"404"}
