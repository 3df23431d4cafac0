"""Delivering a newer trust bundle (the CAs a collector trusts) in claim answers.

A claim names the bundle version the collector holds (``key_versions["trust"]``;
a collector that does not name one predates in-band bundles and is left alone).
When the CA store holds a newer one, the claim is answered at once with the
bundle as a signed document (router/trust/collector_docs.py) and no work, like a key
set rotation; the collector replaces its CA file only with what verified
(collector/trust.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from sqlalchemy.ext.asyncio import AsyncEngine

from common.telemetry.logs import get_logger
from common.trust.keys import KeySet
from common.trust.trust_bundle import BundleSource
from router.core import store
from router.trust import collector_docs

log = get_logger("versus.router.trust")

TRUST = "trust"


class TrustDelivery:
    def __init__(self, bundles: BundleSource, dispatch_keys: Callable[[], KeySet], engine: AsyncEngine):
        self.bundles = bundles
        self.dispatch_keys = dispatch_keys
        self.engine = engine

    def behind(self, key_versions: Mapping[str, int]) -> bool:
        """True when the collector names a bundle version older than the newest."""
        held = key_versions.get(TRUST)
        return held is not None and int(held) < self.bundles.get().version

    async def document(self, collector_id: str, key_versions: Mapping[str, int]) -> dict[str, str] | None:
        """The newest bundle signed for ``collector_id``, or None when it is not behind (or holds no
        live dispatch key to verify it with)."""
        if not self.behind(key_versions):
            return None
        async with self.engine.connect() as conn:
            held = await store.collector_dispatch_kids(conn, collector_id)
        now = int(time.time())
        payload = collector_docs.trust_payload(collector_id, self.bundles.get(), now)
        signed = collector_docs.sign_for(self.dispatch_keys(), held, payload, now)
        if signed is None:
            log.warning("cannot sign a trust bundle the collector could verify", collector_id=collector_id)
        return signed
