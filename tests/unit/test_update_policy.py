"""Which version a collector is sent to, and the badge it shows (router/releases/update_policy.py)."""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest

from common.errors import InvalidArgument
from router.releases.update_policy import (
    Badge,
    CollectorFacts,
    ReleaseFacts,
    badge,
    latest,
    outdated,
    parse_version,
    target,
)

NOW = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)
SOAK = dt.timedelta(hours=1)
OLD = NOW - dt.timedelta(days=2)
RELEASES = [
    ReleaseFacts("1.0.0", "stable", False, OLD),
    ReleaseFacts("1.1.0", "stable", False, OLD),
    ReleaseFacts("1.2.0b1", "beta", False, OLD),
    ReleaseFacts("1.10.0", "stable", False, NOW - dt.timedelta(minutes=5)),  # still soaking
]


def facts(policy: str, running: str = "1.0.0", **kw: object) -> CollectorFacts:
    base = CollectorFacts(policy=policy, channel="stable", pinned_version=None, approved_version=None,
                          running_version=running)  # fmt: skip
    return dataclasses.replace(base, **kw)  # type: ignore[arg-type]


def test_manual_goes_only_where_an_administrator_approved() -> None:
    assert target(facts("manual"), RELEASES, NOW, SOAK) is None
    assert target(facts("manual", approved_version="1.1.0"), RELEASES, NOW, SOAK) == "1.1.0"
    # An approval of a downgrade is honoured; one of a version not published (or yanked) is not.
    assert target(facts("manual", "1.1.0", approved_version="1.0.0"), RELEASES, NOW, SOAK) == "1.0.0"
    assert target(facts("manual", approved_version="9.9.9"), RELEASES, NOW, SOAK) is None
    # Once it runs the approved version there is nothing left to do.
    assert target(facts("manual", "1.1.0", approved_version="1.1.0"), RELEASES, NOW, SOAK) is None


def test_auto_takes_the_newest_soaked_release_on_its_channel_and_only_moves_forward() -> None:
    assert target(facts("auto"), RELEASES, NOW, SOAK) == "1.1.0"  # 1.10.0 still soaks; 1.2.0b1 is beta
    assert target(facts("auto"), RELEASES, NOW + SOAK, SOAK) == "1.10.0"  # PEP 440 order, not text
    assert target(facts("auto", channel="beta"), RELEASES, NOW, SOAK) == "1.2.0b1"
    assert target(facts("auto", "1.2.0b1"), RELEASES, NOW, SOAK) is None  # never back to 1.1.0
    assert target(facts("auto", "1.1.0"), RELEASES, NOW, SOAK) is None


def test_a_security_fix_skips_the_soak() -> None:
    releases = [*RELEASES, ReleaseFacts("1.10.1", "stable", True, NOW)]
    assert target(facts("auto"), releases, NOW, SOAK) == "1.10.1"


def test_pinned_holds_the_named_version_in_either_direction() -> None:
    assert target(facts("pinned", pinned_version="1.0.0"), RELEASES, NOW, SOAK) is None
    assert target(facts("pinned", "1.1.0", pinned_version="1.0.0"), RELEASES, NOW, SOAK) == "1.0.0"
    assert target(facts("pinned", pinned_version="1.1.0"), RELEASES, NOW, SOAK) == "1.1.0"
    assert target(facts("pinned", pinned_version="2.0.0"), RELEASES, NOW, SOAK) is None  # not published


def test_a_version_that_failed_is_not_targeted_again_until_something_changes() -> None:
    failed = {"state": "rolled_back", "state_version": "1.1.0"}
    assert target(facts("auto", **failed), RELEASES, NOW, SOAK) is None
    assert target(facts("auto", **failed), RELEASES, NOW + SOAK, SOAK) == "1.10.0"  # a newer release
    assert target(facts("pinned", pinned_version="1.1.0", **failed), RELEASES, NOW, SOAK) is None
    # An approval after the failure is an explicit retry (Updates.apply clears the report).
    assert target(facts("manual", approved_version="1.1.0", **failed), RELEASES, NOW, SOAK) == "1.1.0"


def test_a_broken_download_keeps_the_target_and_shows_failed() -> None:
    """The way to the release broke, not the release: every policy keeps targeting it (the
    supervisor retries with backoff) while the card says it failed; any other code stops it."""
    broken = {"state": "failed", "state_version": "1.1.0", "state_detail": "update_download_failed: cut"}
    refused = {**broken, "state_detail": "release_does_not_start: `--version` exited 1"}
    assert target(facts("auto", **broken), RELEASES, NOW, SOAK) == "1.1.0"
    assert target(facts("pinned", pinned_version="1.1.0", **broken), RELEASES, NOW, SOAK) == "1.1.0"
    assert target(facts("auto", **refused), RELEASES, NOW, SOAK) is None
    assert target(facts("pinned", pinned_version="1.1.0", **refused), RELEASES, NOW, SOAK) is None
    for code in ("update_timeout", "update_bootstrap_timeout", "update_interrupted"):
        retryable = {**broken, "state_detail": f"{code}: words"}
        assert target(facts("auto", **retryable), RELEASES, NOW, SOAK) == "1.1.0", code
    assert badge(facts("auto", **broken), "1.1.0", "1.1.0") is Badge.FAILED


def test_badges() -> None:
    assert badge(facts("manual", ""), "1.1.0", None) is Badge.UNKNOWN
    assert badge(facts("manual", "1.1.0"), "1.1.0", None) is Badge.UP_TO_DATE
    assert badge(facts("manual"), "1.1.0", None) is Badge.UPDATE_AVAILABLE
    assert badge(facts("manual"), "1.1.0", "1.1.0") is Badge.UPDATING
    rolled = facts("manual", state="rolled_back", state_version="1.1.0")
    assert badge(rolled, "1.1.0", None) is Badge.ROLLED_BACK
    failed = facts("manual", state="failed", state_version="1.1.0")
    assert badge(failed, "1.1.0", None) is Badge.FAILED
    # A rollback report about a version it runs now (a later retry worked) no longer shows.
    assert badge(facts("manual", "1.1.0", state="rolled_back", state_version="1.1.0"), "1.1.0", None) is (
        Badge.UP_TO_DATE
    )
    # A newer target after the failure shows the new attempt.
    assert badge(rolled, "1.10.0", "1.10.0") is Badge.UPDATING


def test_outdated_and_latest() -> None:
    assert outdated("1.0.0", "1.1.0") and not outdated("1.1.0", "1.1.0") and not outdated("1.2.0b1", "1.1.0")
    assert not outdated("", "1.1.0") and not outdated("1.0.0", None)
    newest = latest(RELEASES, "stable")
    assert newest is not None and newest.version == "1.10.0"


@pytest.mark.parametrize("text", ["", "latest", "1.0 beta", "x" * 65])
def test_versions_are_pep_440(text: str) -> None:
    with pytest.raises(InvalidArgument) as refused:
        parse_version(text)
    assert refused.value.code == "version_invalid"
