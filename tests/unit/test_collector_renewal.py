"""The collector's certificate renewal schedule (collector/renewal.py), fed values."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from collector.renewal import JITTER, MAX_RETRY_S, MIN_RETRY_S, RENEW_AT, renewal_due, retry_delay

DAY = 86400.0


@pytest.mark.parametrize("seed", range(20))
def test_renewal_is_due_at_two_thirds_of_life_give_or_take_the_jitter(seed: int) -> None:
    received, not_after = 1_000_000.0, 1_000_000.0 + 90 * DAY
    due = renewal_due(received, not_after, random.Random(seed))
    life = not_after - received
    assert received + life * (RENEW_AT - JITTER) <= due <= received + life * (RENEW_AT + JITTER)
    assert due < not_after - 25 * DAY  # weeks of retries left before the certificate lapses


def test_a_fleet_enrolled_together_spreads_its_renewals() -> None:
    dues = {round(renewal_due(0.0, 90 * DAY, random.Random(seed))) for seed in range(100)}
    assert len(dues) == 100


def test_an_already_expired_certificate_is_due_at_once() -> None:
    assert renewal_due(1000.0, 900.0, random.Random(1)) == 1000.0


def test_retries_back_off_to_an_hour_but_never_past_a_tenth_of_what_is_left() -> None:
    now, far = 0.0, 90 * DAY
    delays = [retry_delay(attempt, far, now) for attempt in range(20)]
    assert delays[0] == MIN_RETRY_S and delays[1] == 2 * MIN_RETRY_S
    assert delays == sorted(delays) and max(delays) == MAX_RETRY_S
    # Ten minutes left: at most a minute between attempts, so several fit.
    assert retry_delay(15, 600.0, now) == 60.0
    # Seconds left: never below the floor.
    assert retry_delay(15, 2.0, now) == MIN_RETRY_S
    # Lapsed: the gateway will refuse, but a retry costs little; plain backoff.
    assert retry_delay(3, -5.0, now) == 8 * MIN_RETRY_S


def test_a_renewal_keeps_only_a_certificate_for_our_key_and_never_the_offered_ca_bundle(
    tmp_path: Path,
) -> None:
    from cryptography.hazmat.primitives.asymmetric import ec

    from collector.gateway_errors import GatewayUnavailable
    from collector.renewal import Renewer
    from collector.state import StatePaths

    paths = StatePaths(tmp_path)
    paths.ca_bundle.write_text("pinned at enrollment")
    ours, theirs = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())

    async def unused(csr: str) -> dict[str, object]:
        raise AssertionError

    renewer = Renewer(paths, ours, "col-1", unused)
    with pytest.raises(GatewayUnavailable, match="another key"):
        renewer._store({"cert_chain_pem": _self_signed(theirs)})
    assert not paths.cert.exists()
    mine = _self_signed(ours)
    renewer._store({"cert_chain_pem": mine, "ca_bundle_pem": "a proxy's CA"})
    assert paths.cert.read_text() == mine
    assert paths.ca_bundle.read_text() == "pinned at enrollment"


def _self_signed(key: Any) -> str:
    import datetime as dt

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.x509.oid import NameOID

    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "col-1")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(1).not_valid_before(now).not_valid_after(now + dt.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    return cert.public_bytes(serialization.Encoding.PEM).decode()
