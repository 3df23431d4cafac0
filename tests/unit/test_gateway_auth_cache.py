"""The gateway keeps a collector's record longer than a claim hold, and a revocation's flag outlives it."""

from __future__ import annotations

from common.config.settings import Settings
from common.redis.revocations import FLAG_TTL_S
from gateway.store import AUTH_CACHE_S


def test_a_kept_record_spans_a_claim_hold_and_the_revocation_flag_outlives_it() -> None:
    # Longer than the longest hold: an idle collector's claims never read PostgreSQL to authenticate.
    assert Settings.model_fields["claim_hold_s"].metadata[1].le < AUTH_CACHE_S
    # A record kept from before a revocation is still used after it only while the flag says so.
    assert FLAG_TTL_S > AUTH_CACHE_S
