"""Validation of SubmitTask requests, the fingerprint that detects idempotency-key reuse, and the
request an operator's retry of a settled task submits. Pure code."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from common.envelope.canonical import MAX_PARAMS_BYTES, MAX_TEXT_BYTES, OpClass
from common.errors import FailedPrecondition, InvalidArgument, PayloadTooLarge
from common.protocol import check_features

MAX_DEADLINE = dt.timedelta(days=7)
MAX_LABELS = 32
MAX_LABEL_CHARS = 256
_OP_CLASSES = frozenset(c.value for c in OpClass)


@dataclass(frozen=True, slots=True)
class SubmitRequest:
    provider: str
    operation: str
    op_class: str
    target_ref: str
    site_id: str
    tenant_id: str
    params: bytes
    idempotency_key: str
    deadline: dt.datetime
    requires_fips: bool = False
    labels: Mapping[str, str] = field(default_factory=dict)
    # Collector features the task needs (common/protocol.py FEATURE_FLOORS), sorted, no repeats.
    features: tuple[str, ...] = ()


def _text(name: str, value: str) -> None:
    if not value:
        raise InvalidArgument(f"{name} is required", code=f"{name}_missing")
    if len(value.encode("utf-8", "surrogatepass")) > MAX_TEXT_BYTES or not value.isprintable():
        raise InvalidArgument(
            f"{name} must be printable and at most {MAX_TEXT_BYTES} bytes", code=f"{name}_invalid"
        )


def validate(req: SubmitRequest, now: dt.datetime) -> None:
    """Refuse a request before anything is written (INVALID_ARGUMENT with a stable code)."""
    for name in ("provider", "operation", "target_ref", "site_id", "tenant_id", "idempotency_key"):
        _text(name, getattr(req, name))
    if req.op_class not in _OP_CLASSES:
        raise InvalidArgument(
            "op_class must be read, mutate_reconcilable or mutate_terminal", code="op_class_invalid"
        )
    if len(req.params) > MAX_PARAMS_BYTES:
        raise PayloadTooLarge(f"params exceed {MAX_PARAMS_BYTES} bytes", code="params_too_large")
    if req.deadline <= now:
        raise InvalidArgument("deadline is in the past", code="deadline_past")
    if req.deadline > now + MAX_DEADLINE:
        raise InvalidArgument(f"deadline is more than {MAX_DEADLINE.days} days away", code="deadline_too_far")
    if len(req.labels) > MAX_LABELS or any(
        len(k) > MAX_LABEL_CHARS or len(v) > MAX_LABEL_CHARS for k, v in req.labels.items()
    ):
        raise InvalidArgument(
            f"at most {MAX_LABELS} labels of at most {MAX_LABEL_CHARS} characters", code="labels_invalid"
        )
    if check_features(req.features) != req.features:
        raise InvalidArgument("features must be sorted and without repeats", code="features_invalid")


def fingerprint(req: SubmitRequest) -> bytes:
    """What makes two submissions "the same request" for an idempotency key.

    The deadline is left out: a caller retrying a submission naturally computes
    a new one.
    """
    doc = {
        "provider": req.provider,
        "operation": req.operation,
        "op_class": req.op_class,
        "target_ref": req.target_ref,
        "site_id": req.site_id,
        "tenant_id": req.tenant_id,
        "params_sha256": hashlib.sha256(req.params).hexdigest(),
        "requires_fips": req.requires_fips,
        "labels": dict(sorted(req.labels.items())),
    }
    if req.features:
        # Only when present, so the fingerprints of tasks from before features are unchanged.
        doc["features"] = list(req.features)
    return hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()).digest()


# Where a retried task points back to the task it repeats (a label, so it is listed and filtered).
RETRY_OF_LABEL = "versus.retry_of"
SETTLED_STATES = frozenset({"success", "failed", "expired", "cancelled", "indeterminate"})


@dataclass(frozen=True, slots=True)
class Audited:
    """An audit event written with a new task, in its transaction."""

    actor: str
    action: str
    details: Mapping[str, Any]


def retry_request(
    task: Mapping[str, Any], key: str, now: dt.datetime, *, terminal_confirmed: bool
) -> SubmitRequest:
    """The request that runs a settled task again: the same operation, target, parameters, labels and
    features, a new idempotency key, and as long to its deadline as the original was given.

    A task still in flight is refused (``task_not_settled``): cancel it first. A terminal mutation
    cannot be retried without the operator saying so (``terminal_retry_unconfirmed``): it is not
    safely repeatable, which is why the ladder never retries it on its own.
    """
    if task["state"] not in SETTLED_STATES:
        raise FailedPrecondition(
            f"task {task['task_id']} is {task['state']}: only a settled task can be retried",
            code="task_not_settled",
        )
    if task["op_class"] == "mutate_terminal" and not terminal_confirmed:
        raise FailedPrecondition(
            "a terminal mutation is not safely repeatable: confirm the retry to run it again",
            code="terminal_retry_unconfirmed",
        )
    given = max(task["deadline"] - task["created_at"], dt.timedelta(seconds=60))
    labels = {**task["labels"], RETRY_OF_LABEL: task["task_id"]}
    return SubmitRequest(
        provider=task["provider"], operation=task["operation"], op_class=task["op_class"],
        target_ref=task["target_ref"], site_id=task["site_id"], tenant_id=task["tenant_id"],
        params=bytes(task["params"]), idempotency_key=key, deadline=now + min(given, MAX_DEADLINE),
        requires_fips=task["requires_fips"], labels=labels, features=tuple(task["features"]),
    )  # fmt: skip
