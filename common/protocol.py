"""The collector protocol's versions: what each adds, the range a build speaks, and negotiation.

Pure code, shared by the gateway (which settles a version with every collector)
and the reference collector (which offers its range). docs/protocol.md has the
rules; in short:

- **Every collector message carries the version it is written in**: the WSS
  frame's ``v``, the HTTPS request's ``X-Versus-Protocol`` header (absent: 1,
  the version before negotiation existed).
- **A claim offers the collector's range** (``protocol: {"min", "max"}`` in its
  body; absent: exactly version 1) and its answer names the settled version:
  the highest both sides speak. The collector writes every later message in it.
- **Out of range is refused legibly**: ``version_unsupported`` with the range
  this side speaks, never a generic close.
- **Adding an optional field never needs a bump** (both sides ignore members
  they do not know, and the members whose bytes are read in place — a claim
  answer's ``envelope``, a frame's ``body`` — stay last). Removing a field,
  changing its meaning, or adding a message an older peer would ignore to its
  harm does: a bump, and a floor for the feature that needs it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from common.errors import InvalidArgument

# What each version added (docs/protocol.md keeps the long form).
HISTORY: dict[int, str] = {
    1: "HTTPS claim, report and capabilities; the WSS control socket with the same operations",
    2: "version negotiation on every claim; the settled version on every message; bye (a clean shutdown)",
    3: "cancel of running work (claim answers carry cancels, reports may say cancelled); resume verdicts "
    "(a claim marked resume is answered continue, cancel or terminate for every task it holds)",
    4: "output_stream: a task's output streamed in chunks at byte offsets (POST output), acked up to the "
    "contiguous length stored, resumed from the ack; the final report names the output's length and SHA-256",
    5: "credential_revoke: claim answers carry revokes of credentials running tasks hold (scrub, or "
    "scrub and kill); the collector acks what it actually scrubbed (POST revoked)",
    6: "relayed_credentials: claim answers carry, per dispatch, the device credential encrypted to the "
    "collector's key and signed (vault mode B)",
    7: "exact frame bodies: a control-socket request frame carries its body as JSON text in a string "
    "member, and the frame's token binds the SHA-256 of that text's UTF-8 bytes, as an HTTPS call's "
    "binds its body (no JSON canonicalisation on either side)",
}
# The lowest version whose collectors honour each feature. A task that needs a feature is placed only on
# a collector whose settled version reaches its floor; older collectors keep running everything else.
FEATURE_FLOORS: dict[str, int] = {
    "cancel": 3,
    "output_stream": 4,
    "credential_revoke": 5,
    "relayed_credentials": 6,
}
# Upgrade failures after which the same release is worth trying again soon: what broke was the way
# to it (a cut or stalled download, an attempt out of time or interrupted), not the release. A
# supervisor's report names its code first (update_status.detail = "code: words"); the supervisor
# retries these with backoff (collector/supervisor/failures.py) and the control plane keeps
# targeting the release (router/releases/update_policy.py). Any other failure stops both.
RETRYABLE_UPDATE_FAILURES = frozenset(
    {"update_download_failed", "update_timeout", "update_bootstrap_timeout", "update_interrupted"}
)


def update_failure_code(detail: str) -> str:
    """The stable code an upgrade report's detail starts with (``code: words``)."""
    return detail.split(":", 1)[0].strip()


def retryable_update_failure(detail: str) -> bool:
    """Whether the report's failure is one the same release is worth trying again after."""
    return update_failure_code(detail) in RETRYABLE_UPDATE_FAILURES


# From this version a request frame's body is a string holding the body's JSON text, and its token
# binds those bytes; before it, the body is an object hashed in canonical form (collector_jwt.frame_body).
FRAME_BODY_AS_TEXT = 7

# The newest version this build speaks, and the oldest it still accepts.
PROTOCOL_VERSION = max(HISTORY)
MIN_PROTOCOL_VERSION = 1
# The HTTPS header that says which version a request is written in.
HEADER = "X-Versus-Protocol"


class VersionUnsupported(InvalidArgument):
    """The peer's version (or range) does not meet this side's; ``details`` carries our range."""

    default_code = "version_unsupported"

    def __init__(self, message: str):
        super().__init__(message, details={"min": MIN_PROTOCOL_VERSION, "max": PROTOCOL_VERSION})


@dataclass(frozen=True, slots=True)
class Offer:
    """A collector's supported range."""

    min: int
    max: int

    @classmethod
    def parse(cls, raw: Any) -> Offer:
        """The ``protocol`` member of a claim body; absent (None) means a collector from before
        negotiation, which speaks version 1 only."""
        if raw is None:
            return cls(1, 1)
        if not isinstance(raw, dict):
            raise InvalidArgument("protocol must be an object {min, max}", code="invalid_body")
        low, high = raw.get("min"), raw.get("max")
        if not (isinstance(low, int) and isinstance(high, int) and _is_version(low) and _is_version(high)):
            raise InvalidArgument("protocol needs integer min and max, both >= 1", code="invalid_body")
        if low > high:
            raise InvalidArgument("protocol min must not exceed max", code="invalid_body")
        return cls(low, high)


def _is_version(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 1_000_000


def negotiate(offer: Offer) -> int:
    """The version to speak with a collector offering ``offer``: the highest both speak."""
    settled = min(offer.max, PROTOCOL_VERSION)
    if settled < max(offer.min, MIN_PROTOCOL_VERSION):
        raise VersionUnsupported(
            f"this gateway speaks collector protocol {MIN_PROTOCOL_VERSION}-{PROTOCOL_VERSION}; "
            f"the collector offered {offer.min}-{offer.max}"
        )
    return settled


def check_message(version: Any) -> int:
    """The version one message is written in, if this side reads it (else ``version_unsupported``)."""
    if not _is_version(version):
        raise VersionUnsupported(f"a message's protocol version must be an integer, not {version!r}")
    if not MIN_PROTOCOL_VERSION <= version <= PROTOCOL_VERSION:
        raise VersionUnsupported(
            f"protocol version {version} is not spoken here "
            f"(this gateway speaks {MIN_PROTOCOL_VERSION}-{PROTOCOL_VERSION})"
        )
    return int(version)


def floor_of(feature: str) -> int:
    """The lowest version a collector must speak to be given work that needs ``feature``."""
    try:
        return FEATURE_FLOORS[feature]
    except KeyError:
        known = ", ".join(sorted(FEATURE_FLOORS))
        raise InvalidArgument(
            f"unknown collector feature {feature[:64]!r} (known: {known})", code="feature_unknown"
        ) from None


def check_features(features: Iterable[str]) -> tuple[str, ...]:
    """``features`` validated (each one known) and in a canonical order: sorted, without repeats."""
    out = sorted(set(features))
    for f in out:
        floor_of(f)
    return tuple(out)


def features_floor(features: Iterable[str]) -> tuple[int, str]:
    """The highest floor among ``features`` and the feature that sets it ((1, "") for none)."""
    best = (MIN_PROTOCOL_VERSION, "")
    for f in sorted(features):
        floor = floor_of(f)
        if floor > best[0]:
            best = (floor, f)
    return best


def floor_condition(features: Iterable[str]) -> str:
    """The task condition that says why no collector could take it: ``needs protocol ≥ N for <feature>``."""
    floor, feature = features_floor(features)
    return f"needs protocol \u2265 {floor} for {feature}"


def header_version(value: str | None) -> int:
    """The version an HTTPS request is written in, from its header (absent: 1)."""
    if value is None:
        return 1
    try:
        parsed = int(value.strip())
    except ValueError:
        raise VersionUnsupported(f"{HEADER} must be an integer, not {value[:20]!r}") from None
    return check_message(parsed)
