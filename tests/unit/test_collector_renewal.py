"""The collector's certificate renewal schedule (collector/renewal.py), fed values."""

from __future__ import annotations

import random

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
