"""A real `versus-collector supervise` against a hostile update repository (issue 45): the download
breaks, stalls or crawls, and the supervisor stays alive, reports the failure with its code, keeps
restarting the collector it supervises, stops on SIGTERM within seconds, and does not try again at
once after a restart.

The supervisor's state directory is made here as enrollment would leave it: identity, key, the
gateway's CA, the pinned dispatch and release key sets, and a config signed with the dispatch key
that names the release to install. The repository and its server are those of
test_update_hostile_repo.py; the collector the supervisor runs is this tree's `versus-collector
run`, which retries a gateway that never answers (the tests need it running, not working).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from collector.signed_config import ConfigStore
from collector.state import StatePaths
from common.config.state_dir import write_private
from common.embedded.process import free_port
from common.trust import signed_doc
from common.trust.keys import KeyPurpose, KeySet, trusted
from common.trust.pki import private_pem
from router.trust import collector_docs
from tests.integration.test_update_hostile_repo import Repo
from tests.support.hostile_repo import HostileRepo, hostile_repo
from tests.support.pki import p256

pytestmark = pytest.mark.timeout(90)

COLLECTOR_ID = "col_supervised"


def _state(tmp_path: Path, repo: Repo) -> Path:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    paths = StatePaths(state)
    now = int(time.time())
    write_private(paths.key, private_pem(p256()))  # the collector refuses a key others can read
    paths.ca_bundle.write_bytes(repo.ca_file.read_bytes())
    # A gateway that never answers: the supervised collector keeps retrying it.
    paths.identity.write_text(json.dumps({
        "collector_id": COLLECTOR_ID, "site_id": "site_1", "status": "active",
        "gateway_url": f"https://127.0.0.1:{free_port()}",
    }))  # fmt: skip
    dispatch = KeySet.create(KeyPurpose.DISPATCH, now - 60)
    paths.keys.write_text(json.dumps({
        "versions": {"dispatch": 1, "release": 1}, "thresholds": {"dispatch": 1, "release": 1},
        "dispatch": [k.to_json() for k in dispatch.public_keys(now)],
        "release": [k.to_json() for k in repo.keys.public_keys(now)],
    }))  # fmt: skip
    row = {
        "config_version": 1, "vault_mode": "local", "target_version": repo.target.version,
        "target_name": repo.target.name, "target_sha256": repo.target.sha256,
        "target_length": repo.target.length,
    }  # fmt: skip
    document = signed_doc.sign(dispatch.current, collector_docs.config_payload(COLLECTOR_ID, row, now))
    ConfigStore(paths.config, COLLECTOR_ID, trusted(dispatch.public_keys(now))).accept(document, now)
    return state


class Supervisor:
    """`versus-collector supervise` as a process, with self-update from the hostile server."""

    def __init__(self, state: Path, server: HostileRepo, log: Path, *extra: str):
        self.state = state
        self.log = log
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "collector", "supervise", "--state-dir", str(state),
                 "--manifest-url", server.metadata_url, "--update-pubkey", _release_kid(state),
                 "--check-interval", "0.5", *extra, "--", "--claim-wait", "2", "--max-backoff", "1"],
                stdout=out, stderr=out,
            )  # fmt: skip

    def children(self) -> list[int]:
        try:
            return [
                p.pid for p in psutil.Process(self.proc.pid).children() if p.status() != psutil.STATUS_ZOMBIE
            ]
        except psutil.NoSuchProcess:
            return []

    def status(self) -> dict[str, Any]:
        path = self.state / "update-status.json"
        return dict(json.loads(path.read_text())) if path.exists() else {}

    def said(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> tuple[int, float]:
        """SIGTERM; the exit status and how long it took."""
        started = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(30)
        return code, time.monotonic() - started


def _release_kid(state: Path) -> str:
    return str(json.loads((state / "keys.json").read_text())["release"][0]["kid"])


def _wait(check: Callable[[], object], timeout: float, what: str, sup: Supervisor) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert sup.proc.poll() is None, (
            f"the supervisor exited ({sup.proc.returncode}):\n{sup.said()[-3000:]}"
        )
        assert time.monotonic() < deadline, f"{what} within {timeout} s:\n{sup.said()[-3000:]}"
        time.sleep(0.1)


@pytest.fixture
def repo(tmp_path: Path) -> Repo:
    return Repo(tmp_path)


@pytest.fixture
def server(repo: Repo) -> Iterator[HostileRepo]:
    with hostile_repo(repo.repo.directory, repo.tls.cert_file, repo.tls.key_file, delay_s=60) as served:
        yield served


@pytest.mark.parametrize("fault", ["cut", "short", "gzip"])
def test_a_broken_download_is_reported_and_the_supervisor_lives_on(
    tmp_path: Path, repo: Repo, server: HostileRepo, fault: str
) -> None:
    server.faults[repo.stored] = fault
    sup = Supervisor(_state(tmp_path, repo), server, tmp_path / "supervisor.log")
    try:
        _wait(lambda: sup.status().get("state") == "failed", 30, "a failure report", sup)
        status = sup.status()
        assert status["version"] == repo.target.version
        assert status["detail"].startswith("update_download_failed: "), status
        time.sleep(1)  # past the check interval: still alive, still supervising, not retrying at once
        assert sup.proc.poll() is None and sup.children(), sup.said()[-2000:]
        assert server.served.count(repo.stored) == 1
    finally:
        code, _ = sup.stop()
    assert code == 0


def test_a_killed_collector_is_restarted_during_a_stalled_download(
    tmp_path: Path, repo: Repo, server: HostileRepo
) -> None:
    server.faults[repo.stored] = "stall"
    sup = Supervisor(_state(tmp_path, repo), server, tmp_path / "supervisor.log")
    try:
        _wait(lambda: repo.stored in server.served and sup.children(), 30, "the download under way", sup)
        assert sup.status()["state"] == "updating"
        [first] = sup.children()
        psutil.Process(first).kill()
        # Restarted within its backoff (1 s), while the download still hangs.
        _wait(lambda: sup.children() not in ([], [first]), 10, "a new collector", sup)
        assert sup.status()["state"] == "updating"
    finally:
        code, took = sup.stop()
    # Stopped within seconds mid-download, and the attempt is reported, not left "updating".
    assert code == 0 and took < 5, took
    status = sup.status()
    assert status["state"] == "failed" and status["detail"].startswith("update_interrupted: "), status
    assert list((tmp_path / "state" / "versions" / "releases").iterdir()) == [], "something was staged"


def test_slow_roots_do_not_hold_the_supervisor(tmp_path: Path, repo: Repo, server: HostileRepo) -> None:
    """Every root answered after a minute: the walk ends at --bootstrap-timeout and is reported."""
    server.faults["metadata/"] = "slow"
    sup = Supervisor(_state(tmp_path, repo), server, tmp_path / "supervisor.log", "--bootstrap-timeout", "3")
    try:
        _wait(lambda: sup.status().get("state") == "failed", 20, "a failure report", sup)
        assert sup.status()["detail"].startswith("update_bootstrap_timeout: "), sup.status()
    finally:
        code, took = sup.stop()
    assert code == 0 and took < 5, took


def test_a_restarted_supervisor_reports_the_failure_and_waits_out_its_backoff(
    tmp_path: Path, repo: Repo, server: HostileRepo
) -> None:
    """No crash loop: the failure and its time are in the state directory, so the next supervisor
    (systemd's Restart=always) neither tries again at once nor shows a stale 'updating'."""
    server.faults[repo.stored] = "cut"
    state = _state(tmp_path, repo)
    first = Supervisor(state, server, tmp_path / "first.log")
    try:
        _wait(lambda: first.status().get("state") == "failed", 30, "a failure report", first)
    finally:
        first.stop()
    remembered = json.loads((state / "update-failures.json").read_text())["failures"]
    assert [(f["version"], f["code"], f["count"]) for f in remembered] == [
        (repo.target.version, "update_download_failed", 1)
    ]
    # As a supervisor that died mid-attempt would have left it.
    (state / "update-status.json").write_text(
        json.dumps({"state": "updating", "version": repo.target.version})
    )
    fetched = server.served.count(repo.stored)
    second = Supervisor(state, server, tmp_path / "second.log")
    try:
        _wait(lambda: second.status().get("state") == "failed", 15, "the failure reported again", second)
        time.sleep(3)  # several check intervals
        assert server.served.count(repo.stored) == fetched, "tried again inside its backoff"
        assert second.proc.poll() is None
    finally:
        second.stop()


def test_a_broken_download_is_tried_again_after_its_backoff_and_installs(
    tmp_path: Path, repo: Repo, server: HostileRepo
) -> None:
    """The way back once the repository answers again: the same release downloads and is staged
    (it fails its preflight here - the artifact is not a runnable release - which is a code too)."""
    server.faults[repo.stored] = "cut"
    sup = Supervisor(_state(tmp_path, repo), server, tmp_path / "supervisor.log", "--download-retry", "1")
    try:
        _wait(
            lambda: sup.status().get("detail", "").startswith("update_download_failed"), 30, "a failure", sup
        )
        server.faults.clear()
        _wait(lambda: sup.status().get("detail", "").startswith("release_does_not_start"), 30, "a retry", sup)
        assert server.served.count(repo.stored) == 2
    finally:
        code, _ = sup.stop()
    assert code == 0
