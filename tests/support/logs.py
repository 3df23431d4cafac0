"""Capture what the services log during a test, and check that no credential is in it.

A pytest plugin (tests/conftest.py): modules opt in with ``usefixtures("no_secret_logged")``.
"""

from __future__ import annotations

import contextlib
import io
import logging
import re
from collections.abc import Iterator

import pytest

from common.telemetry.logs import configure_logging

# What a credential looks like in text: none of these may ever be logged, refused or not.
SECRET_PATTERNS = {
    "a bearer token (JWT)": re.compile(r"eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"),
    "an enrollment token": re.compile(r"vst_[A-Za-z0-9_-]{16,}"),
    "an API token": re.compile(r"vsk_[A-Za-z0-9_-]{16,}"),
    "a private key": re.compile(r"PRIVATE KEY"),
}


@contextlib.contextmanager
def captured_logs() -> Iterator[io.StringIO]:
    """Every log line of this process (JSON, DEBUG and up) while the block runs."""
    stream = io.StringIO()
    configure_logging(fmt="json", level="DEBUG", cache=False)
    handler = logging.getLogger().handlers[0]
    assert isinstance(handler, logging.StreamHandler)
    handler.setStream(stream)
    try:
        yield stream
    finally:
        configure_logging(cache=False)


def assert_no_secrets(text: str) -> None:
    for what, pattern in SECRET_PATTERNS.items():
        found = pattern.search(text)
        # Show only the start of what leaked: the failure output is itself a log.
        assert found is None, f"{what} reached the log: {found.group()[:10]}…"


@pytest.fixture
def no_secret_logged() -> Iterator[None]:
    """Capture the log for the test and fail it if anything shaped like a credential reached it."""
    with captured_logs() as stream:
        yield
    assert_no_secrets(stream.getvalue())
