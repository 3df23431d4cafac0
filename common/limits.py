"""Limits that more than one service enforces, defined once (see docs/configuration.md)."""

from __future__ import annotations

# Most tasks one claim answer carries: the gateway refuses a larger ``max_tasks`` with 400 and
# the router caps ``max_dispatches`` at it. Large enough to amortise a claim over a burst.
MAX_CLAIM_BATCH = 32

# Largest collector release artifact the control plane publishes and the gateway serves
# (router/update_repo.py, gateway/updates_api.py).
MAX_ARTIFACT_BYTES = 256 * 1024 * 1024
