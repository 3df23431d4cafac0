"""A release's SBOM is checked before it is signed (router/releases/sbom.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from common.errors import InvalidArgument
from common.limits import MAX_SBOM_BYTES
from router.releases.sbom import check_sbom


def _document(version: str = "1.2.0", **changes: Any) -> dict[str, Any]:
    document: dict[str, Any] = {
        "bomFormat": "CycloneDX",
        "specVersion": "1.6",
        "version": 1,
        "metadata": {"component": {"type": "application", "name": "versus-collector", "version": version}},
        "components": [
            {"type": "library", "bom-ref": "pyjwt==2.15.1", "name": "PyJWT", "version": "2.15.1",
             "purl": "pkg:pypi/pyjwt@2.15.1", "licenses": [{"license": {"id": "MIT"}}],
             "hashes": [{"alg": "SHA-256", "content": "42" * 32}]},
            {"type": "library", "bom-ref": "tuf==7.0.1", "name": "tuf", "version": "7.0.1",
             "purl": "pkg:pypi/tuf@7.0.1"},
        ],
    }  # fmt: skip
    document.update(changes)
    return document


def _refusal(raw: bytes, version: str = "1.2.0") -> InvalidArgument:
    with pytest.raises(InvalidArgument) as refused:
        check_sbom(raw, version)
    return refused.value


def test_a_valid_sbom_of_this_release_is_accepted_as_sent() -> None:
    raw = json.dumps(_document()).encode()
    sbom = check_sbom(raw, "1.2.0")
    assert (sbom.document, sbom.spec_version, sbom.components) == (raw, "1.6", 2)
    assert len(sbom.sha256) == 64 and "document" not in repr(sbom)


@pytest.mark.parametrize(
    ("raw", "code", "says"),
    [
        (b"\xff\xfe not text", "sbom_invalid", "not JSON"),
        (b"[1, 2]", "sbom_invalid", "not a CycloneDX document"),
        (json.dumps(_document(bomFormat="SPDX")).encode(), "sbom_invalid", "not a CycloneDX document"),
        (json.dumps(_document(specVersion="0.9")).encode(), "sbom_invalid", "specVersion"),
        # A field the schema does not have, and a component without its required name.
        (json.dumps(_document(extra=1)).encode(), "sbom_invalid", "'extra' was unexpected"),
        (json.dumps(_document(components=[{"type": "library", "version": "1"}])).encode(), "sbom_invalid",
         "'name' is a required property at components/0"),
        (json.dumps(_document(version="1.1.0")).encode(), "sbom_component_mismatch",
         "versus-collector 1.1.0"),
        (json.dumps(_document(metadata={})).encode(), "sbom_component_mismatch", "describes ? ?"),
    ],
)  # fmt: skip
def test_an_sbom_that_is_not_this_releases_is_refused(raw: bytes, code: str, says: str) -> None:
    refused = _refusal(raw)
    assert refused.code == code and says in refused.message, refused.message
    assert len(refused.message) < 500  # the schema is not quoted back


def test_the_size_limit_is_checked_first() -> None:
    raw = json.dumps(_document(padding="x" * MAX_SBOM_BYTES)).encode()
    assert _refusal(raw).code == "sbom_too_large"
