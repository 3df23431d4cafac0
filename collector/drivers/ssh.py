"""``ssh`` - runs a command on a device over SSH (asyncssh).

    show     read             a command the operator declares read-only
    command  mutate_terminal  any command

Params (JSON): ``{"command": "uname -a"}``. Host, port, user, password or key
and the pinned host key are the device's credential, keyed by target_ref - from
the collector's sealed file, relayed with the dispatch or read from the
customer's Vault, as the vault mode says (docs/vault.md)::

    {"ssh": {"<target_ref>": {"host": "10.0.0.7", "port": 22, "username": "ops",
                               "password": "...", "client_key": "/path", "host_key": "ssh-ed25519 AAAA..."}}}

``client_key`` is a path on the collector host or the private key itself (PEM or
OpenSSH text, as a relayed or Vault-held credential must carry it). Without a
pinned ``host_key`` the connection is refused rather than trusting the device blindly.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

import asyncssh

from collector.drivers.base import DriverContext, DriverError, Operation, Outcome, Task

MAX_OUTPUT_BYTES = 512 * 1024


def known_hosts_line(host: str, port: int, host_key: str) -> str:
    """The pinned key as an OpenSSH ``known_hosts`` line: the bare host on port 22 (as OpenSSH and
    asyncssh look it up there), ``[host]:port`` on any other port."""
    name = host if port == 22 else f"[{host}]:{port}"
    return f"{name} {host_key}\n"


def _client_key(value: str) -> Any:
    """A private key given as text (it starts with ``-----BEGIN``), else the path of one."""
    if not value.lstrip().startswith("-----BEGIN"):
        return value
    try:
        return asyncssh.import_private_key(value)
    except (asyncssh.KeyImportError, ValueError):
        raise DriverError("client_key_invalid", "the credential's client_key is not a private key") from None


class SshDriver:
    provider: ClassVar[str] = "ssh"
    max_concurrency: ClassVar[int] = 4
    operations: ClassVar[dict[str, Operation]] = {
        "show": Operation("read", timeout_s=60),
        "command": Operation("mutate_terminal", timeout_s=300),
    }

    def __init__(self, ctx: DriverContext):
        self.credentials = ctx.credentials

    async def execute(self, task: Task) -> Outcome:
        # One snapshot per task: a credential replaced on disk meanwhile applies from the next task.
        raw = task.device_credential(self.credentials, "ssh")
        if raw is None:
            raise DriverError("no_credentials", f"no local ssh settings for {task.target_ref!r}")
        target = task.hold(raw)  # the copy a revocation wipes
        if not target.get("host_key"):
            raise DriverError("host_key_missing", f"no pinned host key for {task.target_ref!r}")
        command = str(json.loads(task.params or b"{}").get("command", ""))
        if not command:
            raise DriverError("bad_params", "params.command is required")
        known_hosts = asyncssh.import_known_hosts(
            known_hosts_line(str(target["host"]), int(target.get("port", 22)), str(target["host_key"]))
        )
        options: dict[str, Any] = {"known_hosts": known_hosts, "username": target["username"]}
        if target.get("password"):
            options["password"] = target["password"]
        if target.get("client_key"):
            options["client_keys"] = [_client_key(str(target["client_key"]))]
        try:
            async with asyncssh.connect(target["host"], port=int(target.get("port", 22)), **options) as conn:
                task.check_window()  # the login may have taken a while: the command is the write
                completed = await conn.run(command, check=False)
        except (OSError, asyncssh.Error) as exc:
            return Outcome("failed", b"", "ssh_unreachable", str(exc)[:200])
        stdout = str(completed.stdout or "")[:MAX_OUTPUT_BYTES]
        stderr = str(completed.stderr or "")[:MAX_OUTPUT_BYTES]
        result = json.dumps(
            {"exit_status": completed.exit_status, "stdout": stdout, "stderr": stderr}
        ).encode()
        ok = completed.exit_status == 0
        return Outcome("success" if ok else "failed", result, "" if ok else "ssh_exit_status")
