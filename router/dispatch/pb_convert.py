"""Conversions between the router's rows and the TaskRouterService messages, shared by its RPCs:
tasks, dispatches, states and the keyset page tokens of the listings."""

from __future__ import annotations

import base64
import binascii
import datetime as dt
from collections.abc import Sequence
from typing import Any

from versus.router.v1 import task_pb2

from common.errors import InvalidArgument
from common.grpc.pb_time import timestamp as ts
from router.core.sql import Row
from router.core.states import State

MAX_PAGE_SIZE = 500
DEFAULT_PAGE_SIZE = 50

OP_CLASS_FROM_PB = {
    task_pb2.OP_CLASS_READ: "read",
    task_pb2.OP_CLASS_MUTATE_RECONCILABLE: "mutate_reconcilable",
    task_pb2.OP_CLASS_MUTATE_TERMINAL: "mutate_terminal",
}
OP_CLASS_TO_PB = {v: k for k, v in OP_CLASS_FROM_PB.items()}
STATE_TO_PB = {State(name.removeprefix("TASK_STATE_").lower()): value
               for name, value in task_pb2.TaskState.items() if value}  # fmt: skip
STATE_FROM_PB = {v: k for k, v in STATE_TO_PB.items()}


def task_pb(task: Row, history: Sequence[Row] = ()) -> task_pb2.Task:
    return task_pb2.Task(
        task_id=task["task_id"],
        provider=task["provider"],
        operation=task["operation"],
        op_class=OP_CLASS_TO_PB[task["op_class"]],
        target_ref=task["target_ref"],
        site_id=task["site_id"],
        tenant_id=task["tenant_id"],
        idempotency_key=task["idempotency_key"],
        deadline=ts(task["deadline"]),
        requires_fips=task["requires_fips"],
        labels=dict(task["labels"]),
        state=STATE_TO_PB[State(task["state"])],
        attempts=task["attempts"],
        error_code=task["error_code"] or "",
        history=[
            task_pb2.Transition(
                from_state=STATE_TO_PB[State(h["from_state"])],
                to_state=STATE_TO_PB[State(h["to_state"])],
                at=ts(h["at"]),
                reason=h["reason"],
                dispatch_id=h["dispatch_id"] or "",
            )
            for h in history
        ],
        result=bytes(task["result"] or b""),
        evidence=task["evidence"],
        condition=task["condition"] or "",
        created_at=ts(task["created_at"]),
        updated_at=ts(task["updated_at"]),
        features=list(task["features"]),
        cancel_requested_at=ts(task["cancel_requested_at"]) if task["cancel_requested_at"] else None,
        output_length=int(task.get("output_length") or 0),
        output_sha256=task.get("output_sha256") or "",
        collector_id=task.get("collector_id") or "",
    )


def dispatch_pb(d: Row) -> task_pb2.Dispatch:
    out = task_pb2.Dispatch(
        dispatch_id=d["dispatch_id"],
        task_id=d["task_id"],
        collector_id=d["collector_id"],
        site_id=d["site_id"],
        target_ref=d["target_ref"],
        provider=d["provider"],
        operation=d["operation"],
        op_class=OP_CLASS_TO_PB[d["op_class"]],
        state=STATE_TO_PB[State(d["state"])],
        attempt=d["attempt"],
        lease_epoch=d["lease_epoch"],
        created_at=ts(d["created_at"]),
        updated_at=ts(d["updated_at"]),
        expires_at=ts(d["expires_at"]),
        kind=d["kind"],
        error_code=d["error_code"] or "",
        error_message=d["error_message"] or "",
    )
    if d.get("task_state"):
        out.task_state = STATE_TO_PB[State(d["task_state"])]
    for name in ("handed_at", "reported_at"):
        stamp = ts(d[name])
        if stamp is not None:
            getattr(out, name).CopyFrom(stamp)
    return out


def encode_page_token(created_at: dt.datetime, row_id: str) -> str:
    """The next page's token: the keyset position of the last row of this one."""
    return base64.urlsafe_b64encode(f"{created_at.isoformat()}|{row_id}".encode()).decode()


def decode_page_token(token: str) -> tuple[dt.datetime, str] | None:
    """The keyset position a page token names (None for the first page); anything else is refused."""
    if not token:
        return None
    try:
        created, _, row_id = base64.urlsafe_b64decode(token.encode()).decode().partition("|")
        when = dt.datetime.fromisoformat(created)
        if not row_id or when.tzinfo is None:
            raise ValueError("incomplete")
        return when, row_id
    except (ValueError, UnicodeError, binascii.Error):
        raise InvalidArgument(
            "page_token is not one this service issued", code="page_token_invalid"
        ) from None


def states_from_pb(values: Sequence[Any]) -> list[str]:
    """A filter's states as the rows spell them; an unknown value is refused."""
    out = []
    for value in values:
        if value not in STATE_FROM_PB:
            raise InvalidArgument("unknown state in the filter", code="state_invalid")
        out.append(STATE_FROM_PB[value].value)
    return out
