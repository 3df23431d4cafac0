"""The driver plugin interface.

A driver declares its provider name, per-provider concurrency and its
operations (op_class, timeout, parallel_safe and, for ``mutate_reconcilable``,
the read that answers "did it land?"). The collector publishes exactly this as
its capability manifest and refuses tasks for anything not declared.

Third-party drivers register a class under the ``versus.collector.drivers``
entry-point group; the class is built with a :class:`DriverContext`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, Protocol

Status = Literal["success", "failed", "unknown"]


@dataclass(frozen=True, slots=True)
class Operation:
    op_class: Literal["read", "mutate_reconcilable", "mutate_terminal"]
    timeout_s: int = 60
    parallel_safe: bool = False
    reconcile_operation: str = ""


@dataclass(frozen=True, slots=True)
class Outcome:
    status: Status
    result: bytes = b""
    error_code: str = ""
    error_message: str = ""


@dataclass(frozen=True, slots=True)
class Task:
    """What a driver is asked to do, taken from a verified envelope."""

    task_id: str
    operation: str
    target_ref: str
    idempotency_key: str
    params: bytes
    lease_epoch: int


@dataclass(frozen=True, slots=True)
class DriverContext:
    """What the collector gives a driver: its state directory and its local (vault mode A) credentials."""

    state_dir: Path
    credentials: dict[str, Any] = field(default_factory=dict)


class Driver(Protocol):
    provider: ClassVar[str]
    max_concurrency: ClassVar[int]
    operations: ClassVar[dict[str, Operation]]

    async def execute(self, task: Task) -> Outcome: ...


class DriverError(Exception):
    """A driver could not run a task; ``code`` is reported to the control plane."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
