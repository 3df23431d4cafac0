"""How a gateway call failed, as the collector's loops act on it: try again later, or refused.

Apart from collector/client.py so the control socket (collector/ws_control.py) raises the same
errors without importing the HTTPS client."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# The longest wait a gateway's ``Retry-After`` may impose; a larger value is taken as this.
MAX_RETRY_AFTER_S = 300.0


class GatewayUnavailable(Exception):
    """The gateway could not be reached or answered 5xx: back off and try again.

    ``retry_after_s`` is the wait the gateway asked for with ``Retry-After`` (a 503 while it sheds
    load), or None."""

    def __init__(self, message: str, retry_after_s: float | None = None):
        super().__init__(message)
        self.retry_after_s = retry_after_s


def retry_after(value: str | None) -> float | None:
    """A ``Retry-After`` header as seconds: delta-seconds only (an HTTP date or anything else is
    ignored), at most :data:`MAX_RETRY_AFTER_S`."""
    if value is None or not value.strip().isdigit():
        return None
    return min(float(value.strip()), MAX_RETRY_AFTER_S)


class GatewayRefused(Exception):
    """The gateway answered 4xx; ``code`` is its stable error code."""

    def __init__(self, status: int, code: str, message: str, details: Mapping[str, Any] | None = None):
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.details: dict[str, Any] = dict(details or {})
