"""Releases built from this tree and collectors run under `versus-collector supervise` (issue 20)."""

from __future__ import annotations

import fcntl
import json
import platform
import signal
import ssl
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx

from common.embedded.process import free_port
from tests.e2e.collector_harness import Collector, wait_for
from tests.e2e.harness import ControlPlane, run_cli
from tools.collector_dist import build, build_pex

OS, ARCH = platform.system().lower(), platform.machine()
# Appended to a release that must fail its health window: it starts (`--version` works) but
# never reaches the control plane.
NEVER_CONNECTS = """

async def _never_connects(self: Agent) -> None:
    await asyncio.Event().wait()


Agent.run = _never_connects  # type: ignore[method-assign]
"""


def build_release(out: Path, version: str, *, broken: bool = False) -> Path:
    """This tree's collector as the PEX release artifact of ``version``, built once per test
    session: ``out`` is the session's release cache (the ``release_cache`` fixture), shared by
    the workers, so two tests that need the same release (about 12 CPU-seconds to build) share
    one build. Tests only read the artifact."""
    key = out / f"{version}{'-broken' if broken else ''}"
    key.mkdir(parents=True, exist_ok=True)
    with open(key / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a worker building it makes the others wait, then share
        built = sorted(key.glob("*.pex"))
        if built:
            return built[0]
        return _build(key, version, broken=broken)


def _build(out: Path, version: str, *, broken: bool) -> Path:

    def breaking(staged: Path) -> None:
        agent = staged / "collector" / "agent.py"
        agent.write_text(agent.read_text() + NEVER_CONNECTS)

    wheel = build(out, version, breaking if broken else None)
    return build_pex(wheel, out)


def metadata_url(gateway_url: str) -> str:
    """The update repository's metadata URL on the gateway at ``gateway_url``."""
    return gateway_url.rstrip("/") + "/api/collector/v1/updates/metadata/"


def publish(cp: ControlPlane, artifact: Path, version: str, *extra: str) -> dict[str, Any]:
    """Publish ``artifact``; its SBOM too when one was built beside it (else ``--no-sbom``)."""
    has_sbom = artifact.with_name(artifact.name.removesuffix(".pex") + ".cdx.json").exists()
    done = run_cli(
        ["releases", "publish", "--version", version, "--channel", "stable", "--artifact", str(artifact),
         "--os", OS, "--arch", ARCH, "--json", *([] if has_sbom else ["--no-sbom"]), *extra],
        cp.env, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout)["release"])


def update_view(cp: ControlPlane, collector_id: str) -> dict[str, Any]:
    """The collector's Agent Version card as `collectors show --json` gives it."""
    return dict(cp.api.collector(collector_id)["update"])


@dataclass
class Supervised:
    """A collector run by its supervisor, with self-update enabled."""

    collector: Collector
    health_window_s: float = 25.0
    check_interval_s: float = 1.0
    # Where the update repository is reached (default: the collector's gateway), and more options.
    manifest_url: str | None = None
    extra: tuple[str, ...] = ()
    proc: subprocess.Popen[bytes] | None = None
    _log: IO[bytes] | None = field(default=None, repr=False)

    @property
    def install_dir(self) -> Path:
        return self.collector.state / "versions"

    def start(self) -> None:
        c = self.collector
        identity = json.loads((c.state / "identity.json").read_text())
        release_kid = json.loads((c.state / "keys.json").read_text())["release"][0]["kid"]
        manifest = (
            self.manifest_url or identity["gateway_url"].rstrip("/") + "/api/collector/v1/updates/metadata/"
        )
        self._log = open(c.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "collector", "supervise", "--state-dir", str(c.state),
             "--manifest-url", manifest, "--update-pubkey", release_kid,
             "--health-window", str(self.health_window_s), "--check-interval", str(self.check_interval_s),
             *self.extra, "--", "--claim-wait", "2", "--grace", "5", "--max-backoff", "1"],
            env=c._env(), stdout=self._log, stderr=self._log,
        )  # fmt: skip

    def stop(self) -> int:
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(60)
        if self._log is not None:
            self._log.close()
            self._log = None
        return code

    def status(self) -> dict[str, Any]:
        path = self.collector.state / "update-status.json"
        return dict(json.loads(path.read_text())) if path.exists() else {}


class ReplicaGateway:
    """A second gateway beside `versus-cp up`, as docs/configuration.md shows an operator: the
    same state directory and settings, its own port, and the embedded PostgreSQL's and Redis's
    URLs from the running `up`'s endpoints.json. Killable and restartable alone."""

    def __init__(self, cp: ControlPlane, log: Path):
        published = json.loads((cp.state_dir / "endpoints.json").read_text())
        self.env = {
            **cp.env, "DATABASE_URL": published["database_url"], "REDIS_URL": published["redis_url"],
            "VERSUS_GATEWAY_PORT": str(free_port()),
        }  # fmt: skip
        self.argv = [sys.executable, "-m", "versus_cp", "gateway"]
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def port(self) -> int:
        return int(self.env["VERSUS_GATEWAY_PORT"])

    def start(self, ca: Path) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(self.argv, env=self.env, stdout=out, stderr=out)
        url = f"https://127.0.0.1:{self.port}/readyz"
        context = ssl.create_default_context(cafile=str(ca))

        def ready() -> bool:
            assert self.proc is not None and self.proc.poll() is None, self.log.read_text()[-2000:]
            try:
                return httpx.get(url, verify=context, timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(ready, timeout=60)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)
