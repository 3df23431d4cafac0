"""The console's pure checks: same-origin, form bodies, and which role sees which action."""

from __future__ import annotations

import pytest

from console import security, views

OWN = ("https://localhost:8444", "https://127.0.0.1:8444")


@pytest.mark.parametrize(
    ("origin", "fetch_site"),
    [
        ("https://localhost:8444", "same-origin"),
        ("https://127.0.0.1:8444", None),
        (None, "none"),
        (None, None),
    ],
)
def test_requests_from_the_console_itself_pass(origin: str | None, fetch_site: str | None) -> None:
    security.same_origin(OWN, origin, fetch_site)


@pytest.mark.parametrize(
    ("origin", "fetch_site"),
    [
        ("https://evil.example", None),
        ("null", "same-origin"),  # a sandboxed frame or a stripped referrer: not provably ours
        ("https://localhost:8444", "cross-site"),
        (None, "same-site"),  # a sibling subdomain is another site's code
        ("http://localhost:8444", None),  # the same host over plain HTTP is another origin
    ],
)
def test_requests_from_anywhere_else_are_refused(origin: str | None, fetch_site: str | None) -> None:
    with pytest.raises(security.Refused) as refused:
        security.same_origin(OWN, origin, fetch_site)
    assert (refused.value.status, refused.value.code) == (403, "cross_site_request")


def test_forms_are_bounded_and_read_once_per_field() -> None:
    assert security.form(b"csrf=a%2Bb&reason=&csrf=second") == {"csrf": "a+b", "reason": ""}
    with pytest.raises(security.Refused) as big:
        security.form(b"x=" + b"a" * security.MAX_FORM_BYTES)
    assert big.value.code == "body_too_large"
    with pytest.raises(security.Refused) as bad:
        security.form(b"\xff\xfe=1")
    assert bad.value.code == "invalid_body"


def test_each_role_sees_exactly_the_actions_the_services_allow_it() -> None:
    seen = {
        role: {a for a in views.ACTION_RPC if views.may(role, a)}
        for role in ("viewer", "operator", "collector-admin", "platform")
    }
    assert seen == {
        "viewer": {"probe"},
        "operator": {"probe", "drain", "undrain", "resolve", "cancel_task", "retry_task"},
        "collector-admin": {
            "probe",
            "drain",
            "undrain",
            "revoke",
            "resolve",
            "site_policy",
            "issue_token",
            "revoke_token",
            "approve",
            "deny",
            "apply_update",
            "cancel_update",
            "vault",
            "publish",
            "yank",
            "cancel_task",
            "retry_task",
            "create_vault_integration",
        },
        "platform": {"cancel_task"},  # the services' table; the console signs no platform token in
    }


def test_every_header_the_console_sends_is_strict() -> None:
    headers = dict(security.HEADERS)
    csp = headers[b"content-security-policy"].decode()
    assert "default-src 'none'" in csp and "'unsafe-inline'" not in csp and "frame-ancestors 'none'" in csp
    assert headers[b"x-frame-options"] == b"DENY"
