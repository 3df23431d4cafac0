"""Vault mode C against a real Vault-API server (OpenBao, tests/support/openbao.py): the secret id
delivered wrapped and encrypted to the collector, AppRole login, KV v2 reads, token renewal,
re-login at the maximum TTL, revocation, and each way it fails with its stable code."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from collector.external_vault import ExternalVault
from collector.vault_settings import SECRET_FILE, VaultError, VaultSettings, settings_key
from common.trust import pki
from router.credentials.vault_secrets import for_collector
from tests.support.openbao import OpenBao, openbao

pytestmark = pytest.mark.timeout(90)

COLLECTOR = "col-vault-1"
DEVICE = {"host": "10.0.0.7", "username": "netops", "password": "Vault-Held-Pa55!"}


@pytest.fixture(scope="module")
def bao(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OpenBao]:
    with openbao(tmp_path_factory.mktemp("bao")) as server:
        server.put("versus/ssh/sw-7", DEVICE)
        yield server


@pytest.fixture
def identity() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _settings(
    bao: OpenBao,
    identity: ec.EllipticCurvePrivateKey,
    role_id: str,
    secret: str,
    *,
    delivery: str = "wrapped",
    version: int = 1,
    ca_pem: str | None = None,
) -> VaultSettings:
    vault = {
        "integration_id": "vi_test", "address": bao.address, "role_id": role_id, "kv_mount": "secret",
        "path_prefix": "versus", "ca_pem": bao.ca_pem if ca_pem is None else ca_pem,
        "secret_id_delivery": delivery,
        "secret": for_collector(identity.public_key(), COLLECTOR, version, delivery, secret),
    }  # fmt: skip
    return VaultSettings.from_config(vault)


def _vault(settings: VaultSettings, state: Path, identity: ec.EllipticCurvePrivateKey) -> ExternalVault:
    state.mkdir(exist_ok=True)
    return ExternalVault(settings, state, identity, COLLECTOR)


async def test_a_wrapped_secret_id_logs_in_and_reads_the_device_credential(
    bao: OpenBao, identity: ec.EllipticCurvePrivateKey, tmp_path: Path
) -> None:
    wrapped = bao.wrapped_secret_id()
    vault = _vault(_settings(bao, identity, bao.approle(), wrapped), tmp_path / "state", identity)
    assert await vault.read("ssh", "sw-7") == DEVICE
    assert await vault.read("ssh", "sw-8") is None  # nothing stored: the driver says no_credentials
    assert vault.logins == 1
    await vault.close()
    # The unwrapped secret id is kept sealed (the token cannot be used twice), never in plaintext.
    sealed = (tmp_path / "state" / SECRET_FILE).read_bytes()
    assert b"secret_id" not in sealed and wrapped.encode() not in sealed
    # A restart (a new session, same config) uses the kept secret id: the wrapping token is spent.
    again = _vault(_settings(bao, identity, bao.approle(), wrapped), tmp_path / "state", identity)
    assert await again.read("ssh", "sw-7") == DEVICE
    await again.close()


async def test_the_token_is_revoked_when_the_collector_stops(
    bao: OpenBao, identity: ec.EllipticCurvePrivateKey, tmp_path: Path
) -> None:
    vault = _vault(_settings(bao, identity, bao.approle(), bao.wrapped_secret_id()), tmp_path, identity)
    await vault.read("ssh", "sw-7")
    token = vault._token
    assert token is not None and bao.token_alive(token)
    await vault.close()
    assert not bao.token_alive(token)


async def test_the_token_is_renewed_before_it_expires_and_replaced_at_its_maximum_ttl(
    bao: OpenBao, identity: ec.EllipticCurvePrivateKey, tmp_path: Path
) -> None:
    role_id = bao.approle(ttl="3s", max_ttl="7s")
    vault = _vault(_settings(bao, identity, role_id, bao.wrapped_secret_id()), tmp_path, identity)
    stopping = asyncio.Event()
    fresh = asyncio.create_task(vault.keep_fresh(stopping))
    try:
        await asyncio.sleep(0.5)
        first = vault._token
        assert first is not None and vault.logins == 1
        await asyncio.sleep(3.5)  # past the first TTL: renewed, not logged in again
        assert vault.renewals >= 1 and vault.logins == 1 and vault._token == first
        assert await vault.read("ssh", "sw-7") == DEVICE
        await asyncio.sleep(5)  # past the maximum TTL: a new login, the old token revoked
        assert vault.logins >= 2 and vault._token != first
        assert not bao.token_alive(first)
        assert await vault.read("ssh", "sw-7") == DEVICE
    finally:
        stopping.set()
        await fresh
        await vault.close()


async def test_a_plain_secret_id_where_the_integration_does_not_wrap(
    bao: OpenBao, identity: ec.EllipticCurvePrivateKey, tmp_path: Path
) -> None:
    settings = _settings(bao, identity, bao.approle(), bao.secret_id(), delivery="plain")
    vault = _vault(settings, tmp_path, identity)
    assert await vault.read("ssh", "sw-7") == DEVICE
    await vault.close()


async def _code(vault: ExternalVault, provider: str = "ssh", ref: str = "sw-7") -> str:
    with pytest.raises(VaultError) as caught:
        await vault.read(provider, ref)
    await vault.close()
    return caught.value.code


async def test_an_expired_wrapping_token_fails_with_its_code(
    bao: OpenBao, identity: ec.EllipticCurvePrivateKey, tmp_path: Path
) -> None:
    wrapped = bao.wrapped_secret_id(wrap_ttl="1s")
    await asyncio.sleep(2.5)
    vault = _vault(_settings(bao, identity, bao.approle(), wrapped), tmp_path, identity)
    assert await _code(vault) == "vault_secret_id_unwrap_failed"
    assert not (tmp_path / SECRET_FILE).exists()


async def test_a_wrapping_token_someone_else_unwrapped_first_fails(
    bao: OpenBao, identity: ec.EllipticCurvePrivateKey, tmp_path: Path
) -> None:
    wrapped = bao.wrapped_secret_id()
    bao.root.sys.unwrap(wrapped)  # intercepted on the way: the collector must notice
    vault = _vault(_settings(bao, identity, bao.approle(), wrapped), tmp_path, identity)
    assert await _code(vault) == "vault_secret_id_unwrap_failed"


async def test_a_wrapping_token_that_wraps_something_else_is_refused(
    bao: OpenBao, identity: ec.EllipticCurvePrivateKey, tmp_path: Path
) -> None:
    other = bao.root.adapter.request("GET", "/v1/secret/data/versus/ssh/sw-7", wrap_ttl="60s")
    vault = _vault(_settings(bao, identity, bao.approle(), other["wrap_info"]["token"]), tmp_path, identity)
    assert await _code(vault) == "vault_secret_id_wrong_origin"


async def test_a_secret_sealed_for_another_collector_or_version_does_not_open(
    bao: OpenBao, identity: ec.EllipticCurvePrivateKey, tmp_path: Path
) -> None:
    stranger = ec.generate_private_key(ec.SECP256R1())
    settings = _settings(bao, stranger, bao.approle(), bao.wrapped_secret_id())
    assert await _code(_vault(settings, tmp_path / "a", identity)) == "vault_secret_id_invalid"
    good = _settings(bao, identity, bao.approle(), bao.wrapped_secret_id(), version=2)
    replayed = VaultSettings(**{**good.__dict__, "secret": {**dict(good.secret or {}), "version": 3}})
    assert await _code(_vault(replayed, tmp_path / "b", identity)) == "vault_secret_id_invalid"


async def test_a_revoked_secret_id_fails_the_login(
    bao: OpenBao, identity: ec.EllipticCurvePrivateKey, tmp_path: Path
) -> None:
    secret = bao.secret_id()
    bao.root.auth.approle.destroy_secret_id("versus-collector", secret)
    vault = _vault(_settings(bao, identity, bao.approle(), secret, delivery="plain"), tmp_path, identity)
    assert await _code(vault) == "vault_login_failed"


async def test_a_path_outside_the_policy_is_denied_and_a_bad_reference_never_reaches_vault(
    bao: OpenBao, identity: ec.EllipticCurvePrivateKey, tmp_path: Path
) -> None:
    plain = _settings(bao, identity, bao.approle(), bao.secret_id(), delivery="plain")
    vault = VaultSettings(**{**plain.__dict__, "path_prefix": "elsewhere"})
    assert await _code(_vault(vault, tmp_path / "a", identity)) == "vault_permission_denied"
    good = _settings(bao, identity, bao.approle(), bao.secret_id(), delivery="plain")
    assert await _code(_vault(good, tmp_path / "b", identity), ref="../../sys/x") == "vault_path_invalid"


async def test_a_vault_whose_certificate_is_not_trusted_fails_with_its_code(
    bao: OpenBao, identity: ec.EllipticCurvePrivateKey, tmp_path: Path
) -> None:
    other, _ = pki.self_signed_ca("Not the Vault's CA", dt.timedelta(days=1), dt.datetime.now(dt.UTC))
    stranger = pki.cert_pem(other).decode()
    settings = _settings(bao, identity, bao.approle(), bao.secret_id(), delivery="plain", ca_pem=stranger)
    assert await _code(_vault(settings, tmp_path, identity)) == "vault_tls_invalid"


async def test_a_vault_that_is_down_fails_with_its_code(
    identity: ec.EllipticCurvePrivateKey, tmp_path: Path
) -> None:
    with openbao(tmp_path / "bao") as down:
        settings = _settings(down, identity, down.approle(), down.secret_id(), delivery="plain")
        down.stop()
        assert await _code(_vault(settings, tmp_path / "state", identity)) == "vault_unreachable"


def test_only_the_secret_version_of_the_settings_decides_a_restart(
    bao: OpenBao, identity: ec.EllipticCurvePrivateKey
) -> None:
    def vault(version: int) -> dict[str, object]:
        secret = for_collector(identity.public_key(), COLLECTOR, version, "wrapped", "hvs.same-token")
        return {"integration_id": "vi_1", "address": bao.address, "secret": secret}

    assert settings_key(vault(1)) == settings_key(vault(1))  # re-sealed for each delivery
    assert settings_key(vault(1)) != settings_key(vault(2))
