"""The collector's local parts: journal crash windows, backoff, configuration, drivers, key checks."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from collector.agent_state import CollectorError, backoff, check_key_permissions
from collector.config import resolve
from collector.drivers import registry
from collector.drivers.base import DriverContext, Task
from collector.drivers.stub import StubDriver
from collector.gateway_errors import retry_after
from collector.journal import AlreadyReceived, Journal, Result


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[Journal]:
    j = Journal(tmp_path / "journal.sqlite3")
    yield j
    j.close()


def test_receipt_then_result_then_report(journal: Journal) -> None:
    journal.record_receipt("d1", "k1", "stub")
    assert "d1" in journal and journal.held_task_ids() == ["d1"]
    with pytest.raises(AlreadyReceived):
        journal.record_receipt("d1", "k1", "stub")
    assert journal.unfinished() == [("d1", "k1")]
    journal.record_result("d1", "k1", Result("success", b"ok"))
    assert journal.unfinished() == []
    assert [p.task_id for p in journal.pending_reports()] == ["d1"]
    assert journal.lookup("k1") == {"outcome": "success", "result": b"ok".hex(), "error_code": ""}
    journal.mark_reported("d1")
    assert journal.pending_reports() == [] and journal.held_task_ids() == []


def test_unknown_results_are_not_replayed_as_final(journal: Journal) -> None:
    journal.record_receipt("d1", "k1", "stub")
    journal.record_result("d1", "k1", Result("unknown", b"", "timeout"))
    assert journal.lookup("k1") is None  # a retry must run the reconcile-read, not get "unknown" back
    assert [p.result.outcome for p in journal.pending_reports()] == ["unknown"]


def test_journal_survives_reopen_and_claim_numbers_keep_growing(tmp_path: Path) -> None:
    first = Journal(tmp_path / "j.sqlite3")
    first.record_receipt("d1", "k1", "stub")
    seqs = [first.next_claim_seq(), first.next_claim_seq()]
    first.close()
    again = Journal(tmp_path / "j.sqlite3")
    assert again.unfinished() == [("d1", "k1")]
    assert again.next_claim_seq() == seqs[-1] + 1 == 3
    assert (tmp_path / "j.sqlite3").stat().st_mode & 0o777 == 0o600
    again.close()


def test_prune_keeps_unreported_work(journal: Journal) -> None:
    journal.record_receipt("old", "k-old", "stub")
    journal.record_result("old", "k-old", Result("success", b""))
    journal.mark_reported("old")
    journal.record_receipt("held", "k-held", "stub")
    assert journal.prune(now=10**10) == 1
    assert journal.held_task_ids() == ["held"]


def test_backoff_is_full_jitter_under_a_growing_window_and_a_cap() -> None:
    for attempt in range(10):
        window = min(60.0, 2.0**attempt)
        samples = [backoff(attempt, base=1.0, cap=60.0) for _ in range(400)]
        assert all(0.0 <= s <= window for s in samples)
        # Spread over the whole window, not banded around its middle (±25 % before).
        assert min(samples) < 0.2 * window and max(samples) > 0.8 * window
    assert max(backoff(20, cap=60.0) for _ in range(50)) <= 60.0


def test_backoff_waits_at_least_what_the_gateway_asked_spread_over_twice_it() -> None:
    samples = [backoff(0, retry_after_s=5.0) for _ in range(400)]
    assert all(5.0 <= s <= 10.0 for s in samples)
    assert max(samples) - min(samples) > 2.5  # spread, so a shed fleet does not return together
    # A longer backoff of its own wins over a short hint.
    assert all(s <= 60.0 for s in (backoff(10, cap=60.0, retry_after_s=1.0) for _ in range(50)))


@pytest.mark.parametrize(
    ("header", "seconds"),
    [("2", 2.0), (" 30 ", 30.0), ("0", 0.0), ("86400", 300.0), (None, None), ("", None), ("-1", None),
     ("1.5", None), ("Wed, 21 Oct 2026 07:28:00 GMT", None)],
)  # fmt: skip
def test_retry_after_reads_delta_seconds_only_and_caps_them(
    header: str | None, seconds: float | None
) -> None:
    assert retry_after(header) == seconds


def test_world_readable_key_is_refused(tmp_path: Path) -> None:
    key = tmp_path / "key.pem"
    key.write_text("x")
    key.chmod(0o644)
    with pytest.raises(CollectorError, match="readable by others"):
        check_key_permissions(key)
    key.chmod(0o600)
    check_key_permissions(key)


def test_config_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "collector.toml"
    config.write_text('claim_wait_s = 10\ngrace_s = 5\ndrivers = "stub"\n')
    monkeypatch.setenv("VERSUS_COLLECTOR_GRACE_S", "7")
    options, fmt = resolve({"claim_wait_s": 3.0, "state_dir": tmp_path}, config)
    assert (options.claim_wait_s, options.grace_s, options.drivers, fmt) == (3.0, 7.0, ("stub",), "console")
    config.write_text("claim_wait = 1\n")
    with pytest.raises(CollectorError, match="unknown settings"):
        resolve({}, config)
    with pytest.raises(CollectorError, match="claim wait"):
        resolve({"claim_wait_s": 99.0}, None)
    monkeypatch.setenv("VERSUS_COLLECTOR_WS_RETRY_S", "5")
    assert resolve({"state_dir": tmp_path}, None)[0].ws_retry_s == 5.0
    with pytest.raises(CollectorError, match="ws retry > 0"):
        resolve({"ws_retry_s": 0.0}, None)


def test_manifest_and_epochs(tmp_path: Path) -> None:
    drivers = registry.load(DriverContext(tmp_path), ["stub"])
    manifest = registry.manifest(drivers)
    assert manifest[0]["provider"] == "stub"
    ops = {o["name"]: o for o in manifest[0]["operations"]}
    assert ops["append"]["reconcile_operation"] == "append.check"
    first = registry.epoch(manifest, None)
    assert registry.epoch(manifest, first) == first
    assert registry.epoch([], first)[0] == first[0] + 1


def test_stub_device_counts_applications(tmp_path: Path) -> None:
    stub = StubDriver(DriverContext(tmp_path))

    async def run(op: str, key: str) -> str:
        return (await stub.execute(Task("d", op, "sw-1", key, b"{}", 1))).status

    assert asyncio.run(run("append.check", "k")) == "failed"
    assert asyncio.run(run("append", "k")) == "success"
    assert asyncio.run(run("append.check", "k")) == "success"
    assert stub.device("sw-1").read_text() == "k\n"
    assert json.loads(asyncio.run(stub.execute(Task("d", "echo", "x", "k", b'{"a":1}', 0))).result) == {
        "a": 1
    }


@pytest.mark.parametrize("port", [22, 2222])
def test_pinned_host_key_matches_on_any_port(port: int) -> None:
    """The pin is written in OpenSSH's own form: the bare host on port 22, `[host]:port` elsewhere."""
    import asyncssh

    from collector.drivers.ssh import known_hosts_line

    key = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().strip()
    trusted = asyncssh.import_known_hosts(known_hosts_line("10.0.0.7", port, key))
    host_keys = trusted.match("10.0.0.7", "10.0.0.7", port)[0]
    assert {k.export_public_key().decode().strip() for k in host_keys} == {key}
    assert known_hosts_line("10.0.0.7", port, key).startswith(
        "10.0.0.7 " if port == 22 else "[10.0.0.7]:2222 "
    )


def test_a_damaged_update_report_is_not_sent() -> None:
    """The supervisor's report rides every claim; one the gateway would refuse (400) must never be
    sent, or the collector could not claim at all."""
    from collector.claim_loop import update_report

    good = {"state": "rolled_back", "version": "0.3.0", "detail": "x" * 900, "at": 1_764_000_000}
    assert update_report(good) == {**good, "detail": "x" * 500}
    assert update_report({**good, "at": 2**63}) == {**good, "detail": "x" * 500, "at": 0}
    for bad in ({**good, "state": "exploded"}, {**good, "version": ""}, {**good, "version": 3},
                {**good, "version": "0.3\n"}, {**good, "detail": None}, ["updated"], None):  # fmt: skip
        assert update_report(bad) is None, bad
