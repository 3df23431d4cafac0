"""What the supervisor remembers of failed upgrades, and when it tries a version again
(collector/supervisor/failures.py), fed values directly."""

from __future__ import annotations

from pathlib import Path

from collector.supervisor import failures
from collector.supervisor.failures import Failure, RetryPolicy
from common.protocol import retryable_update_failure, update_failure_code

POLICY = RetryPolicy(download_retry_s=60.0, retry_failed_after_s=3600.0)


def test_a_broken_download_is_retried_sooner_each_failure_doubling_up_to_the_cap() -> None:
    seen: dict[str, Failure] = {}
    waits = []
    for at in range(8):
        seen = failures.recorded(seen, "1.1.0", "update_download_failed", "cut", float(at))
        waits.append(POLICY.wait_s(seen["1.1.0"]))
    assert waits == [60, 120, 240, 480, 960, 1920, 3600, 3600]
    assert seen["1.1.0"].count == 8


def test_any_other_failure_waits_the_full_hour_and_resets_the_count() -> None:
    seen = failures.recorded({}, "1.1.0", "update_download_failed", "cut", 0.0)
    seen = failures.recorded(seen, "1.1.0", "release_does_not_start", "exit 1", 10.0)
    assert seen["1.1.0"].count == 1 and POLICY.wait_s(seen["1.1.0"]) == 3600
    seen = failures.recorded(seen, "1.1.0", "update_download_failed", "cut", 20.0)
    assert seen["1.1.0"].count == 1 and POLICY.wait_s(seen["1.1.0"]) == 60


def test_may_retry_only_after_the_wait_and_never_blocked_by_a_clock_that_went_back() -> None:
    failure = Failure("1.1.0", "update_download_failed", "cut", at=1000.0)
    assert POLICY.may_retry(None, 0.0)
    assert not POLICY.may_retry(failure, 1000.0) and not POLICY.may_retry(failure, 1059.0)
    assert POLICY.may_retry(failure, 1060.0)
    assert POLICY.may_retry(failure, 10.0)  # the clock went back past the failure


def test_the_memory_survives_a_restart_and_stays_small(tmp_path: Path) -> None:
    path = tmp_path / "update-failures.json"
    assert failures.load(path) == {}
    seen: dict[str, Failure] = {}
    for n in range(failures.MAX_REMEMBERED + 4):
        seen = failures.recorded(seen, f"1.{n}.0", "update_timeout", "slow", float(n))
    failures.save(path, seen)
    loaded = failures.load(path)
    assert loaded == seen and len(loaded) == failures.MAX_REMEMBERED
    assert "1.0.0" not in loaded and "1.19.0" in loaded  # the oldest go first
    path.write_text("{not json")
    assert failures.load(path) == {}  # unreadable: nothing remembered, rewritten on the next failure


def test_the_code_is_the_first_word_of_the_detail_and_decides_a_retry() -> None:
    detail = "update_download_failed: /x: RemoteProtocolError: cut"
    assert update_failure_code(detail) == "update_download_failed" and retryable_update_failure(detail)
    assert update_failure_code("no code here") == "no code here"
    assert not retryable_update_failure("release_does_not_start: update_download_failed: quoted")
