"""The enrollment service against real PostgreSQL: redemption, limits, retries, approval, renewal."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from cryptography import x509
from sqlalchemy import select

from common.db import engine as db_engine
from common.db.schema import audit_events, collectors, enrollment_tokens
from common.errors import Conflict, FailedPrecondition, InvalidArgument, NotFound, VersusError
from common.trust import pki
from common.trust.ca_store import CaStore
from common.trust.keys import KeyPurpose, KeySet
from common.trust.pki import BACKDATE, spki_pin
from common.trust.trust_bundle import BundleSource
from enrollment.authority import Authority
from enrollment.ca import LEAF_LIFETIME
from enrollment.service import CollectorInfo, EnrollmentConfig, EnrollmentService, InvalidToken
from enrollment.store import EnrollmentStore
from tests.support.pki import csr_pem, p256, p384, rsa_key, tamper_signature

pytestmark = pytest.mark.timeout(120)

NOW = int(dt.datetime.now(dt.UTC).timestamp())
DISPATCH = KeySet.create(KeyPurpose.DISPATCH, NOW)
RELEASE = KeySet.create(KeyPurpose.RELEASE, NOW)


@pytest.fixture
async def service(database_url: str, tmp_path: Path) -> AsyncIterator[EnrollmentService]:
    engine = db_engine.create_async(database_url, pool_size=20, max_overflow=40)
    config = EnrollmentConfig(
        trust_domain="test.versus",
        public_url="https://gw.test:8443",
        gateway_addrs=("gw.test:8443",),
        gateway_server_name="gw.test",
    )
    yield EnrollmentService(
        EnrollmentStore(engine),
        Authority.from_source(BundleSource(CaStore(tmp_path), check_interval_s=0)),
        lambda: DISPATCH,
        lambda: RELEASE,
        config,
    )
    await engine.dispose()


async def _site(service: EnrollmentService) -> str:
    return (await service.create_site("dc1-mgmt-vrf", "tenant-1", "manual", None)).site_id


async def _uses(service: EnrollmentService, token_id: str) -> int:
    async with service.store.engine.connect() as conn:
        result = await conn.execute(
            select(enrollment_tokens.c.uses).where(enrollment_tokens.c.token_id == token_id)
        )
        return int(result.scalar_one())


@pytest.mark.parametrize("max_uses", [1, 5])
async def test_concurrent_redemptions_never_exceed_max_uses(
    service: EnrollmentService, max_uses: int
) -> None:
    issued = await service.issue_token(
        await _site(service), max_uses=max_uses, ttl_seconds=600, approval_mode="auto"
    )
    csrs = [csr_pem(p256(), f"col-{i:02d}") for i in range(50)]

    async def attempt(csr: str) -> str:
        try:
            return (await service.enroll(issued.plaintext, csr, CollectorInfo())).collector_id
        except InvalidToken:
            return "refused"

    outcomes = await asyncio.gather(*(attempt(c) for c in csrs))
    enrolled = [o for o in outcomes if o != "refused"]
    assert len(enrolled) == max_uses
    assert len(set(enrolled)) == max_uses
    assert await _uses(service, issued.token.token_id) == max_uses


async def test_bootstrap_contents(service: EnrollmentService, tmp_path: Path) -> None:
    site_id = await _site(service)
    issued = await service.issue_token(site_id, max_uses=1, ttl_seconds=None, approval_mode="auto")
    assert issued.plaintext.startswith("vst_")
    before = dt.datetime.now(dt.UTC).replace(microsecond=0)
    pin = spki_pin(CaStore(tmp_path).load().active_entry("gateway").cert)
    assert issued.enroll_command == (
        f"versus-collector enroll --url https://gw.test:8443 --ca-pin {pin} --token-file -"
    )
    result = await service.enroll(issued.plaintext, csr_pem(p256(), "col-a"), CollectorInfo(hostname="h1"))
    assert (result.collector_id, result.status, result.site_id) == ("col-a", "active", site_id)
    assert result.dispatch_keys == [k.to_json() for k in DISPATCH.public_keys(NOW)]
    assert result.release_keys == [k.to_json() for k in RELEASE.public_keys(NOW)]
    assert result.dispatch_keys != result.release_keys
    async with service.store.engine.connect() as conn:  # recorded: the router signs only with these
        held = (
            await conn.execute(select(collectors.c.dispatch_kids).where(collectors.c.collector_id == "col-a"))
        ).scalar_one()
    assert held == [k["kid"] for k in result.dispatch_keys]
    assert (result.auth_mode, result.audience) == ("bearer", "versus-collector-gateway")
    leaf, ca = x509.load_pem_x509_certificates(result.cert_chain_pem.encode())
    leaf.verify_directly_issued_by(ca)
    assert leaf.not_valid_after_utc - leaf.not_valid_before_utc == LEAF_LIFETIME + BACKDATE
    # 90 days from issue, opening a few minutes early for collector clocks that run behind.
    after = dt.datetime.now(dt.UTC)
    assert before - BACKDATE <= leaf.not_valid_before_utc <= after - BACKDATE
    assert before + LEAF_LIFETIME <= leaf.not_valid_after_utc <= after + LEAF_LIFETIME
    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.UniformResourceIdentifier) == [
        f"spiffe://test.versus/site/{site_id}/collector/col-a"
    ]
    assert leaf.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False


async def test_csr_asking_for_ca_gets_a_leaf(service: EnrollmentService) -> None:
    issued = await service.issue_token(
        await _site(service), max_uses=1, ttl_seconds=None, approval_mode="auto"
    )
    result = await service.enroll(
        issued.plaintext, csr_pem(p256(), "col-ca", ask_for_ca=True), CollectorInfo()
    )
    leaf = x509.load_pem_x509_certificates(result.cert_chain_pem.encode())[0]
    assert leaf.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False


async def test_token_failures_are_indistinguishable_and_consume_nothing(service: EnrollmentService) -> None:
    site_id = await _site(service)
    good = await service.issue_token(site_id, max_uses=2, ttl_seconds=600, approval_mode="auto")
    revoked = await service.issue_token(site_id, max_uses=1, ttl_seconds=600, approval_mode="auto")
    await service.store.revoke_token(revoked.token.token_id, "test")
    expired = await service.issue_token(site_id, max_uses=1, ttl_seconds=600, approval_mode="auto")
    service.clock = lambda: dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    messages = set()
    for token in (
        "vst_unknownunknownunknownunknownunknownunknow",
        "garbage",
        "",
        revoked.plaintext,
        expired.plaintext,
    ):
        with pytest.raises(InvalidToken) as info:
            await service.enroll(token, csr_pem(p256(), "col-x"), CollectorInfo())
        messages.add((info.value.code, info.value.message))
    assert messages == {("invalid_token", "the enrollment token is not valid")}
    service.clock = lambda: dt.datetime.now(dt.UTC)
    assert await _uses(service, good.token.token_id) == 0


async def test_refused_redemptions_of_known_tokens_are_audited_without_the_secret(
    service: EnrollmentService,
) -> None:
    # Seed 003: a token that leaked and was replayed after it was used up must show up for operators.
    site_id = await _site(service)
    spent = await service.issue_token(site_id, max_uses=1, ttl_seconds=600, approval_mode="auto")
    await service.enroll(spent.plaintext, csr_pem(p256(), "col-first"), CollectorInfo())
    revoked = await service.issue_token(site_id, max_uses=1, ttl_seconds=600, approval_mode="auto")
    await service.store.revoke_token(revoked.token.token_id, "test")
    for token, name in ((spent.plaintext, "col-replay"), (revoked.plaintext, "col-late"),
                        ("vst_unknownunknownunknownunknownunknownunknow", "col-guess")):  # fmt: skip
        with pytest.raises(InvalidToken):
            await service.enroll(token, csr_pem(p256(), name), CollectorInfo())
    async with service.store.engine.connect() as conn:
        rows = (
            await conn.execute(
                select(audit_events.c.subject_id, audit_events.c.details, audit_events.c.actor).where(
                    audit_events.c.action == "token.redeem_refused"
                )
            )
        ).all()
    assert sorted(
        (r.subject_id, r.details["reason"], r.details["requested_collector_id"]) for r in rows
    ) == sorted(
        [(spent.token.token_id, "exhausted", "col-replay"), (revoked.token.token_id, "revoked", "col-late")]
    )  # an unknown token has no row to name: nothing is recorded
    assert all(spent.plaintext not in str(r.details) and r.actor == "anonymous" for r in rows)


@pytest.mark.parametrize(
    ("make_csr", "code"),
    [
        (lambda: "not a csr", "csr_invalid"),
        (lambda: tamper_signature(csr_pem(p256(), "col-bad")), "csr_signature_invalid"),
        (lambda: csr_pem(rsa_key(), "col-rsa"), "csr_key_unsupported"),
        (lambda: csr_pem(p384(), "col-384"), "csr_key_unsupported"),
        (lambda: csr_pem(p256(), None), "csr_cn_missing"),
        (lambda: csr_pem(p256(), "bad/cn with spaces"), "csr_cn_invalid"),
        # X.509 caps a CN at 64 characters: 65 and 128 are refused, not a 500 at signing time.
        (lambda: csr_pem(p256(), "c" * 65), "csr_cn_invalid"),
        (lambda: csr_pem(p256(), "c" * 128), "csr_cn_invalid"),
    ],
)
async def test_bad_csrs_are_refused_without_consuming(
    service: EnrollmentService, make_csr: Callable[[], str], code: str
) -> None:
    issued = await service.issue_token(
        await _site(service), max_uses=1, ttl_seconds=600, approval_mode="auto"
    )
    with pytest.raises(InvalidArgument) as info:
        await service.enroll(issued.plaintext, make_csr(), CollectorInfo())
    assert info.value.code == code
    assert await _uses(service, issued.token.token_id) == 0


async def test_cn_collision_and_lost_response_retry(service: EnrollmentService) -> None:
    site_id = await _site(service)
    issued = await service.issue_token(site_id, max_uses=2, ttl_seconds=600, approval_mode="auto")
    key = p256()
    first = await service.enroll(issued.plaintext, csr_pem(key, "col-r"), CollectorInfo())
    assert await _uses(service, issued.token.token_id) == 1
    # Same token, same key: the identical identity and certificate, nothing consumed.
    again = await service.enroll(issued.plaintext, csr_pem(key, "col-r"), CollectorInfo())
    assert again.cert_chain_pem == first.cert_chain_pem
    assert await _uses(service, issued.token.token_id) == 1
    # Same CN, different key: refused, nothing consumed.
    with pytest.raises(Conflict) as info:
        await service.enroll(issued.plaintext, csr_pem(p256(), "col-r"), CollectorInfo())
    assert info.value.code == "collector_id_taken"
    assert await _uses(service, issued.token.token_id) == 1


async def test_retry_works_after_a_one_use_token_is_spent(service: EnrollmentService) -> None:
    issued = await service.issue_token(
        await _site(service), max_uses=1, ttl_seconds=600, approval_mode="auto"
    )
    key = p256()
    first = await service.enroll(issued.plaintext, csr_pem(key, "col-once"), CollectorInfo())
    again = await service.enroll(issued.plaintext, csr_pem(key, "col-once"), CollectorInfo())
    assert again.cert_chain_pem == first.cert_chain_pem
    with pytest.raises(InvalidToken):
        await service.enroll(issued.plaintext, csr_pem(p256(), "col-other"), CollectorInfo())
    # A spent token with a broken CSR still says only "invalid token".
    with pytest.raises(InvalidToken):
        await service.enroll(issued.plaintext, "not a csr", CollectorInfo())


async def test_manual_approval_flow(service: EnrollmentService) -> None:
    issued = await service.issue_token(
        await _site(service), max_uses=2, ttl_seconds=600, approval_mode="manual"
    )
    pending = await service.enroll(issued.plaintext, csr_pem(p256(), "col-p"), CollectorInfo())
    assert pending.status == "pending"
    assert (await service.status("col-p")).status == "pending"
    assert await service.approve("col-p", "alice") == "active"
    assert await service.approve("col-p", "alice") == "active"  # idempotent
    with pytest.raises(FailedPrecondition):
        await service.deny("col-p", "alice", "too late")
    await service.enroll(issued.plaintext, csr_pem(p256(), "col-d"), CollectorInfo())
    assert await service.deny("col-d", "bob", "unknown host") == "denied"
    with pytest.raises(NotFound):
        await service.approve("col-missing", "alice")
    async with service.store.engine.connect() as conn:
        actions = set((await conn.execute(select(audit_events.c.action))).scalars())
    assert {"token.issue", "collector.enroll", "collector.active", "collector.denied"} <= actions


async def test_revoking_a_token_can_revoke_what_it_enrolled(service: EnrollmentService) -> None:
    site_id = await _site(service)
    leaked = await service.issue_token(site_id, max_uses=3, ttl_seconds=600, approval_mode="auto")
    other = await service.issue_token(site_id, max_uses=1, ttl_seconds=600, approval_mode="auto")
    await service.enroll(leaked.plaintext, csr_pem(p256(), "col-l1"), CollectorInfo())
    await service.enroll(leaked.plaintext, csr_pem(p256(), "col-l2"), CollectorInfo())
    await service.enroll(other.plaintext, csr_pem(p256(), "col-o"), CollectorInfo())
    # A plain revoke stops further redemptions only: what it enrolled stays.
    _, revoked = await service.store.revoke_token(leaked.token.token_id, "alice")
    assert revoked == [] and (await service.status("col-l1")).status == "active"
    _, revoked = await service.store.revoke_token(leaked.token.token_id, "alice", with_collectors=True)
    assert revoked == ["col-l1", "col-l2"]
    assert [(await service.status(c)).status for c in ("col-l1", "col-l2", "col-o")] == [
        "revoked", "revoked", "active",
    ]  # fmt: skip
    _, again = await service.store.revoke_token(leaked.token.token_id, "alice", with_collectors=True)
    assert again == []  # idempotent
    async with service.store.engine.connect() as conn:
        audited = (
            await conn.execute(
                select(audit_events.c.subject_id).where(audit_events.c.action == "collector.revoked")
            )
        ).scalars()
        assert sorted(audited) == ["col-l1", "col-l2"]


async def test_renewal_with_new_key_and_wrong_cn(service: EnrollmentService) -> None:
    issued = await service.issue_token(
        await _site(service), max_uses=1, ttl_seconds=600, approval_mode="auto"
    )
    await service.enroll(issued.plaintext, csr_pem(p256(), "col-n"), CollectorInfo())
    new_key = p256()
    chain, _ = await service.renew("col-n", csr_pem(new_key, "col-n"))
    leaf = x509.load_pem_x509_certificates(chain.encode())[0]
    assert leaf.public_key() == new_key.public_key()
    assert (await service.status("col-n")).public_key_der == (
        await service.store.get_collector("col-n")
    ).public_key_der
    with pytest.raises(InvalidArgument, match="own id"):
        await service.renew("col-n", csr_pem(p256(), "col-someone-else"))


async def test_a_64_character_collector_id_enrolls(service: EnrollmentService) -> None:
    issued = await service.issue_token(
        await _site(service), max_uses=1, ttl_seconds=600, approval_mode="auto"
    )
    enrolled = await service.enroll(issued.plaintext, csr_pem(p256(), "c" * 64), CollectorInfo())
    assert enrolled.collector_id == "c" * 64


@pytest.mark.parametrize(
    ("kwargs", "code"),
    [
        ({"max_uses": 1001, "ttl_seconds": 60}, "max_uses_out_of_range"),
        ({"max_uses": 0, "ttl_seconds": 60}, "max_uses_out_of_range"),
        ({"max_uses": 1, "ttl_seconds": 24 * 3600 + 1}, "ttl_too_long"),
        ({"max_uses": 1, "ttl_seconds": 0}, "ttl_out_of_range"),
    ],
)
async def test_token_limits_are_refused_not_clamped(
    service: EnrollmentService, kwargs: dict[str, int], code: str
) -> None:
    with pytest.raises(InvalidArgument) as info:
        await service.issue_token(
            await _site(service),
            max_uses=kwargs["max_uses"],
            ttl_seconds=kwargs["ttl_seconds"],
            approval_mode="auto",
        )
    assert info.value.code == code


async def test_sites_lifecycle(service: EnrollmentService) -> None:
    site = await service.create_site("edge", "t1", "pinned", "1.4.2")
    assert (site.update_policy, site.pinned_version) == ("pinned", "1.4.2")
    with pytest.raises(Conflict):
        await service.create_site("edge", "t1", "manual", None)
    with pytest.raises(InvalidArgument, match="pinned_version"):
        await service.create_site("edge2", "t1", "pinned", None)
    updated = await service.update_site(site.site_id, name=None, update_policy="auto", pinned_version="")
    assert (updated.update_policy, updated.pinned_version) == ("auto", None)
    issued = await service.issue_token(site.site_id, max_uses=1, ttl_seconds=60, approval_mode="auto")
    await service.enroll(issued.plaintext, csr_pem(p256(), "col-s"), CollectorInfo())
    with pytest.raises(FailedPrecondition) as info:
        await service.store.delete_site(site.site_id)
    assert info.value.code == "site_has_collectors"
    empty = await service.create_site("empty", "t1", "manual", None)
    await service.store.delete_site(empty.site_id)
    with pytest.raises(NotFound):
        await service.store.get_site(empty.site_id)
    listed = await service.store.list_sites("t1", 10, "")
    assert [(s.name, s.collector_count) for s in listed] == [("edge", 1)]


def test_invalid_token_is_a_versus_error() -> None:
    assert isinstance(InvalidToken(), VersusError)


async def test_collector_ca_rotation_issues_under_the_new_ca_and_chains_end_in_the_issuer(
    service: EnrollmentService, tmp_path: Path
) -> None:
    store = CaStore(tmp_path)
    issued = await service.issue_token(
        await _site(service), max_uses=2, ttl_seconds=None, approval_mode="auto"
    )
    key = p256()
    first = await service.enroll(issued.plaintext, csr_pem(key, "col-rot"), CollectorInfo())
    old = store.load().active["collector"]
    assert first.trust_version == 1
    assert pki.issuer_id(x509.load_pem_x509_certificates(first.cert_chain_pem.encode())[0]) == old

    trust = store.rotate("collector")
    [new] = [e.ca_id for e in trust.cas["collector"] if e.ca_id != old]
    store.activate("collector", new)
    chain, _ = await service.renew("col-rot", csr_pem(key, "col-rot"))
    leaf, issuer = x509.load_pem_x509_certificates(chain.encode())
    leaf.verify_directly_issued_by(issuer)
    assert pki.issuer_id(leaf) == pki.ca_id(issuer) == new
    later = await service.enroll(issued.plaintext, csr_pem(p256(), "col-rot-2"), CollectorInfo())
    assert later.trust_version == 3
    bundle = {pki.ca_id(c) for c in x509.load_pem_x509_certificates(later.ca_bundle_pem.encode())}
    assert {old, new} <= bundle
