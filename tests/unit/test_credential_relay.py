"""Vault mode B in flight: a credential relayed to one collector for one dispatch (docs/vault.md)."""

from __future__ import annotations

import json

import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from common.trust import b64url
from common.trust.credential_relay import RelayError, open_for, seal_for
from router.dispatch import placement
from router.dispatch.placement import Candidate, OperationCap, PlacementRequest, ProviderCap

VALUE = {"username": "netops", "password": "hunter2-very-secret"}


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def test_only_the_collector_it_was_sealed_for_opens_it_and_only_for_that_dispatch() -> None:
    mine = _key()
    payload = seal_for(mine.public_key(), "col-1", "dsp-1", "ssh:sw-1", VALUE)
    assert "hunter2" not in json.dumps(payload) and "netops" not in json.dumps(payload)
    assert open_for(mine, "col-1", "dsp-1", payload) == VALUE
    refusals = [
        (mine, "col-1", "dsp-2", payload),  # relayed for another dispatch
        (_key(), "col-1", "dsp-1", payload),  # another collector's key
        (mine, "col-2", "dsp-1", payload),  # presented as another collector's
        (mine, "col-1", "dsp-1", {**payload, "credential_ref": "ssh:sw-2"}),  # moved to another device
        (mine, "col-1", "dsp-1", {**payload, "dispatch_id": "dsp-2"}),
        (mine, "col-1", "dsp-1", {k: v for k, v in payload.items() if k != "epk"}),
    ]
    flipped = bytearray(b64url.decode(payload["ciphertext"]))
    flipped[0] ^= 1
    refusals.append((mine, "col-1", "dsp-1", {**payload, "ciphertext": b64url.encode(bytes(flipped))}))
    for key, collector, dispatch, doc in refusals:
        with pytest.raises(RelayError) as refused:
            open_for(key, collector, dispatch, doc)
        assert refused.value.code == "credential_relay_invalid"


def _cand(cid: str, version: int, relayed: bool) -> Candidate:
    return Candidate(
        cid, "s1", "t1", active=True, draining=False, live=True, fips=False,
        providers={"ssh": ProviderCap(4, {"show": OperationCap("read")})}, protocol=version, relayed=relayed,
    )  # fmt: skip


def test_a_collector_in_mode_b_takes_work_only_at_the_relay_floor() -> None:
    req = PlacementRequest("ssh", "show", "read", "s1", "t1", "sw-1")
    old_b, new_b, old_a = _cand("old-b", 5, True), _cand("new-b", 6, True), _cand("old-a", 1, False)
    assert {c.collector_id for c in placement.eligible(req, [old_b, new_b, old_a])} == {"new-b", "old-a"}
    assert placement.shortfall(req, [old_b]) == "needs protocol ≥ 6 for relayed_credentials"
    assert placement.shortfall(req, [old_b, old_a]) is None
