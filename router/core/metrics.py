"""Router metrics (Prometheus), exposed on the router's metrics port."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

DISPATCH_STATES = Counter(
    "versus_router_dispatch_transitions_total", "Dispatches entering each state.", ["state"]
)
NO_ELIGIBLE_TOTAL = Counter(
    "versus_router_no_eligible_total", "Placement attempts that found no eligible collector."
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
TASK_OUTCOMES = Counter(
    "versus_router_task_outcomes_total",
    "Tasks reaching an outcome, by op class and outcome (success, failed, expired, cancelled, and "
    "indeterminate: waiting for an operator), counted once the transaction committed.",
    ["op_class", "outcome"],
)
LADDER_STEPS = Counter(
    "versus_router_ladder_steps_total",
    "Steps of the unknown-outcome ladder (retry, reconcile, indeterminate) and what reconcile-reads "
    "answered (applied, not_applied, inconclusive).",
    ["step"],
)
LEASE_CONFLICTS = Counter(
    "versus_router_lease_conflicts_total",
    "Mutations refused because another task holds their device's lease: at submit (refused) or at a "
    "later placement (the task fails).",
    ["at"],
)

# Every series exists from the start, at 0 (alerts and dashboards see a rate, not an absence).
for _op_class in ("read", "mutate_reconcilable", "mutate_terminal"):
    for _outcome in ("success", "failed", "expired", "cancelled", "indeterminate"):
        TASK_OUTCOMES.labels(_op_class, _outcome)
for _step in ("retry", "reconcile", "indeterminate", "fail", "applied", "not_applied", "inconclusive"):
    LADDER_STEPS.labels(_step)
for _at in ("submit", "placement"):
    LEASE_CONFLICTS.labels(_at)
