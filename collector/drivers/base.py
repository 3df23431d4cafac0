"""The driver plugin interface.

A driver declares its provider name, per-provider concurrency and its
operations (op_class, timeout, parallel_safe and, for ``mutate_reconcilable``,
the read that answers "did it land?"). The collector publishes exactly this as
its capability manifest and refuses tasks for anything not declared.

Third-party drivers register a class under the ``versus.collector.drivers``
entry-point group; the class is built with a :class:`DriverContext`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, Protocol

from common.envelope.fence import window_open

Status = Literal["success", "failed", "unknown", "cancelled"]


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


class OutputSink(Protocol):
    """A task's output stream: what a driver writes goes to the control plane as it grows, with
    bounded memory whatever its size (collector/output.py)."""

    async def write(self, data: bytes) -> None: ...


class HeldCredential(Mapping[str, Any]):
    """A task's copy of a device credential (:meth:`Task.hold`): readable until the control plane
    revokes it (protocol 5), then wiped and refused (:class:`CredentialRevoked`).

    Wiping drops this copy's references to the secret values; Python cannot overwrite the string
    objects themselves, and a session the driver already authenticated with them stays open
    (revoke with ``kill`` to end it). docs/protocol.md, "Credential revocation", says so too.
    """

    __slots__ = ("_data", "revoked")

    def __init__(self, material: Mapping[str, Any]):
        self._data: dict[str, Any] = dict(material)
        self.revoked = False

    def __getitem__(self, key: str) -> Any:
        if self.revoked:
            raise CredentialRevoked("credential_revoked", "the credential was revoked while the task ran")
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        if self.revoked:
            raise CredentialRevoked("credential_revoked", "the credential was revoked while the task ran")
        return iter(self._data)

    def __len__(self) -> int:
        return 0 if self.revoked else len(self._data)

    def __repr__(self) -> str:  # secret
        return f"HeldCredential({'revoked' if self.revoked else f'{len(self._data)} fields'})"

    def scrub(self) -> None:
        self._data.clear()
        self.revoked = True


class Supplied:
    """The credential supplied to one task from outside the local file (vault modes B and C).

    ``external`` says the task's credentials come from there, so the local file is never
    consulted; ``value`` is None when nothing is stored for the device; ``error`` is the stable
    code (and ``message`` the reason) when it could not be had, e.g. ``vault_unavailable``.
    """

    __slots__ = ("error", "external", "message", "value")

    def __init__(self) -> None:
        self.external = False
        self.value: HeldCredential | None = None
        self.error = ""
        self.message = ""

    def __repr__(self) -> str:  # secret
        return f"Supplied(external={self.external}, value={self.value!r}, error={self.error!r})"

    def set(self, value: Mapping[str, Any] | None) -> None:
        self.external = True
        self.value = None if value is None else HeldCredential(value)

    def fail(self, code: str, message: str) -> None:
        self.external, self.error, self.message = True, code, message

    def scrub(self) -> None:
        if self.value is not None:
            self.value.scrub()


class StopSignal:
    """A request to stop one task (a cancel, protocol 3), and whether its device writes began.

    The collector sets it; a driver sees it through :meth:`Task.check_window` (which refuses to
    start a write once a stop was asked for) and :meth:`Task.pause` (a sleep that ends early).
    A driver that ignores it is stopped by force after the grace period.
    """

    __slots__ = ("event", "forced", "reason", "writes_started")

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.writes_started = False
        self.forced = False
        # Why: "cancel" (a cancel, protocol 3) or "credential_revoked" (a revoke with kill, protocol 5).
        self.reason = "cancel"

    @property
    def requested(self) -> bool:
        return self.event.is_set()


@dataclass(frozen=True, slots=True)
class Task:
    """What a driver is asked to do, taken from a verified envelope.

    ``expires_at`` is the envelope's (server time) and ``clock`` the collector's
    server-corrected clock. A driver calls :meth:`check_window` right before each
    device write: past the window the control plane may already have handed the
    device to another writer (docs/reliability.md, "Fencing"), and once a stop was
    asked for no write may begin. A driver that waits uses :meth:`pause`, so a
    cancel ends the wait at once (docs/drivers.md).
    """

    task_id: str
    operation: str
    target_ref: str
    idempotency_key: str
    params: bytes
    lease_epoch: int
    expires_at: int = 0
    clock: Callable[[], float] | None = field(default=None, compare=False, repr=False)
    stop: StopSignal = field(default_factory=StopSignal, compare=False, repr=False)
    # Where the driver streams the task's output (protocol 4); None when the control plane cannot
    # take a stream from this collector now (below the output_stream floor).
    output: OutputSink | None = field(default=None, compare=False, repr=False)
    # The credentials the driver took for this task (hold), so a revocation can wipe them.
    held: list[HeldCredential] = field(default_factory=list, compare=False, repr=False)
    # The device credential the collector supplies from outside its local file: relayed with the
    # dispatch (vault mode B) or read from the customer's Vault (mode C); or why it could not be.
    supplied: Supplied = field(default_factory=lambda: Supplied(), compare=False, repr=False)

    def window_open(self) -> bool:
        """Whether the envelope's window is still open by the collector's clock (always, without one)."""
        if not self.expires_at or self.clock is None:
            return True
        return window_open(self.clock(), self.expires_at)

    def check_window(self) -> None:
        """Call right before a device write: raise :class:`Stopped` once a stop was asked for,
        :class:`WindowClosed` once the envelope's window has passed; otherwise the write may go
        ahead (and the task counts as having begun changing the device)."""
        if self.stop.requested:
            raise Stopped("cancelled", "stopped on a cancel")
        if not self.window_open():
            raise WindowClosed(
                "window_closed", f"the envelope expired at {self.expires_at}; the device was not touched"
            )
        self.stop.writes_started = True

    def device_credential(
        self, local: Callable[[], Mapping[str, Any]], provider: str
    ) -> Mapping[str, Any] | None:
        """This task's device credential: the one supplied for it (relayed with the dispatch in
        vault mode B, read from the customer's Vault in mode C), else the collector's own for
        ``provider`` and the task's device (mode A); None: none. Raises :class:`DriverError` with
        the stable code when the supplied one could not be had."""
        if self.supplied.error:
            raise DriverError(
                self.supplied.error, self.supplied.message or "the task's credential is unavailable"
            )
        if self.supplied.external:
            return self.supplied.value
        found: Mapping[str, Any] | None = local().get(provider, {}).get(self.target_ref)
        return found

    def hold(self, material: Mapping[str, Any]) -> HeldCredential:
        """Take a credential for this task: the copy a revocation wipes (protocol 5). Drivers read
        their device credentials through it rather than keeping the raw mapping."""
        held = HeldCredential(material)
        self.held.append(held)
        return held

    async def pause(self, seconds: float) -> None:
        """Wait ``seconds``, or raise :class:`Stopped` as soon as a stop is asked for."""
        try:
            async with asyncio.timeout(seconds):
                await self.stop.event.wait()
        except TimeoutError:
            return
        raise Stopped("cancelled", "stopped on a cancel")


@dataclass(frozen=True, slots=True)
class DriverContext:
    """What the collector gives a driver: its state directory and its local (vault mode A) credentials.

    ``credentials()`` is the current content of the credentials file: a driver
    calls it once at the start of each task and keeps that snapshot for the task.
    """

    state_dir: Path
    credentials: Callable[[], Mapping[str, Any]] = field(default=lambda: {})


class Driver(Protocol):
    """A driver. It may also set ``uses_credentials: ClassVar[bool] = False`` when its tasks never
    read a device credential (in vault mode C the collector then reads nothing from the Vault
    for them); the default is that they do."""

    provider: ClassVar[str]
    max_concurrency: ClassVar[int]
    operations: ClassVar[dict[str, Operation]]

    async def execute(self, task: Task) -> Outcome: ...


class DriverError(Exception):
    """A driver could not run a task; ``code`` is reported to the control plane."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


class Stopped(DriverError):
    """The driver stopped on a cancel (:class:`StopSignal`). Whether that changed anything is read
    from ``StopSignal.writes_started``, not from the driver."""


class CredentialRevoked(DriverError):
    """The task read a credential after it was revoked (:class:`HeldCredential`)."""


class WindowClosed(DriverError):
    """The envelope's window passed before the device write: nothing was changed.

    The collector reports this as a refusal (``window_closed``), never as a result
    journaled under the idempotency key: the operation was not attempted.
    """
