"""The ssh driver against Debian's OpenSSH on port 22, in a network namespace of its own.

Port 22 is where real gear listens, and where OpenSSH's known-hosts syntax names a host bare
(``10.0.0.7 ssh-ed25519 …``), not as ``[10.0.0.7]:22``: a pin in the wrong form refused every
device on the standard port.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from collector.drivers.base import DriverContext, DriverError, Task
from collector.drivers.ssh import SshDriver
from tests.support import netns

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def device(tmp_path: Path) -> Iterator[netns.OpenSsh]:
    with netns.host() as where, netns.openssh_server(where, tmp_path / "sshd") as server:
        yield server


def _driver(device: netns.OpenSsh, tmp_path: Path, host_key: str) -> SshDriver:
    target = {"host": device.address, "port": 22, "username": "root", "client_key": str(device.client_key),
              "host_key": host_key}  # fmt: skip
    return SshDriver(DriverContext(tmp_path, lambda: {"ssh": {"sw-22": target}}))


def _task(command: str) -> Task:
    return Task("dsp-1", "show", "sw-22", "key-1", json.dumps({"command": command}).encode(), 0)


async def test_a_device_on_port_22_with_its_pinned_key(device: netns.OpenSsh, tmp_path: Path) -> None:
    outcome = await _driver(device, tmp_path, device.host_key).execute(_task("echo on-port-22"))
    assert outcome.status == "success", outcome
    assert json.loads(outcome.result)["stdout"] == "on-port-22\n"


async def test_a_device_whose_key_differs_from_the_pin_is_refused(
    device: netns.OpenSsh, tmp_path: Path
) -> None:
    impostor = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJdD7y3aLq454yWBdwLWbieU1ebz9/cu7/QEXn9OIeZJ"
    outcome = await _driver(device, tmp_path, impostor).execute(_task("echo never"))
    assert (outcome.status, outcome.error_code) == ("failed", "ssh_unreachable")
    assert "host key" in outcome.error_message.lower()


async def test_a_client_key_carried_as_text_logs_in(device: netns.OpenSsh, tmp_path: Path) -> None:
    # A credential relayed with the dispatch or read from a Vault carries the key itself, not a path.
    target = {"host": device.address, "username": "root", "client_key": device.client_key.read_text(),
              "host_key": device.host_key}  # fmt: skip
    driver = SshDriver(DriverContext(tmp_path, lambda: {"ssh": {"sw-22": target}}))
    outcome = await driver.execute(_task("echo key-as-text"))
    assert outcome.status == "success", outcome
    assert json.loads(outcome.result)["stdout"] == "key-as-text\n"
    broken = {**target, "client_key": "-----BEGIN OPENSSH PRIVATE KEY-----\nnot a key\n"}
    driver = SshDriver(DriverContext(tmp_path, lambda: {"ssh": {"sw-22": broken}}))
    with pytest.raises(DriverError) as caught:
        await driver.execute(_task("echo never"))
    assert caught.value.code == "client_key_invalid"
