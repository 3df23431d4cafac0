"""Collector-side verification of a received envelope, in the documented order.

1. kid is in the trusted set (``unknown_kid``) and not past its not_after (``kid_expired``);
2. the signature verifies over the canonical bytes (``bad_signature``);
3. ``collector_id`` is this collector (``wrong_collector`` - an attack, not a routing error);
4. server-corrected now is within [not_before - skew, expires_at + skew]
   (``not_yet_valid`` / ``expired``; never silently corrected);
5. SHA-256 of the params exactly as received equals ``params_sha256`` (``params_hash_mismatch``);
6. ``task_id`` has not been seen (``replayed_task``);
7. if ``idempotency_key`` is journaled, the journaled result is returned instead of executing.

Malformed input is refused before rule 1 (see :mod:`common.envelope.wire`).
The seen-set and journal are interfaces; the verifier only reads them. After
accepting an envelope the collector must record its task_id (and journal the
idempotency key's result) before acting on it.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from common.envelope import wire
from common.envelope.codes import EnvelopeError, Rejection
from common.trust.keys import PublicKey

# Allowed disagreement between the collector's corrected clock and the signer's.
SKEW_ALLOWANCE_S = 30


class SeenTasks(Protocol):
    """Task ids this collector has already accepted."""

    def __contains__(self, task_id: str) -> bool: ...


class Journal(Protocol):
    """Results recorded per idempotency key."""

    def lookup(self, idempotency_key: str) -> Mapping[str, Any] | None: ...


@dataclass(frozen=True, slots=True)
class ServerClock:
    """Corrects local time by the offset observed against the server's time."""

    offset_s: float = 0.0

    @classmethod
    def observe(cls, server_time_s: float, local_time_s: float) -> ServerClock:
        return cls(offset_s=server_time_s - local_time_s)

    def now(self, local_time_s: float) -> int:
        return int(local_time_s + self.offset_s)

    def now_s(self, local_time_s: float) -> float:
        return local_time_s + self.offset_s


@dataclass(frozen=True, slots=True)
class VerifyContext:
    """What the collector knows when a task arrives."""

    collector_id: str
    now: int
    trusted_keys: Mapping[str, PublicKey]
    seen: SeenTasks
    journal: Journal
    skew_s: int = SKEW_ALLOWANCE_S


@dataclass(frozen=True, slots=True)
class Accepted:
    """A verified envelope; ``journaled`` is set when the result must be replayed, not re-executed."""

    envelope: wire.WireEnvelope
    journaled: Mapping[str, Any] | None = None


def verify(raw: bytes | str, ctx: VerifyContext) -> Accepted:
    """Decode and check an envelope; raises :class:`EnvelopeError` with the first failing rule."""
    env = wire.decode(raw)
    f = env.fields
    key = ctx.trusted_keys.get(f.kid)
    if key is None:
        raise EnvelopeError(Rejection.UNKNOWN_KID, f"kid {f.kid!r} is not trusted")
    if key.expired(ctx.now):
        raise EnvelopeError(Rejection.KID_EXPIRED, f"kid {f.kid!r} expired")
    if not key.verify(env.signature, env.canonical):
        raise EnvelopeError(Rejection.BAD_SIGNATURE, "signature does not verify")
    if f.collector_id != ctx.collector_id:
        raise EnvelopeError(Rejection.WRONG_COLLECTOR, f"envelope is addressed to {f.collector_id!r}")
    if ctx.now < f.not_before - ctx.skew_s:
        raise EnvelopeError(Rejection.NOT_YET_VALID, f"valid from {f.not_before}, now {ctx.now}")
    if ctx.now > f.expires_at + ctx.skew_s:
        raise EnvelopeError(Rejection.EXPIRED, f"expired at {f.expires_at}, now {ctx.now}")
    if not hmac.compare_digest(hashlib.sha256(env.params).digest(), f.params_sha256):
        raise EnvelopeError(Rejection.PARAMS_HASH_MISMATCH, "params do not match params_sha256")
    if f.task_id in ctx.seen:
        raise EnvelopeError(Rejection.REPLAYED_TASK, f"task {f.task_id!r} was already received")
    return Accepted(envelope=env, journaled=ctx.journal.lookup(f.idempotency_key))
