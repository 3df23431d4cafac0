"""Every refusal each collector endpoint can answer, declared in the OpenAPI document.

One table: status -> the stable codes (docs/errors.md and docs/gateway.md explain each).
The body of every refusal is ``ErrorBody``: ``{"error": {"code", "message"[, "details"]}}``.
"""

from __future__ import annotations

from collections.abc import Mapping

_FRAMING = {
    400: "invalid_body (malformed JSON or a field out of range), bad_content_length, ambiguous_framing",
    408: "body_timeout (the body did not arrive in time)",
    413: "body_too_large",
    415: "unsupported_media_type (not application/json)",
    503: "database_unavailable, redis_unavailable, unavailable (retry with the same request)",
}
_BEARER = {
    401: "bearer_missing, bearer_duplicated, bearer_malformed, bearer_bad_signature, bearer_wrong_audience, "
    "bearer_lifetime_too_long, bearer_not_yet_valid, bearer_expired, collector_revoked, certificate_expired",
    403: "collector_pending, collector_denied, collector_not_active",
}

ERRORS: Mapping[str, Mapping[int, str]] = {
    "/api/collector/v1/trust": {404: "no_internal_ca (the gateway has a public certificate)"},
    "/api/collector/v1/enroll": {
        **_FRAMING,
        400: _FRAMING[400] + "; csr_invalid, csr_signature_invalid, csr_key_unsupported, csr_cn_missing, "
        "csr_cn_invalid",
        401: "invalid_token (unknown, expired, revoked or used up: one answer for all)",
        409: "collector_id_taken",
    },
    "/api/collector/v1/enrollment": {401: _BEARER[401], 503: _FRAMING[503]},
    "/api/collector/v1/renew": {
        **_FRAMING,
        **_BEARER,
        400: _FRAMING[400] + "; csr_invalid, csr_signature_invalid, csr_key_unsupported, csr_cn_invalid",
    },
    "/api/collector/v1/claim": {**_FRAMING, **_BEARER, 409: "session_superseded"},
    "/api/collector/v1/report": {
        **_FRAMING,
        **_BEARER,
        403: _BEARER[403] + ", not_your_dispatch",
        409: "conflicting_report",
        412: "report_not_expected (the dispatch was settled without this report)",
    },
    "/api/collector/v1/capabilities": {**_FRAMING, **_BEARER},
    "/api/collector/v1/updates/metadata/{name}": {
        **_BEARER,
        404: "update_not_found (no such file, or larger than any metadata may be)",
        503: _FRAMING[503],
    },
    "/api/collector/v1/updates/targets/{name}": {
        **_BEARER,
        404: "update_not_found (no such artifact, or over the artifact limit)",
        503: _FRAMING[503],
    },
}
