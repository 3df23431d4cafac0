"""Pure parts of enrollment: token minting and limits, CSR validation, the Collector CA."""

from __future__ import annotations

import datetime as dt
import hashlib
from pathlib import Path

import pytest

from common.errors import ConfigError, InvalidArgument
from enrollment import tokens
from enrollment.ca import CollectorCA, spiffe_id, validate_csr
from tests.support.pki import csr_pem, p256

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def test_minted_tokens_are_prefixed_hashed_and_hidden() -> None:
    minted = tokens.mint()
    plaintext = minted.plaintext.reveal()
    assert plaintext.startswith("vst_") and len(plaintext) == 47
    assert minted.sha256 == hashlib.sha256(plaintext.encode()).digest()
    assert minted.display_prefix == plaintext[:10]
    assert plaintext not in repr(minted)
    assert tokens.mint().plaintext.reveal() != plaintext


@pytest.mark.parametrize(
    ("max_uses", "ttl", "expected"),
    [
        (None, None, (1, dt.timedelta(hours=1))),
        (5, 600, (5, dt.timedelta(minutes=10))),
        (1000, 86400, (1000, dt.timedelta(days=1))),
    ],
)
def test_issue_limits_defaults(
    max_uses: int | None, ttl: int | None, expected: tuple[int, dt.timedelta]
) -> None:
    assert tokens.issue_limits(max_uses, ttl) == expected


@pytest.mark.parametrize(
    ("max_uses", "ttl", "code"),
    [
        (1001, None, "max_uses_out_of_range"),
        (0, None, "max_uses_out_of_range"),
        (-1, None, "max_uses_out_of_range"),
        (1, 86401, "ttl_too_long"),
        (1, 0, "ttl_out_of_range"),
        (1, -5, "ttl_out_of_range"),
    ],
)
def test_issue_limits_refuse(max_uses: int, ttl: int, code: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        tokens.issue_limits(max_uses, ttl)
    assert info.value.code == code


def test_token_status_precedence() -> None:
    later = NOW + dt.timedelta(hours=1)
    assert tokens.status_of(uses=0, max_uses=1, expires_at=later, revoked_at=None, now=NOW) == "active"
    assert tokens.status_of(uses=1, max_uses=1, expires_at=later, revoked_at=None, now=NOW) == "exhausted"
    assert tokens.status_of(uses=1, max_uses=1, expires_at=NOW, revoked_at=None, now=NOW) == "expired"
    assert tokens.status_of(uses=0, max_uses=1, expires_at=later, revoked_at=NOW, now=NOW) == "revoked"


def test_shape_check_before_hashing() -> None:
    assert tokens.looks_like_token("vst_abc")
    assert not tokens.looks_like_token("ghp_abc")
    assert not tokens.looks_like_token("vst_" + "a" * 200)


def test_csr_validation_returns_key_and_id() -> None:
    key = p256()
    info = validate_csr(csr_pem(key, "col-1"))
    assert info.collector_id == "col-1"
    assert info.public_key == key.public_key()
    assert info.public_key_sha256 == hashlib.sha256(info.public_key_der).digest()


def test_ca_files_round_trip_and_mismatch(tmp_path: Path) -> None:
    ca = CollectorCA.load_or_create(tmp_path / "a")
    assert (tmp_path / "a" / "ca.key").stat().st_mode & 0o777 == 0o600
    assert "REDACTED" in repr(ca) and "PRIVATE" not in repr(ca)
    loaded = CollectorCA.from_files(tmp_path / "a" / "ca.pem", tmp_path / "a" / "ca.key")
    assert loaded.cert == ca.cert
    other = CollectorCA.load_or_create(tmp_path / "b")
    with pytest.raises(ConfigError, match="do not match"):
        CollectorCA.from_files(tmp_path / "a" / "ca.pem", tmp_path / "b" / "ca.key")
    assert other.cert != ca.cert
    with pytest.raises(ConfigError, match="cannot load"):
        CollectorCA.from_files(tmp_path / "missing.pem", tmp_path / "b" / "ca.key")


def test_spiffe_id() -> None:
    assert (
        spiffe_id("versus.internal", "site-1", "col-9")
        == "spiffe://versus.internal/site/site-1/collector/col-9"
    )
