"""The per-address allowance of not-yet-authenticated connections (gateway/sources.py), fed values."""

from __future__ import annotations

from gateway import sources


def test_the_allowance_is_the_base_plus_what_the_address_earned_up_to_a_ceiling() -> None:
    assert sources.allowance(256, 0) == 256
    assert sources.allowance(256, 1000) == 1256
    assert sources.allowance(256, -5) == 256
    assert sources.allowance(256, 10**9) == 256 + sources.MAX_EARNED
    assert sources.allowance(0, 1000) >= 2**62  # no cap configured: none earned either


def test_keys_name_their_bucket_and_address_and_read_back() -> None:
    now = 1_800_000_123.0
    bucket = sources.bucket_of(now)
    assert bucket == int(now // sources.BUCKET_S)
    assert sources.bucket_of(now + sources.BUCKET_S) == bucket + 1
    for address in ("203.0.113.7", "2001:db8::1", "::ffff:10.0.0.1"):
        assert sources.source_of(sources.key(bucket, address)) == (bucket, address)
    assert sources.source_of("versus:gateway:sources:notanumber:1.2.3.4") is None
    assert sources.source_of("versus:gateway:sources:123:") is None
    assert sources.source_of("versus:other:123:1.2.3.4") is None
