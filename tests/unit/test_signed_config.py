"""Signed documents (config, tunnel offers): what a collector accepts, fed values directly."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from collector.signed_config import ConfigStore, OfferCheck
from common.trust import b64url, signed_doc
from common.trust.keys import KeyPurpose, KeySet, trusted
from common.trust.signed_doc import DocumentError
from router.trust import collector_docs

NOW = 1_800_000_000
KEYS = KeySet.create(KeyPurpose.DISPATCH, NOW - 60)
OTHER = KeySet.create(KeyPurpose.DISPATCH, NOW - 60)
TRUSTED = trusted(KEYS.public_keys(NOW))
ROW = {"config_version": 1, "vault_mode": "external", "vault_integration_id": "vi_1",
       "address": "https://vault:8200", "role_id": "r", "kv_mount": "kv", "path_prefix": "versus",
       "ca_pem": None, "secret_id_delivery": "wrapped"}  # fmt: skip


def _config(version: int = 1, now: int = NOW, keys: KeySet = KEYS, **change: Any) -> dict[str, str]:
    payload = {**collector_docs.config_payload("c1", {**ROW, "config_version": version}, now), **change}
    return signed_doc.sign(keys.current, payload)


def _code(call: Any) -> str:
    with pytest.raises(DocumentError) as refused:
        call()
    return refused.value.code


def test_a_config_is_accepted_once_and_only_newer_ones_after_it(tmp_path: Path) -> None:
    store = ConfigStore(tmp_path / "config.json", "c1", TRUSTED)
    assert store.version == 0
    payload = store.accept(_config(1), NOW)
    assert (payload["vault_mode"], payload["vault"]["address"], store.version) == (
        "external",
        "https://vault:8200",
        1,
    )
    assert _code(lambda: store.accept(_config(1), NOW)) == "config_version_not_newer"
    store.accept(_config(3), NOW)
    assert _code(lambda: store.accept(_config(2), NOW)) == "config_version_not_newer"
    # The held document survives a restart, and is the one on disk.
    assert ConfigStore(tmp_path / "config.json", "c1", TRUSTED).version == 3


@pytest.mark.parametrize(
    ("document", "code"),
    [
        (_config(2, keys=OTHER), "unknown_kid"),
        (_config(2, now=NOW - collector_docs.CONFIG_LIFETIME_S - 1), "expired"),
        (_config(2, now=NOW + 600), "not_yet_valid"),
        (_config(2, collector_id="c2"), "wrong_collector"),
        (_config(2, type="tunnel_offer"), "wrong_type"),
        (
            signed_doc.sign(KEYS.current, {**collector_docs.config_payload("c1", ROW, NOW), "version": 0}),
            "document_malformed",
        ),
        (_config(2, vault_mode="anything"), "document_malformed"),
        ({"kid": KEYS.current_kid, "payload": "e30", "sig": "AAAA"}, "bad_signature"),
        ("not an object", "document_malformed"),
    ],
)
def test_a_bad_config_is_refused_and_the_last_good_one_kept(tmp_path: Path, document: Any, code: str) -> None:
    store = ConfigStore(tmp_path / "config.json", "c1", TRUSTED)
    store.accept(_config(1), NOW)
    held = (tmp_path / "config.json").read_bytes()
    assert _code(lambda: store.accept(document, NOW)) == code
    assert store.version == 1 and (tmp_path / "config.json").read_bytes() == held


def test_an_altered_payload_does_not_verify(tmp_path: Path) -> None:
    document = _config(2)
    payload = json.loads(b64url.decode(document["payload"]))
    payload["vault"]["address"] = "https://evil:8200"
    forged = {**document, "payload": b64url.encode(json.dumps(payload).encode())}
    assert (
        _code(lambda: ConfigStore(tmp_path / "config.json", "c1", TRUSTED).accept(forged, NOW))
        == "bad_signature"
    )


def test_an_edited_config_file_stops_the_collector_at_start(tmp_path: Path) -> None:
    ConfigStore(tmp_path / "config.json", "c1", TRUSTED).accept(_config(1), NOW)
    document = json.loads((tmp_path / "config.json").read_text())
    document["sig"] = document["sig"][:-4] + "AAAA"
    (tmp_path / "config.json").write_text(json.dumps(document))
    assert _code(lambda: ConfigStore(tmp_path / "config.json", "c1", TRUSTED)) == "bad_signature"


def _offer(session: str = "tun-1", now: int = NOW, **change: Any) -> dict[str, Any]:
    outer = {"type": "tunnel", "session_id": session, "host": "10.0.0.7", "port": 22}
    payload = {**collector_docs.offer_payload("c1", outer, now), **change}
    return {**outer, "signed": signed_doc.sign(KEYS.current, payload)}


def test_an_offer_is_taken_from_its_signed_payload_and_only_once() -> None:
    check = OfferCheck("c1", TRUSTED)
    # A proxy rewrote the visible host: the collector dials what was signed.
    assert check.accept({**_offer(), "host": "10.9.9.9"}, NOW) == {
        "type": "tunnel", "session_id": "tun-1", "host": "10.0.0.7", "port": 22,
    }  # fmt: skip
    assert _code(lambda: check.accept(_offer(), NOW)) == "offer_replayed"
    assert _code(lambda: check.accept({"type": "tunnel", "session_id": "tun-2"}, NOW)) == "document_malformed"
    late = _offer("tun-3", now=NOW - collector_docs.OFFER_LIFETIME_S - 1)
    assert _code(lambda: check.accept(late, NOW)) == "expired"
    assert _code(lambda: check.accept(_offer("tun-4", collector_id="c2"), NOW)) == "wrong_collector"
