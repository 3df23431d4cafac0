"""Vault mode C's pure parts: the KV path of a device, and the settings a config must name."""

from __future__ import annotations

import pytest

from collector.drivers.base import DriverError, Supplied, Task
from collector.vault_settings import VaultError, VaultSettings, secret_path


def test_a_device_path_is_prefix_provider_and_target_ref() -> None:
    assert secret_path("versus", "ssh", "sw-7") == "versus/ssh/sw-7"
    assert secret_path("teams/net", "http", "dc1/lb-1") == "teams/net/http/dc1/lb-1"


@pytest.mark.parametrize("ref", ["", "..", "a/../b", "a//b", "sw 7", "sw?x=1", "sw#1", "%2e%2e", "/abs"])
def test_a_reference_that_is_not_a_plain_path_never_reaches_the_vault(ref: str) -> None:
    with pytest.raises(VaultError) as caught:
        secret_path("versus", "ssh", ref)
    assert caught.value.code == "vault_path_invalid"


def test_a_config_without_a_complete_integration_is_refused() -> None:
    with pytest.raises(VaultError) as caught:
        VaultSettings.from_config({"integration_id": "vi_1", "address": "https://v:8200", "role_id": ""})
    assert caught.value.code == "vault_config_invalid"
    settings = VaultSettings.from_config(
        {"integration_id": "vi_1", "address": "https://v:8200", "role_id": "r", "kv_mount": "kv"}
    )
    assert (settings.path_prefix, settings.delivery, settings.secret_version) == ("versus", "wrapped", 0)


def test_a_supplied_credential_replaces_the_local_file_and_its_failure_fails_the_driver() -> None:
    local = {"ssh": {"sw-7": {"password": "local"}}}
    task = Task("dsp-1", "show", "sw-7", "k", b"{}", 0)
    assert task.device_credential(lambda: local, "ssh") == {"password": "local"}  # mode A
    task.supplied.set(None)  # modes B and C with nothing stored: the local file is not consulted
    assert task.device_credential(lambda: local, "ssh") is None
    task.supplied.set({"password": "from-vault"})
    held = task.device_credential(lambda: local, "ssh")
    assert held == {"password": "from-vault"}
    task.supplied.scrub()
    assert len(held or {}) == 0
    failed = Task("dsp-2", "show", "sw-7", "k", b"{}", 0, supplied=Supplied())
    failed.supplied.fail("vault_unreachable", "the Vault did not answer")
    with pytest.raises(DriverError) as caught:
        failed.device_credential(lambda: local, "ssh")
    assert caught.value.code == "vault_unreachable"
