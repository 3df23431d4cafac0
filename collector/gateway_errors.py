"""How a gateway call failed, as the collector's loops act on it: try again later, or refused.

Apart from collector/client.py so the control socket (collector/ws_control.py) raises the same
errors without importing the HTTPS client."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class GatewayUnavailable(Exception):
    """The gateway could not be reached or answered 5xx: back off and try again."""


class GatewayRefused(Exception):
    """The gateway answered 4xx; ``code`` is its stable error code."""

    def __init__(self, status: int, code: str, message: str, details: Mapping[str, Any] | None = None):
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.details: dict[str, Any] = dict(details or {})
