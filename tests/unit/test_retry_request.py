"""The request an operator's retry submits: what it copies, what it changes, and what it refuses."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from common.errors import FailedPrecondition
from router.dispatch.submit import RETRY_OF_LABEL, retry_request, validate

NOW = dt.datetime(2026, 12, 6, 12, 0, tzinfo=dt.UTC)


def _task(**changes: Any) -> dict[str, Any]:
    created = NOW - dt.timedelta(hours=2)
    task = {
        "task_id": "tsk-1", "state": "failed", "provider": "ssh", "operation": "show", "op_class": "read",
        "target_ref": "dev-1", "site_id": "site-1", "tenant_id": "acme", "params": memoryview(b'{"a":1}'),
        "requires_fips": True, "labels": {"change": "CHG-7"}, "features": ["cancel"],
        "created_at": created, "deadline": created + dt.timedelta(minutes=10),
    }  # fmt: skip
    task.update(changes)
    return task


def test_a_retry_repeats_the_operation_with_a_new_key_and_a_fresh_deadline() -> None:
    again = retry_request(_task(), "retry-key", NOW, terminal_confirmed=False)
    assert (again.provider, again.operation, again.op_class, again.target_ref) == (
        "ssh",
        "show",
        "read",
        "dev-1",
    )
    assert (again.site_id, again.tenant_id, again.params, again.requires_fips) == (
        "site-1",
        "acme",
        b'{"a":1}',
        True,
    )
    assert again.idempotency_key == "retry-key"
    assert again.labels == {"change": "CHG-7", RETRY_OF_LABEL: "tsk-1"}
    assert again.features == ("cancel",)
    assert again.deadline == NOW + dt.timedelta(minutes=10)  # as long as the original was given
    validate(again, NOW)  # a request SubmitTask itself accepts


def test_a_retry_of_a_retry_points_at_the_task_it_repeats() -> None:
    again = retry_request(
        _task(task_id="tsk-2", labels={RETRY_OF_LABEL: "tsk-1"}), "k", NOW, terminal_confirmed=False
    )
    assert again.labels[RETRY_OF_LABEL] == "tsk-2"


def test_a_short_or_a_long_deadline_is_kept_within_bounds() -> None:
    short = _task(deadline=NOW - dt.timedelta(hours=2) + dt.timedelta(seconds=5))
    assert retry_request(short, "k", NOW, terminal_confirmed=False).deadline == NOW + dt.timedelta(seconds=60)
    long = _task(deadline=NOW + dt.timedelta(days=30))
    assert retry_request(long, "k", NOW, terminal_confirmed=False).deadline == NOW + dt.timedelta(days=7)


@pytest.mark.parametrize("state", ["queued", "leased", "dispatched", "running", "unknown", "reconciling"])
def test_a_task_in_flight_is_not_retried(state: str) -> None:
    with pytest.raises(FailedPrecondition) as refused:
        retry_request(_task(state=state), "k", NOW, terminal_confirmed=True)
    assert refused.value.code == "task_not_settled"


@pytest.mark.parametrize("state", ["success", "failed", "expired", "cancelled", "indeterminate"])
def test_every_settled_state_may_be_retried(state: str) -> None:
    assert retry_request(_task(state=state), "k", NOW, terminal_confirmed=False).idempotency_key == "k"


def test_a_terminal_mutation_needs_the_operator_to_confirm() -> None:
    terminal = _task(op_class="mutate_terminal")
    with pytest.raises(FailedPrecondition) as refused:
        retry_request(terminal, "k", NOW, terminal_confirmed=False)
    assert refused.value.code == "terminal_retry_unconfirmed"
    assert retry_request(terminal, "k", NOW, terminal_confirmed=True).op_class == "mutate_terminal"
    # A reconcilable mutation can be asked whether it landed: no confirmation beyond the usual one.
    assert retry_request(_task(op_class="mutate_reconcilable"), "k", NOW, terminal_confirmed=False)
