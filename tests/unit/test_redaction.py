from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest
import structlog

from common.telemetry.logs import bind_request_id, configure_logging, get_logger, unbind_request_id
from common.telemetry.redaction import REDACTED, Secret, is_secret_key, redact, redact_text

PEM = "-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIB9ab3h7\nAoGBAK8=\n-----END EC PRIVATE KEY-----"
JWT = "eyJhbGciOiJFUzI1NiJ9.eyJzdWIiOiJjb2wtMSJ9.MEUCIQDsignaturepart"


@pytest.mark.parametrize(
    "name", ["token", "enrollment_token", "password", "private_key", "Authorization", "api-key", "csr_pem"]
)
def test_secret_field_names(name: str) -> None:
    assert is_secret_key(name)


@pytest.mark.parametrize(
    "name", ["token_id", "token_sha256", "token_prefix", "site_id", "collector_id", "kid"]
)
def test_identifier_field_names_are_kept(name: str) -> None:
    assert not is_secret_key(name)


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        (f"loaded key {PEM} ok", "MHcCAQEEIB9ab3h7"),
        (f"Authorization: Bearer {JWT}", "MEUCIQDsignaturepart"),
        (f"token {JWT} rejected", "eyJzdWIiOiJjb2wtMSJ9"),
        ("enroll --token vst_9f8e7d6c5b4a39281706 now", "9f8e7d6c5b4a39281706"),
        ("postgresql://versus:hunter2@db:5432/versus", "hunter2"),
        ("host=db password=hunter2 dbname=x", "hunter2"),
        ("redis://:s3cr3tpass@cache:6379/0", "s3cr3tpass"),
    ],
)
def test_secret_shapes_are_scrubbed_from_text(text: str, secret: str) -> None:
    cleaned = redact_text(text)
    assert secret not in cleaned
    assert cleaned != text


def test_redact_walks_nested_structures() -> None:
    event = {"site_id": "s1", "request": {"token": "abc", "items": [f"key {PEM}"]}, "body": b"raw"}
    cleaned = redact(event)
    assert cleaned["site_id"] == "s1"
    assert cleaned["request"]["token"] == REDACTED
    assert "MHcCAQEEIB9ab3h7" not in cleaned["request"]["items"][0]
    assert cleaned["body"] == "<3 bytes>"


def test_secret_wrapper_hides_value() -> None:
    s = Secret("hunter2")
    assert "hunter2" not in repr(s) and "hunter2" not in str(s) and "hunter2" not in f"{s}"
    assert s.reveal() == "hunter2"
    assert redact({"x": s}) == {"x": REDACTED}


@pytest.fixture
def json_log() -> Iterator[io.StringIO]:
    configure_logging(fmt="json", level="DEBUG", service="test", cache=False)
    stream = io.StringIO()
    logging.getLogger().handlers[0].setStream(stream)  # type: ignore[attr-defined]
    yield stream
    structlog.reset_defaults()
    configure_logging(cache=False)


def test_log_pipeline_never_writes_secrets(json_log: io.StringIO) -> None:
    bind_request_id("req-123")
    try:
        get_logger("t").info(
            "enrolling with vst_abcdefghijklmnop", token="vst_abcdefghijklmnop", site_id="s1"
        )
        logging.getLogger("thirdparty").warning("dsn postgresql://u:hunter2@db/x")
        try:
            raise RuntimeError(f"bad key {PEM}")
        except RuntimeError:
            get_logger("t").exception("failed")
    finally:
        unbind_request_id()
    output = json_log.getvalue()
    for secret in ("abcdefghijklmnop", "hunter2", "MHcCAQEEIB9ab3h7"):
        assert secret not in output
    lines = [json.loads(line) for line in output.splitlines()]
    assert lines[0]["site_id"] == "s1"
    assert lines[0]["request_id"] == "req-123"
    assert lines[0]["service"] == "test"
    assert lines[1]["logger"] == "thirdparty"
    assert "RuntimeError" in lines[2]["exception"]


def test_a_test_that_configured_logging_leaves_later_ones_able_to_capture() -> None:
    """Tests configure logging without caching loggers: a cached logger is invisible to capture_logs
    (a full run failed test_gateway_clients this way, depending on test order)."""
    from structlog.testing import capture_logs

    from common.telemetry.logs import get_logger

    configure_logging(fmt="json", level="DEBUG", cache=False)
    try:
        log = get_logger("tests.capture_after_configure")
        log.info("first use")
        with capture_logs() as logs:
            log.warning("second use")
        assert [e["event"] for e in logs] == ["second use"]
    finally:
        configure_logging(cache=False)
