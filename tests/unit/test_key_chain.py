"""Key set rotation chains: what a collector accepts, and how the key store writes them."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest

from common.errors import FailedPrecondition
from common.trust import b64url, key_chain
from common.trust.key_chain import ChainError, HeldSet
from common.trust.keys import KeyPurpose, SigningKey
from common.trust.keystore import KeyStore

NOW = 1_800_000_000
D = KeyPurpose.DISPATCH


def _key() -> SigningKey:
    return SigningKey.generate(D, NOW)


def _held(*keys: SigningKey, version: int = 1) -> HeldSet:
    return HeldSet(D, version, 1, {k.kid: k.public for k in keys})


def _step(
    version: int, members: list[SigningKey], signers: list[SigningKey], **change: Any
) -> dict[str, Any]:
    step = key_chain.sign_step(D, version, 1, [k.public for k in members], signers, NOW)
    if change:
        payload = json.loads(b64url.decode(step["payload"]))
        payload.update(change)
        step["payload"] = b64url.encode(json.dumps(payload).encode())
    return step


def test_a_collector_walks_several_missed_rotations_to_the_newest_set() -> None:
    a, b, c = _key(), _key(), _key()
    steps = [_step(2, [a, b], [a, b]), _step(3, [b, c], [a, b, c]), _step(4, [c], [b, c])]
    reached, error = key_chain.walk(_held(a), steps)
    assert error is None
    assert (reached.version, set(reached.keys)) == (4, {c.kid})


@pytest.mark.parametrize(
    ("make", "code"),
    [
        (lambda a, b: _step(3, [a, b], [a, b]), "key_set_out_of_order"),
        (lambda a, b: _step(2, [b], [b]), "key_set_not_authorized"),
        (lambda a, b: _step(2, [b], [a]), "key_set_unproven"),
        (lambda a, b: _step(2, [a, b], [a, b], purpose="release"), "key_set_wrong_purpose"),
        (lambda a, b: _step(2, [a, b], [a, b], keys=[]), "key_set_malformed"),
        (lambda a, b: {"payload": "!!", "signatures": []}, "key_set_malformed"),
        (lambda a, b: "not a step", "key_set_malformed"),
    ],
)
def test_a_step_that_does_not_chain_is_refused(make: Any, code: str) -> None:
    a, b = _key(), _key()
    with pytest.raises(ChainError) as refused:
        key_chain.verify_step(_held(a), make(a, b))
    assert refused.value.code == code


def test_an_altered_step_does_not_verify_and_the_walk_keeps_the_last_good_set() -> None:
    a, b, c = _key(), _key(), _key()
    good = _step(2, [a, b], [a, b])
    # A proxy swaps in its own key under the old signatures.
    forged = _step(3, [b, c], [a, b, c], keys=[c.public.to_json()])
    reached, error = key_chain.walk(_held(a), [good, forged])
    assert reached.version == 2 and set(reached.keys) == {a.kid, b.kid}
    assert error is not None and error.code == "key_set_not_authorized"


def test_the_store_publishes_each_rotation_and_a_new_key_signs_only_after_its_grace(tmp_path: Path) -> None:
    store = KeyStore(tmp_path, D)
    first = store.load_or_create(NOW)
    enrolled = store.held_set(NOW)
    rotated = store.rotate(NOW, grace_s=3600)
    assert rotated.version == 2 and rotated.current_kid == first.current_kid  # still the old key
    assert store.load(NOW + 3599).current_kid == first.current_kid
    new_kid = store.load(NOW + 3600).current_kid
    assert new_kid != first.current_kid and store.pending_activation() == NOW + 3600
    store.rotate(NOW + 10, dt.timedelta(days=30), grace_s=0)
    assert store.version() == 3 and store.chain(3) == []
    reached, error = key_chain.walk(enrolled, store.chain(enrolled.version))
    assert error is None and reached.version == 3
    assert set(reached.keys) == {k.kid for k in store.load(NOW + 10).keys}


def test_retiring_publishes_a_version_without_the_key_and_never_the_signing_one(tmp_path: Path) -> None:
    store = KeyStore(tmp_path, D)
    old = store.load_or_create(NOW).current_kid
    enrolled = store.held_set(NOW)
    store.rotate(NOW, grace_s=0)
    with pytest.raises(FailedPrecondition) as refused:
        store.retire(store.load(NOW).current_kid, NOW)
    assert refused.value.code == "key_is_current"
    retired = store.retire(old, NOW)
    assert retired.version == 3 and old not in {k.kid for k in retired.keys}
    reached, error = key_chain.walk(enrolled, store.chain(1))
    assert error is None and old not in reached.keys and reached.version == 3
