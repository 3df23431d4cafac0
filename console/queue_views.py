"""The dispatch queue as the console shows it: dispatches, a task's history and evidence, and
the conversion from the task router's messages (the edge: pages never see protobuf)."""

from __future__ import annotations

from dataclasses import dataclass

from versus.router.v1 import task_pb2
from versus.router.v1 import task_router_pb2 as pb

from console.views import timestamp

# The queue's outcome filter (seed 001) -> (dispatch states, task states), as `versus-cp queue list`.
OUTCOMES: dict[str, tuple[list[task_pb2.TaskState.ValueType], list[task_pb2.TaskState.ValueType]]] = {
    "all": ([], []),
    "indeterminate": ([], [task_pb2.TASK_STATE_INDETERMINATE]),
    "reconciling": ([], [task_pb2.TASK_STATE_RECONCILING]),
    "unknown": ([task_pb2.TASK_STATE_UNKNOWN], []),
    "success": ([task_pb2.TASK_STATE_SUCCESS], []),
    "failed": ([task_pb2.TASK_STATE_FAILED], []),
}
OP_CLASS = {
    task_pb2.OP_CLASS_READ: "read",
    task_pb2.OP_CLASS_MUTATE_RECONCILABLE: "mutate_reconcilable",
    task_pb2.OP_CLASS_MUTATE_TERMINAL: "mutate_terminal",
}
RESOLUTIONS = {"success": pb.RESOLUTION_SUCCESS, "failed": pb.RESOLUTION_FAILED}


def state_name(value: task_pb2.TaskState.ValueType) -> str:
    return str(task_pb2.TaskState.Name(value)).removeprefix("TASK_STATE_").lower()


@dataclass(frozen=True)
class DispatchView:
    dispatch_id: str
    task_id: str
    collector_id: str
    site_id: str
    target_ref: str
    provider: str
    operation: str
    op_class: str
    state: str
    task_state: str
    attempt: int
    kind: str
    created_at: str
    reported_at: str
    error_code: str
    error_message: str


@dataclass(frozen=True)
class Step:
    at: str
    from_state: str
    to_state: str
    reason: str
    dispatch_id: str


@dataclass(frozen=True)
class TaskView:
    task_id: str
    tenant_id: str
    state: str
    attempts: int
    condition: str
    evidence: str
    error_code: str
    deadline: str
    history: list[Step]

    @property
    def indeterminate(self) -> bool:
        return self.state == "indeterminate"


@dataclass(frozen=True)
class DispatchPage:
    dispatches: list[DispatchView]
    next_page_token: str


def dispatch_view(d: task_pb2.Dispatch) -> DispatchView:
    return DispatchView(
        dispatch_id=d.dispatch_id, task_id=d.task_id, collector_id=d.collector_id, site_id=d.site_id,
        target_ref=d.target_ref, provider=d.provider, operation=d.operation,
        op_class=OP_CLASS.get(d.op_class, "—"), state=state_name(d.state),
        task_state=state_name(d.task_state), attempt=d.attempt, kind=d.kind,
        created_at=timestamp(d.created_at), reported_at=timestamp(d.reported_at),
        error_code=d.error_code, error_message=d.error_message,
    )  # fmt: skip


def task_view(t: task_pb2.Task) -> TaskView:
    return TaskView(
        task_id=t.task_id, tenant_id=t.tenant_id, state=state_name(t.state), attempts=t.attempts,
        condition=t.condition, evidence=t.evidence, error_code=t.error_code, deadline=timestamp(t.deadline),
        history=[
            Step(timestamp(h.at), state_name(h.from_state), state_name(h.to_state), h.reason, h.dispatch_id)
            for h in t.history
        ],
    )  # fmt: skip
