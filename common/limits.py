"""Limits that more than one service enforces, defined once (see docs/configuration.md)."""

from __future__ import annotations

# Most tasks one claim answer carries: the gateway refuses a larger ``max_tasks`` with 400 and
# the router caps ``max_dispatches`` at it. Large enough to amortise a claim over a burst.
MAX_CLAIM_BATCH = 32

# Largest collector release artifact the control plane publishes and the gateway serves
# (router/releases/update_repo.py, gateway/updates_api.py).
MAX_ARTIFACT_BYTES = 256 * 1024 * 1024

# Streamed task output (protocol 4, router/output/streams.py): the largest chunk one request carries, and
# the defaults for what one task and one tenant may hold (settings VERSUS_OUTPUT_TASK_LIMIT_BYTES,
# VERSUS_OUTPUT_TENANT_QUOTA_BYTES) and how long output is kept after its task ended
# (VERSUS_OUTPUT_RETENTION_S).
MAX_OUTPUT_CHUNK = 1024 * 1024
OUTPUT_TASK_LIMIT_BYTES = 1024 * 1024 * 1024
OUTPUT_TENANT_QUOTA_BYTES = 10 * 1024 * 1024 * 1024
OUTPUT_RETENTION_S = 7 * 24 * 3600

# Largest SBOM (CycloneDX JSON) a collector release may carry (router/releases/sbom.py): it travels in the
# release header and in GetRelease answers, under gRPC's 4 MiB default for clients. A collector's
# SBOM without licence texts is about 40 KiB.
MAX_SBOM_BYTES = 1024 * 1024
