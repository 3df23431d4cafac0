"""The collector's signed config and tunnel offers: accept only what the dispatch keys signed.

``<state>/config.json`` holds the last good config document exactly as
received (common/trust/signed_doc.py). A new one is accepted only if it verifies with
a pinned dispatch key, is for this collector, has not expired, and has a higher
version than the one held; anything else is refused with a stable code and
the collector keeps running on what it has. Before the first document
arrives, the policy from enrollment (``policy.json``) applies (version 0).

At start the held document's signature is checked again (the file may have
been edited), but not its expiry: expiry limits how long a document can wait
in transit, not how long an accepted config stays in force.

Tunnel offers are verified the same way, and each session is carried at most
once per process.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from collector.state import read_json, write_json
from common.trust import signed_doc
from common.trust.keys import PublicKey
from common.trust.signed_doc import DocumentError

VAULT_MODES = ("local", "relayed", "external")
# Session ids of offers already carried are remembered this long (longer than an offer lives).
SEEN_OFFER_TTL_S = 600


class ConfigStore:
    """The config document held in ``path`` and the checks a new one must pass."""

    def __init__(self, path: Path, collector_id: str, trusted: Mapping[str, PublicKey]):
        self.path = path
        self.collector_id = collector_id
        self.trusted = trusted
        self.current: dict[str, Any] | None = None
        if path.exists():
            self.current = self._check(read_json(path), now=None)

    @property
    def version(self) -> int:
        return int(self.current["version"]) if self.current else 0

    def _check(self, document: object, now: int | None) -> dict[str, Any]:
        if now is None:  # already accepted once: signature, type and collector only
            payload = signed_doc.verify_signature(document, self.trusted, int(time.time()))
            if (
                payload.get("type") != signed_doc.COLLECTOR_CONFIG
                or payload.get("collector_id") != self.collector_id
            ):
                raise DocumentError("wrong_collector", "config.json is not this collector's config")
        else:
            payload = signed_doc.verify(
                document,
                self.trusted,
                kind=signed_doc.COLLECTOR_CONFIG,
                collector_id=self.collector_id,
                now=now,
            )
        version, mode, vault = payload.get("version"), payload.get("vault_mode"), payload.get("vault")
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise DocumentError("document_malformed", "version must be a positive integer")
        if mode not in VAULT_MODES or not isinstance(vault, dict):
            raise DocumentError("document_malformed", "vault_mode and vault are required")
        return payload

    def accept(self, document: object, now: int) -> dict[str, Any]:
        """Verify ``document``, keep it if it is newer than the one held, and return its payload."""
        payload = self._check(document, now)
        if payload["version"] <= self.version:
            raise DocumentError(
                "config_version_not_newer",
                f"config version {payload['version']} is not newer than the held {self.version}",
            )
        write_json(self.path, document)
        self.current = payload
        return payload


class OfferCheck:
    """Verifies tunnel offers and refuses a session offered twice."""

    def __init__(self, collector_id: str, trusted: Mapping[str, PublicKey]):
        self.collector_id = collector_id
        self.trusted = trusted
        self._seen: dict[str, float] = {}

    def accept(self, offer: Mapping[str, Any], now: int) -> dict[str, Any]:
        """The verified offer (host, port and session from the signed payload only)."""
        payload = signed_doc.verify(
            offer.get("signed"),
            self.trusted,
            kind=signed_doc.TUNNEL_OFFER,
            collector_id=self.collector_id,
            now=now,
        )
        session, host, port = payload.get("session_id"), payload.get("host"), payload.get("port")
        if not (
            isinstance(session, str) and session and isinstance(host, str) and host and isinstance(port, int)
        ):
            raise DocumentError("document_malformed", "an offer needs session_id, host and port")
        for seen, at in list(self._seen.items()):
            if at < now - SEEN_OFFER_TTL_S:
                del self._seen[seen]
        if session in self._seen:
            raise DocumentError("offer_replayed", "this tunnel session was already offered")
        self._seen[session] = now
        return {"type": "tunnel", "session_id": session, "host": host, "port": port}
