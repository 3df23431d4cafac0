"""gRPC metadata keys that clients and servers of this project both name."""

from __future__ import annotations

# The bearer token of every call: ``authorization: Bearer <token>``.
AUTHORIZATION_HEADER = "authorization"
