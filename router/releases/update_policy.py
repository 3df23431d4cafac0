"""Which version a collector should run, and how it stands against the releases (pure code).

A site's update policy decides a collector's *target* (docs/upgrades.md):

- ``manual``: the version an administrator approved for this collector, until cancelled;
- ``auto``: the newest release on the site's channel (a ``beta`` site also takes stable
  releases), only ever forward; a release without the security flag waits ``soak_s`` after it
  was published before auto sites take it, so manual approvals can try it first - a security
  fix goes out at once;
- ``pinned``: the named version, in either direction, until the pin changes.

No target (None) means stay. A version the collector's supervisor failed to install or rolled
back from is not targeted again by ``auto`` or ``pinned`` until a newer release appears or an
administrator approves it explicitly (which clears the failure). Only non-yanked releases built
for the collector's os and arch count.
"""

from __future__ import annotations

import datetime as dt
import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

from common.errors import InvalidArgument
from common.protocol import retryable_update_failure

POLICIES = ("manual", "auto", "pinned")
CHANNELS = ("stable", "beta")
MAX_VERSION_CHARS = 64


class Badge(enum.StrEnum):
    UNKNOWN = ""
    UP_TO_DATE = "up_to_date"
    UPDATE_AVAILABLE = "update_available"
    UPDATING = "updating"
    FAILED = "failed"
    ROLLED_BACK = "rolled_back"


@dataclass(frozen=True, slots=True)
class ReleaseFacts:
    version: str
    channel: str
    security_fix: bool
    published_at: dt.datetime


@dataclass(frozen=True, slots=True)
class CollectorFacts:
    policy: str
    channel: str
    pinned_version: str | None
    approved_version: str | None
    # What the collector runs now ("" when it never said).
    running_version: str
    # The supervisor's last report: state ('', 'updating', 'updated', 'rolled_back', 'failed') and version.
    state: str = ""
    state_version: str | None = None
    # Its detail, which starts with the failure's stable code ("update_download_failed: ...").
    state_detail: str = ""


def parse_version(text: str) -> Version:
    """A PEP 440 version, or InvalidArgument ``version_invalid``."""
    if not text or len(text) > MAX_VERSION_CHARS:
        raise InvalidArgument(f"a version is 1-{MAX_VERSION_CHARS} characters", code="version_invalid")
    try:
        return Version(text)
    except InvalidVersion:
        raise InvalidArgument(
            f"{text!r} is not a version (PEP 440, e.g. 1.4.2)", code="version_invalid"
        ) from None


def _key(text: str) -> Version | None:
    try:
        return Version(text) if text else None
    except InvalidVersion:
        return None


def on_channel(releases: Iterable[ReleaseFacts], channel: str) -> list[ReleaseFacts]:
    """The releases a site on ``channel`` follows: a beta site takes stable releases too."""
    allowed = ("stable", "beta") if channel == "beta" else ("stable",)
    return [r for r in releases if r.channel in allowed and _key(r.version) is not None]


def latest(releases: Iterable[ReleaseFacts], channel: str) -> ReleaseFacts | None:
    candidates = on_channel(releases, channel)
    return max(candidates, key=lambda r: _key(r.version) or Version("0"), default=None)


def _failed(facts: CollectorFacts, version: str) -> bool:
    """The collector reported ``version`` failed, for a reason that retrying the same release would
    not fix; a broken download (RETRYABLE_UPDATE_FAILURES) keeps the target, and the supervisor
    tries again with backoff (docs/upgrades.md)."""
    if facts.state not in ("rolled_back", "failed") or facts.state_version != version:
        return False
    return not retryable_update_failure(facts.state_detail)


def target(
    facts: CollectorFacts,
    releases: Sequence[ReleaseFacts],
    now: dt.datetime,
    soak: dt.timedelta,
) -> str | None:
    """The version the collector should move to now; None: stay where it is."""
    published = {r.version for r in releases}
    if facts.policy == "manual":
        wanted = facts.approved_version
        if not wanted or wanted not in published or wanted == facts.running_version:
            return None
        return wanted
    if facts.policy == "pinned":
        wanted = facts.pinned_version
        if not wanted or wanted not in published or wanted == facts.running_version:
            return None
        return None if _failed(facts, wanted) else wanted
    if facts.policy == "auto":
        ready = [r for r in releases if r.security_fix or r.published_at <= now - soak]
        best = latest(ready, facts.channel)
        if best is None or _failed(facts, best.version):
            return None
        running = _key(facts.running_version)
        if running is not None and Version(best.version) <= running:
            return None  # auto only moves forward
        return best.version
    return None


def badge(facts: CollectorFacts, latest_version: str | None, target_version: str | None) -> Badge:
    """Up to date, update available, updating, failed or rolled back (seed 001's Agent Version card)."""
    if not facts.running_version:
        return Badge.UNKNOWN
    if (
        facts.state in ("rolled_back", "failed")
        and facts.state_version not in (None, facts.running_version)
        and target_version in (None, facts.state_version)
    ):
        return Badge.ROLLED_BACK if facts.state == "rolled_back" else Badge.FAILED
    if target_version and target_version != facts.running_version:
        return Badge.UPDATING
    running, newest = _key(facts.running_version), _key(latest_version or "")
    if newest is not None and (running is None or newest > running):
        return Badge.UPDATE_AVAILABLE
    return Badge.UP_TO_DATE


def outdated(running_version: str, latest_version: str | None) -> bool:
    """Behind the latest release (what `collectors list --outdated` and the banner count)."""
    running, newest = _key(running_version), _key(latest_version or "")
    return newest is not None and running is not None and newest > running
