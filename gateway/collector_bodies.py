"""The bodies of the collector control channel's messages (the same over HTTPS and the WSS socket).

Unknown members are ignored (pydantic's default), so a collector may add optional
fields without breaking an older gateway (docs/protocol.md, compatibility rules).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    Field,
    StrictBool,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    model_validator,
)

from common import protocol
from common.limits import MAX_CLAIM_BATCH
from common.protocol import Offer
from common.telemetry import span_record
from gateway.body_fields import FreeText, Int64, Name
from gateway.metrics import TRACES_DROPPED

# Limits (docs/gateway.md).
MAX_HELD_TASK_IDS = 1000
MAX_RESULT_BYTES = 1024 * 1024
MAX_ERROR_MESSAGE = 4096
MAX_CONCURRENCY = 1024  # per provider; a claim's free slots cannot exceed it either

_ID = Field(min_length=1, max_length=128)


class ProtocolOffer(BaseModel):
    """The protocol versions a collector speaks (docs/protocol.md); the answer names the settled one."""

    min: int = Field(ge=1, le=1_000_000)
    max: int = Field(ge=1, le=1_000_000)

    @model_validator(mode="after")
    def _ordered(self) -> ProtocolOffer:
        if self.min > self.max:
            raise ValueError("min must not exceed max")
        return self


class RevokedBody(BaseModel):
    """What the collector scrubbed for a credential revocation (protocol 5)."""

    revocation_id: Name = _ID
    results: dict[
        Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:-]+$")],
        Annotated[str, Field(max_length=200)],
    ] = Field(
        max_length=MAX_HELD_TASK_IDS,
        description='per dispatch id: "scrubbed", "not_held", "killed" or "failed: <why>"',
    )

    @staticmethod
    def check_version(version: int) -> None:
        """``revoked`` exists from protocol 5."""
        floor = protocol.floor_of("credential_revoke")
        if version < floor:
            raise protocol.VersionUnsupported(
                f"revoked is a protocol {floor} message; this one is written in {version}"
            )


class ByeBody(BaseModel):
    """A clean shutdown (protocol 2): the session ends; the collector is offline, not lost."""

    session_id: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]*$")
    reason: FreeText = Field(default="shutdown", max_length=200)


# Year 2100: any later "when" is a broken clock, refused rather than stored.
MAX_REPORT_TIME_S = 4_102_444_800


class UpdateStatusBody(BaseModel):
    """What the collector's supervisor last recorded about an upgrade (docs/upgrades.md)."""

    state: Literal["updating", "updated", "rolled_back", "failed"]
    version: Name = Field(max_length=64)
    detail: FreeText = Field(default="", max_length=500)
    at: int = Field(
        default=0, ge=0, le=MAX_REPORT_TIME_S, description="when, Unix seconds on the collector's clock"
    )


class ClaimBody(BaseModel):
    claim_seq: Int64 = Field(default=0, description="1, 2, 3, ... for sequential claims; 0 = unnumbered")
    held_task_ids: list[Name] = Field(default_factory=list, max_length=MAX_HELD_TASK_IDS)
    capacity: dict[Name, Annotated[int, Field(ge=0, le=MAX_CONCURRENCY)]] = Field(
        default_factory=dict, max_length=64, description="free slots per provider"
    )
    draining: bool = False
    agent_version: Name = Field(default="", max_length=64)
    wait_s: float | None = Field(default=None, ge=0, description="ask for a shorter hold than the server's")
    session_id: str = Field(
        default="",
        max_length=64,
        pattern=r"^[A-Za-z0-9_-]*$",
        description="random id chosen at process start; a newer session supersedes an older one",
    )
    vault_mode: Literal["", "local", "relayed", "external"] = Field(
        default="", description="vault mode the running process applies"
    )
    config_version: Int64 = Field(
        default=0, ge=0, description="version of the signed config the collector runs (0: none yet)"
    )
    key_versions: dict[Literal["dispatch", "release", "trust"], Annotated[int, Field(ge=0, le=2**63 - 1)]] = (
        Field(
            default_factory=dict,
            description="versions of the key sets and of the trust bundle the collector holds; when the "
            "control plane has newer ones the answer carries the rotation steps (key_sets) or the signed "
            "bundle (trust) and no task",
        )
    )
    max_tasks: int = Field(
        default=1,
        ge=1,
        le=MAX_CLAIM_BATCH,
        description="most tasks one answer may carry; tasks after the first are in `more`",
    )
    update_status: UpdateStatusBody | None = Field(
        default=None, description="the supervisor's last upgrade report, until it is superseded"
    )
    protocol: ProtocolOffer | None = Field(
        default=None,
        description="the protocol versions the collector speaks; absent: version 1 only. The answer's "
        "`protocol` (or the X-Versus-Protocol header of a 204) is the settled version (docs/protocol.md)",
    )

    resume: bool = Field(
        default=False,
        description="protocol 3: answer with a verdict (continue, cancel or terminate) on every task in "
        "held_task_ids; a collector sets it on its first claim after a start or a failed claim",
    )

    def offer(self) -> Offer:
        """The range the collector offers (no ``protocol`` member: a collector from before
        negotiation, which speaks version 1 only)."""
        return Offer(self.protocol.min, self.protocol.max) if self.protocol else Offer(1, 1)


class OutputDigestBody(BaseModel):
    """The streamed output a final report vouches for (protocol 4)."""

    length: int = Field(ge=0, le=2**62)
    sha256: str = Field(pattern=r"^[0-9a-fA-F]{64}$")


_HEX16 = r"^[0-9a-f]{16}$"
_NS = Field(ge=0, le=MAX_REPORT_TIME_S * 1_000_000_000)
AttributeKey = Annotated[
    str, Field(min_length=1, max_length=span_record.MAX_ATTRIBUTE_KEY, pattern=r"^[a-z_.]+$")
]
AttributeValue = StrictBool | Int64 | Annotated[str, Field(max_length=span_record.MAX_ATTRIBUTE_TEXT)]


class SpanBody(BaseModel):
    """One span a collector recorded for a task (common/telemetry/span_record.py)."""

    name: str = Field(pattern=span_record.SPAN_NAME_PATTERN)
    span_id: str = Field(pattern=_HEX16)
    parent_id: str = Field(pattern=_HEX16)
    start_ns: int = _NS
    end_ns: int = _NS
    status: Literal["ok", "error"] = "ok"
    attributes: dict[AttributeKey, AttributeValue] = Field(
        default_factory=dict, max_length=span_record.MAX_ATTRIBUTES
    )


class TraceBody(BaseModel):
    """A report's ``trace`` member: the collector's task span and its children."""

    traceparent: str = Field(pattern=r"^00-[0-9a-f]{32}-[0-9a-f]{16}-0[01]$")
    spans: list[SpanBody] = Field(default_factory=list, max_length=span_record.MAX_SPANS)


def _dropped_if_invalid(value: Any, handler: ValidatorFunctionWrapHandler) -> TraceBody | None:
    """A trace member that does not fit its limits is dropped (and counted), never the report."""
    try:
        trace: TraceBody | None = handler(value)
    except ValidationError:
        TRACES_DROPPED.inc()
        return None
    return trace


class ReportBody(BaseModel):
    task_id: Name = _ID
    outcome: Literal["running", "success", "failed", "unknown", "refused", "cancelled"] = Field(
        description="cancelled (protocol 3): stopped on a cancel before anything changed"
    )
    result_b64: str = Field(default="", max_length=(MAX_RESULT_BYTES + 2) // 3 * 4)
    error_code: Name = Field(default="", max_length=128)
    error_message: FreeText = Field(default="", max_length=MAX_ERROR_MESSAGE)
    signature: str = Field(
        default="",
        max_length=2048,
        pattern=r"^[A-Za-z0-9_.-]*$",
        description="the collector's ES256 signature over what this report says (docs/threat-model.md); "
        "required: a report without one is refused with report_unsigned",
    )
    output: OutputDigestBody | None = Field(
        default=None,
        description="protocol 4: the length and SHA-256 of the output streamed for this task (POST output); "
        "checked against what the control plane stored",
    )
    trace: Annotated[TraceBody | None, WrapValidator(_dropped_if_invalid)] = Field(
        default=None,
        description="any protocol: the collector's spans for this task when it was handed out with a sampled "
        "traceparent (docs/protocol.md, trace context). Telemetry only: a trace that "
        "does not fit is dropped, never the report",
    )

    def check_version(self, version: int) -> None:
        """Refuse what a message written in ``version`` cannot say (protocol 3 added ``cancelled``)."""
        floor = protocol.floor_of("cancel")
        if self.outcome == "cancelled" and version < floor:
            raise protocol.VersionUnsupported(
                f"the outcome cancelled is written in protocol {floor} or later, not {version}"
            )
        floor = protocol.floor_of("output_stream")
        if self.output is not None and version < floor:
            raise protocol.VersionUnsupported(
                f"a report's output is written in protocol {floor} or later, not {version}"
            )


class ReportOut(BaseModel):
    duplicate: bool
    state: str


class OperationIn(BaseModel):
    name: Name = _ID
    op_class: Literal["read", "mutate_reconcilable", "mutate_terminal"]
    timeout_s: int = Field(default=60, ge=1, le=86_400)
    parallel_safe: bool = False
    reconcile_operation: Name = Field(default="", max_length=128)


class ProviderIn(BaseModel):
    provider: Name = _ID
    max_concurrency: int = Field(ge=1, le=MAX_CONCURRENCY)
    operations: list[OperationIn] = Field(max_length=256)


class CapabilitiesBody(BaseModel):
    capability_epoch: Int64
    fips: bool = False
    agent_version: Name = Field(default="", max_length=64)
    providers: list[ProviderIn] = Field(max_length=64)


class CapabilitiesOut(BaseModel):
    capability_epoch: int
    accepted: bool
