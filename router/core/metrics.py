"""Router metrics (Prometheus), exposed on the router's metrics port."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

DISPATCH_STATES = Counter(
    "versus_router_dispatch_transitions_total", "Dispatches entering each state.", ["state"]
)
NO_ELIGIBLE_TOTAL = Counter(
    "versus_router_no_eligible_total", "Placement attempts that found no eligible collector."
)
QUEUE_DEPTH = Gauge(
    "versus_router_queue_depth", "Tasks waiting in the queued state (sampled by the sweeper)."
)
CERT_SOONEST_EXPIRY = Gauge(
    "versus_collector_cert_soonest_expiry_timestamp_seconds",
    "Unix time at which the first active collector certificate expires (NaN: no active collector; "
    "sampled by the sweeper). Alert when it is less than a few weeks away: renewals are failing.",
)
CLAIM_WAIT = Histogram(
    "versus_router_claim_wait_seconds",
    "How long claims were held before answering.",
    buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 20, 30),
)
SUBMIT_TO_CLAIM = Histogram(
    "versus_router_submit_to_claim_seconds",
    "From a dispatch being leased to a collector claiming it.",
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5, 30, 300),
)
