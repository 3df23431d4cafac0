"""The three vault modes end to end: the ssh driver logs in to Debian's OpenSSH (in a network
namespace of its own, on port 22) with a credential from the collector's sealed file (A), relayed
by the control plane (B) and read from a real Vault-API server, OpenBao (C), while an operator
switches the running collector from one mode to the next. Its traffic goes through a
TLS-inspecting proxy the whole time. Afterwards neither the proxy's view, PostgreSQL, the logs
nor the collector's state directory holds the credential or the AppRole secret id in plaintext.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from common.embedded.postgres import BIN_DIR
from common.trust import b64url
from tests.e2e.collector_harness import Collector, Platform, wait_for
from tests.e2e.harness import ControlPlane
from tests.support import netns
from tests.support.mitm import InterceptingProxy
from tests.support.openbao import OpenBao, openbao

pytestmark = pytest.mark.timeout(300)

PG_DUMP = BIN_DIR / "pg_dump"


@pytest.fixture
def device(tmp_path: Path) -> Iterator[netns.OpenSsh]:
    with netns.host() as where, netns.openssh_server(where, tmp_path / "sshd") as server:
        yield server


@pytest.fixture
def bao(tmp_path: Path) -> Iterator[OpenBao]:
    with openbao(tmp_path / "bao") as server:
        yield server


def _cli(args: list[str], env: dict[str, str], stdin: str = "") -> str:
    done = subprocess.run(
        [sys.executable, "-m", "versus_cp", *args], input=stdin, env=env, capture_output=True, text=True,
        timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def _on_host(c: Collector, *args: str, stdin: str = "") -> None:
    """`versus-collector credentials ...` on the collector host (vault mode A's sealed file)."""
    done = subprocess.run(
        [*c.command, "credentials", *args, "--state-dir", str(c.state)], input=stdin, env=c._env(),
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


def _session_mode(cp: ControlPlane, collector_id: str) -> str:
    shown = cp.api.collector(collector_id)
    return str(shown.get("session", {}).get("vault_mode", ""))


def _switch(cp: ControlPlane, c: Collector, collector_id: str, mode: str, wanted: str, *extra: str,
            stdin: str = "") -> None:  # fmt: skip
    """Switch the running collector's mode and wait until its restarted process runs it."""
    _cli(["collectors", "vault-mode", collector_id, mode, *extra], cp.env, stdin)
    wait_for(lambda: _session_mode(cp, collector_id) == wanted, timeout=90)


def test_ssh_logs_in_to_openssh_with_a_credential_from_each_vault_mode(
    start_control_plane: Callable[..., ControlPlane], tmp_path: Path, device: netns.OpenSsh, bao: OpenBao,
    database_url: str, redis_url: str,
) -> None:  # fmt: skip
    cp = start_control_plane(DATABASE_URL=database_url, REDIS_URL=redis_url)
    collector = Collector(cp, tmp_path / "collector", tmp_path / "collector.log")
    collector_id = collector.enroll()
    key_text = device.client_key.read_text()
    # A line from the middle of the private key: what a leak of the credential would show.
    marker = key_text.splitlines()[3]
    credential = {"host": device.address, "port": 22, "username": "root", "client_key": key_text,
                  "host_key": device.host_key}  # fmt: skip
    platform = Platform(cp)
    n = 0

    def run(expect: str = "success") -> Any:
        nonlocal n
        n += 1
        task = platform.submit(collector.site_id, "show", "read", "sw-22", {"command": f"echo run-{n}"},
                               f"vault-{n}", provider="ssh")  # fmt: skip
        done = platform.wait_state(task, {"success", "failed"}, timeout=90)
        assert (done.state, done.error_code) != (None, None)
        if expect == "success":
            assert done.error_code == "", (done.error_code, collector.log()[-3000:])
            assert json.loads(done.result)["stdout"] == f"run-{n}\n"
        else:
            assert done.error_code == expect, done.error_code
        return done

    with InterceptingProxy(tmp_path / "mitm", cp.port("gateway"), cp.ca_file) as mitm:
        (collector.state / "extra-ca.pem").write_bytes(mitm.ca_pem)
        collector.use_gateway(mitm.url)
        secret_id = "approle-secret-" + secrets.token_hex(8)  # chosen here, so the greps know it
        try:
            # Mode A: sealed on the collector's disk, set by the operator on the collector host.
            _on_host(collector, "set", "ssh", "sw-22", stdin=json.dumps(credential))
            collector.start()
            wait_for(lambda: _session_mode(cp, collector_id) == "VAULT_MODE_LOCAL", timeout=60)
            run()

            # Mode B: only the control plane holds it (removed from the collector first, so the
            # login proves the relay); the running collector restarts into the mode.
            _cli(["credentials", "put", "ssh:sw-22", "--tenant", "acme"], cp.env, json.dumps(credential))
            _on_host(collector, "rm", "ssh", "sw-22")
            _switch(cp, collector, collector_id, "B", "VAULT_MODE_CLOUD_RELAYED")
            run()

            # Mode C: only the customer's Vault holds it; the collector gets a wrapped AppRole
            # secret id through its signed config and reads the credential itself.
            _cli(["credentials", "delete", "ssh:sw-22", "--tenant", "acme"], cp.env)
            bao.put("versus/ssh/sw-22", credential)
            (tmp_path / "vault-ca.pem").write_text(bao.ca_pem)
            role_id = bao.approle()
            created = json.loads(_cli(["vault-integrations", "create", "corp-vault", "--address", bao.address,
                                       "--role-id", role_id, "--kv-mount", "secret", "--ca-file",
                                       str(tmp_path / "vault-ca.pem"), "--json"], cp.env))  # fmt: skip
            integration = created["integration"]["integration_id"]
            wrapped = bao.wrapped_secret_id(value=secret_id)
            _switch(cp, collector, collector_id, "C", "VAULT_MODE_EXTERNAL", "--integration", integration,
                    "--secret-id-file", "-", stdin=wrapped + "\n")  # fmt: skip
            run()
            run()  # the token is reused, not a second login per task
            assert collector.log().count("logged in to the Vault") == 1

            # The Vault goes down: the task fails with a stable code, and nothing else breaks.
            bao.stop()
            run(expect="vault_unreachable")

            # And back to mode A mid-fleet: the token is revoked as the process restarts.
            _on_host(collector, "set", "ssh", "sw-22", stdin=json.dumps(credential))
            _switch(cp, collector, collector_id, "A", "VAULT_MODE_LOCAL")
            run()
        finally:
            collector.stop()
            platform.close()
        captured = mitm.captured()

    # Nothing holds the credential or the secret id in plaintext: not the proxy's decrypted view of
    # every request and response, not PostgreSQL, not a log, not the collector's state directory.
    assert b'"claim"' in captured or b"/claim" in captured  # the proxy did see the traffic
    dumped = subprocess.run(
        [str(PG_DUMP), "--data-only", database_url.replace("+psycopg", "")], capture_output=True, check=False
    )
    assert dumped.returncode == 0, dumped.stderr
    dump = dumped.stdout
    assert b"vault_integrations" in dump and b"device_credentials" in dump
    logs = (cp.log() + collector.log()).encode()
    state = b"".join(p.read_bytes() for p in collector.state.rglob("*") if p.is_file())
    for secret in (marker.encode(), secret_id.encode(), wrapped.encode()):
        for where, data in (("proxy", captured), ("postgresql", dump), ("logs", logs), ("state", state)):
            assert secret not in data, (where, secret[:12])
    assert not (collector.state / "vault-secret-id.sealed").exists()  # left mode C: removed


def test_a_tampered_sealed_file_stops_the_collector_with_its_code_and_leaks_nothing(
    shared_control_plane: ControlPlane, tmp_path: Path
) -> None:
    cp = shared_control_plane
    collector = Collector(cp, tmp_path / "collector", tmp_path / "collector.log")
    collector.enroll()
    password = "pw-" + secrets.token_hex(8)
    _on_host(collector, "set", "ssh", "sw-9", stdin=json.dumps({"host": "10.0.0.9", "password": password}))
    sealed = collector.state / "credentials.sealed"
    doc = json.loads(sealed.read_text())
    ciphertext = bytearray(b64url.decode(doc["ciphertext"]))
    ciphertext[len(ciphertext) // 2] ^= 0x01  # one flipped bit
    sealed.write_text(json.dumps({**doc, "ciphertext": b64url.encode(bytes(ciphertext))}))

    run = subprocess.run(
        [*collector.command, "run", "--state-dir", str(collector.state)], env=collector._env(),
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert run.returncode == 1
    assert "credentials_tampered" in run.stderr.splitlines()[-1], run.stderr
    # The operator's tools say the same, and neither shows anything of the content.
    listed = subprocess.run(
        [*collector.command, "credentials", "list", "--state-dir", str(collector.state)],
        env=collector._env(), capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert listed.returncode == 1 and "credentials_tampered" in listed.stderr
    for out in (run.stdout, run.stderr, listed.stdout, listed.stderr):
        assert password not in out and "10.0.0.9" not in out
