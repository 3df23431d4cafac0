"""The update download against a hostile or failing repository server (issue 45): a real HTTPS
server holding a gateway certificate the collector trusts serves the real repository's files with
faults; whatever it does, the attempt fails with a stable code, within its bounds, and the
supervisor (a real `versus-collector supervise` process, in test_supervisor_survives.py) lives on.

Here: the download path itself - collector/update_fetcher.py under collector/supervisor/fetch.py.
"""

from __future__ import annotations

import datetime as dt
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from collector.supervisor.fetch import ReleaseFetcher, Target, UpdateError
from collector.supervisor.layout import Layout
from collector.update_fetcher import GatewayFetcher
from common.trust.keys import KeyPurpose, KeySet
from common.trust.tls import ensure_gateway_tls
from router.releases.update_repo import UpdateRepository
from tests.support.hostile_repo import HostileRepo, hostile_repo
from tests.support.pki import p256

pytestmark = pytest.mark.timeout(60)

NOW = dt.datetime.now(dt.UTC)
NAME = "versus-collector-1.1.0-linux-x86_64.pex"


class Repo:
    """A real update repository with one release, and the gateway TLS material to serve it with."""

    def __init__(self, tmp_path: Path):
        self.tmp = tmp_path
        self.keys = KeySet.create(KeyPurpose.RELEASE, int(NOW.timestamp()) - 60)
        self.repo = UpdateRepository(tmp_path / "updates")
        self.repo.ensure(self.keys, NOW)
        artifact = tmp_path / NAME
        artifact.write_bytes(b"release 1.1.0 " * 20_000)
        self.repo.publish(self.keys, artifact, NAME, {"version": "1.1.0"}, NOW)
        published = self.repo.released()[NAME]
        self.target = Target("1.1.0", NAME, published.sha256, published.length)
        [stored] = (self.repo.directory / "targets").iterdir()
        self.stored = f"targets/{stored.name}"
        self.tls = ensure_gateway_tls(tmp_path / "tls", "127.0.0.1", [])
        assert self.tls.ca_file is not None
        self.layout = Layout(tmp_path / "install")
        self.layout.prepare()

    @property
    def ca_file(self) -> Path:
        assert self.tls.ca_file is not None
        return self.tls.ca_file

    def context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_file))

    def fetcher(self, server: HostileRepo, **bounds: float) -> ReleaseFetcher:
        return ReleaseFetcher(
            self.tmp / "tuf", server.metadata_url, self.layout.downloads, self.context(), p256(), "c1",
            {k.kid: k.public for k in self.keys.keys}, self.keys.current_kid, **bounds,  # type: ignore[arg-type]
        )  # fmt: skip

    def refused(self, server: HostileRepo, **bounds: float) -> tuple[str, float]:
        """The code the attempt failed with, and how long it took; nothing may be staged."""
        fetcher = self.fetcher(server, **bounds)
        started = time.monotonic()
        with pytest.raises(UpdateError) as refused:
            fetcher.fetch(self.target)
        fetcher.close()
        assert list(self.layout.releases.iterdir()) == [], "something was staged"
        return refused.value.code, time.monotonic() - started


@pytest.fixture
def repo(tmp_path: Path) -> Repo:
    return Repo(tmp_path)


@pytest.fixture
def server(repo: Repo) -> Iterator[HostileRepo]:
    with hostile_repo(repo.repo.directory, repo.tls.cert_file, repo.tls.key_file) as served:
        yield served


def test_the_genuine_release_is_fetched_through_the_server(repo: Repo, server: HostileRepo) -> None:
    """The fixture serves the repository faithfully when told no fault (the tests below mean something)."""
    fetcher = repo.fetcher(server)
    path = fetcher.fetch(repo.target)
    fetcher.close()
    assert path.read_bytes() == (repo.repo.directory / repo.stored).read_bytes()
    assert "metadata/1.root.json" in server.served and repo.stored in server.served


@pytest.mark.parametrize("fault", ["cut", "short", "gzip"])
def test_a_broken_artifact_body_fails_the_attempt_with_a_code(
    repo: Repo, server: HostileRepo, fault: str
) -> None:
    """A connection cut mid-body, a body shorter than its Content-Length, and a Content-Encoding the
    body does not have: an update_download_failed, not an httpx exception out of the supervisor."""
    server.faults[repo.stored] = fault
    code, _ = repo.refused(server)
    assert code == "update_download_failed"


@pytest.mark.parametrize("fault", ["cut", "short", "gzip"])
def test_a_broken_metadata_body_fails_the_attempt_with_a_code(
    repo: Repo, server: HostileRepo, fault: str
) -> None:
    server.faults["metadata/timestamp.json"] = fault
    code, _ = repo.refused(server)
    assert code == "update_download_failed"


def test_a_signed_document_of_another_type_as_a_root_is_refused(repo: Repo, server: HostileRepo) -> None:
    """A validly signed targets document served as 1.root.json (the bootstrap walk used to read it as
    a root and crash on its missing roles)."""
    server.faults["metadata/1.root.json"] = "as:metadata/1.targets.json"
    code, _ = repo.refused(server)
    assert code == "update_root_invalid"


def test_slow_roots_end_the_walk_at_its_bound(repo: Repo, server: HostileRepo) -> None:
    """Every root answered after 20 s: the walk gives up at its own bound, not after 1,024 x 10 min."""
    server.faults["metadata/"] = "slow"
    code, took = repo.refused(server, bootstrap_timeout_s=2.0)
    assert code == "update_bootstrap_timeout" and took < 8, (code, took)


def test_a_stalled_artifact_ends_the_attempt_at_its_bound(repo: Repo, server: HostileRepo) -> None:
    server.faults[repo.stored] = "stall"
    code, took = repo.refused(server, timeout_s=3.0)
    assert code == "update_timeout" and took < 9, (code, took)


def test_an_endless_body_is_cut_at_the_signed_length(repo: Repo, server: HostileRepo) -> None:
    server.faults[repo.stored] = "endless"
    code, _ = repo.refused(server)
    assert code == "update_download_failed"


def test_a_cancel_ends_a_stalled_download_at_once(repo: Repo, server: HostileRepo) -> None:
    server.faults[repo.stored] = "stall"
    fetcher = repo.fetcher(server)
    threading.Timer(1.0, fetcher.cancelled.set).start()
    started = time.monotonic()
    with pytest.raises(UpdateError) as refused:
        fetcher.fetch(repo.target)
    fetcher.close()
    # The read the server holds is ended by the cancel (its socket shut down), not by its 30 s timeout.
    assert refused.value.code == "update_cancelled"
    assert time.monotonic() - started < 10


def test_a_cut_connection_is_a_download_error_of_the_fetcher_itself(repo: Repo, server: HostileRepo) -> None:
    """The adapter alone: what the body raises is python-tuf's DownloadError, as what the request raises."""
    from tuf.api import exceptions

    server.faults[repo.stored] = "cut"
    fetcher = GatewayFetcher(repo.context(), p256(), "c1")
    url = server.metadata_url.removesuffix("metadata/") + repo.stored
    with pytest.raises(exceptions.DownloadError, match="RemoteProtocolError"):
        b"".join(fetcher.fetch(url))
    fetcher.close()
