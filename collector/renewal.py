"""Certificate renewal: the collector renews its certificate at about two thirds of its life.

The certificate is what the control plane checks for expiry on every request (the bearer token
is signed with the collector's key, and the gateway refuses a collector whose certificate has
lapsed), so a collector that never renews stops on its ninetieth day. Renewal keeps the same key:
a lost answer then costs nothing — the next attempt gets another certificate for the same key,
and the identity is never in a state where the control plane and the collector disagree on it.

The schedule (:func:`renewal_due`, :func:`retry_delay`) is pure; :class:`Renewer` runs it beside
the claim loop. A failed renewal never stops work while the current certificate is valid.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from collector.gateway_errors import GatewayRefused, GatewayUnavailable
from collector.state import StatePaths
from common.config.state_dir import write_public
from common.telemetry.logs import get_logger
from common.trust import pki

log = get_logger("versus.collector.renewal")

# Renew at this fraction of the time between receiving a certificate and its expiry...
RENEW_AT = 2 / 3
# ...give or take this fraction of it, so a fleet enrolled together does not renew together.
JITTER = 0.05
MIN_RETRY_S = 1.0
MAX_RETRY_S = 3600.0
# After a Collector CA rotation a certificate of the old CA is renewed within this much time (at most
# JITTER of its life), spread so a fleet does not renew at once.
REISSUE_SPREAD_S = 300.0
# Refusals after which renewing again cannot help: the identity is gone (the claim loop stops too).
FINAL_CODES = frozenset({"collector_revoked", "certificate_expired", "collector_not_active"})


def renewal_due(received_at: float, not_after: float, rng: random.Random) -> float:
    """When to renew a certificate received at ``received_at`` (Unix time) that expires at ``not_after``."""
    life = max(0.0, not_after - received_at)
    return received_at + life * RENEW_AT + (rng.random() * 2 - 1) * JITTER * life


def retry_delay(attempt: int, not_after: float, now: float) -> float:
    """How long to wait before retry number ``attempt`` (0-based) of a failed renewal.

    Exponential from 1 s up to an hour, but never more than a tenth of the time the certificate
    has left, so several attempts fit before it lapses.
    """
    backoff = min(MAX_RETRY_S, MIN_RETRY_S * 2.0**attempt)
    remaining = not_after - now
    if remaining <= 0:
        return backoff
    return max(MIN_RETRY_S, min(backoff, remaining / 10))


def reissue_due(now: float, received_at: float, not_after: float, rng: random.Random) -> float:
    """When to renew a certificate whose issuer is no longer the Collector CA that issues."""
    return now + rng.random() * min(REISSUE_SPREAD_S, JITTER * max(0.0, not_after - received_at))


def leaf_not_after(chain_pem: bytes) -> float:
    """Expiry (Unix time) of the first certificate of a PEM chain."""
    leaf = x509.load_pem_x509_certificates(chain_pem)[0]
    return leaf.not_valid_after_utc.timestamp()


def csr_pem(key: ec.EllipticCurvePrivateKey, collector_id: str) -> str:
    """A CSR for the collector's own id and key (the control plane requires both to match)."""
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, collector_id)]))
        .sign(key, hashes.SHA256())
    )
    return csr.public_bytes(serialization.Encoding.PEM).decode()


class Renewer:
    """Renews the certificate in ``paths`` through ``renew`` (the gateway's ``/renew``) until stopped."""

    def __init__(
        self,
        paths: StatePaths,
        key: ec.EllipticCurvePrivateKey,
        collector_id: str,
        renew: Callable[[str], Awaitable[dict[str, Any]]],
        *,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.time,
        wanted_issuer: Callable[[], str] = lambda: "",
    ):
        self.paths = paths
        self.key = key
        self.collector_id = collector_id
        self.renew = renew
        self.rng = rng or random.Random()  # noqa: S311 - spreading load, not a secret
        self.clock = clock
        # The Collector CA that issues now ("" unknown): a certificate of another is renewed soon.
        self.wanted_issuer = wanted_issuer
        self._nudged = asyncio.Event()
        self.renewals = 0

    def nudge(self) -> None:
        """Look at the schedule again (the trust bundle changed)."""
        self._nudged.set()

    def _due(self, received_at: float, not_after: float) -> float:
        due = renewal_due(received_at, not_after, self.rng)
        wanted = self.wanted_issuer()
        issuer = pki.issuer_id(x509.load_pem_x509_certificates(self.paths.cert.read_bytes())[0])
        if wanted and issuer != wanted:
            due = min(due, reissue_due(self.clock(), received_at, not_after, self.rng))
        return due

    def current(self) -> tuple[float, float]:
        """(received_at, not_after) of the certificate on disk; it is replaced atomically on renewal,
        so its modification time is when it was received."""
        return self.paths.cert.stat().st_mtime, leaf_not_after(self.paths.cert.read_bytes())

    async def run(self, stopping: asyncio.Event) -> None:
        attempt = 0
        received_at, not_after = self.current()
        next_at = self._due(received_at, not_after)
        log.info("certificate renewal scheduled", not_after=_iso(not_after), renew_at=_iso(next_at))
        while not stopping.is_set():
            await self._wait(stopping, next_at)
            if stopping.is_set():
                return
            if self._nudged.is_set():
                self._nudged.clear()
                if attempt == 0:
                    next_at = min(next_at, self._due(received_at, not_after))
                if next_at > self.clock():
                    continue
            try:
                self._store(await self.renew(csr_pem(self.key, self.collector_id)))
            except GatewayRefused as exc:
                if exc.code in FINAL_CODES:
                    log.error("certificate renewal refused for good", code=exc.code)
                    return
                next_at = self._retry(attempt, not_after, exc.code)
                attempt += 1
                continue
            except GatewayUnavailable as exc:
                next_at = self._retry(attempt, not_after, str(exc))
                attempt += 1
                continue
            attempt = 0
            self.renewals += 1
            received_at, not_after = self.current()
            next_at = self._due(received_at, not_after)
            log.info("certificate renewed", not_after=_iso(not_after), renew_at=_iso(next_at))

    async def _wait(self, stopping: asyncio.Event, until: float) -> None:
        """Until ``until``, a stop or a nudge."""
        waits = [asyncio.ensure_future(stopping.wait()), asyncio.ensure_future(self._nudged.wait())]
        try:
            await asyncio.wait(
                waits, timeout=max(0.0, until - self.clock()), return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            for waiting in waits:
                waiting.cancel()

    def _retry(self, attempt: int, not_after: float, why: str) -> float:
        delay = retry_delay(attempt, not_after, self.clock())
        # Work goes on meanwhile: the current certificate is valid until not_after.
        log.warning("certificate renewal failed; retrying", reason=why, retry_in_s=round(delay, 1),
                    not_after=_iso(not_after))  # fmt: skip
        return self.clock() + delay

    def _store(self, reply: dict[str, Any]) -> None:
        chain = str(reply["cert_chain_pem"]).encode()
        leaf = x509.load_pem_x509_certificates(chain)[0]
        ours = self.key.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        theirs = leaf.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        if ours != theirs:
            raise GatewayUnavailable("renewal answered with a certificate for another key")
        # Only the certificate for our own key is kept. The CA bundle in the answer is not: it decides
        # whom the collector trusts, and anything on the path (a TLS-inspecting proxy) could have
        # written it. The bundle pinned at enrollment stays until CA rotation delivers a signed one.
        write_public(self.paths.cert, chain)


def _iso(epoch: float) -> str:
    return dt.datetime.fromtimestamp(epoch, dt.UTC).isoformat(timespec="seconds")
