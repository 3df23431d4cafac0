"""A collector release's SBOM, checked before it is signed into the update repository.

The SBOM is the CycloneDX JSON document ``make collector-release`` writes beside the PEX file
(tools/collector_dist.py). Publishing refuses one that is not what it claims to be: larger than
:data:`~common.limits.MAX_SBOM_BYTES`, not JSON, not valid against the CycloneDX schema of its
``specVersion`` (cyclonedx-python-lib's strict validator), or describing something other than
this release (its root component must be ``versus-collector`` at the release's version). The
bytes are kept as sent: the update repository signs their SHA-256.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from common.errors import InvalidArgument
from common.limits import MAX_SBOM_BYTES

COMPONENT = "versus-collector"
SPEC_VERSIONS = ("1.4", "1.5", "1.6", "1.7")


@dataclass(frozen=True, slots=True)
class Sbom:
    """A checked SBOM: its bytes as sent, their SHA-256, its spec version and component count."""

    document: bytes = field(repr=False)
    sha256: str
    spec_version: str
    components: int


def _invalid(message: str, code: str = "sbom_invalid") -> InvalidArgument:
    return InvalidArgument(message, code=code)


def check_sbom(raw: bytes, version: str) -> Sbom:
    """``raw`` as the SBOM of collector release ``version``, or :class:`InvalidArgument` saying why
    not (``sbom_too_large``, ``sbom_invalid``, ``sbom_component_mismatch``)."""
    if len(raw) > MAX_SBOM_BYTES:
        raise _invalid(f"the SBOM is over {MAX_SBOM_BYTES} bytes", "sbom_too_large")
    try:
        text = raw.decode("utf-8")
        document: Any = json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _invalid(f"the SBOM is not JSON ({exc})") from None
    if not isinstance(document, dict) or document.get("bomFormat") != "CycloneDX":
        raise _invalid('the SBOM is not a CycloneDX document (bomFormat must be "CycloneDX")')
    spec = document.get("specVersion")
    if spec not in SPEC_VERSIONS:
        raise _invalid(f"CycloneDX specVersion must be one of {', '.join(SPEC_VERSIONS)}, not {spec!r}")
    # Imported here: the validator's schema machinery takes most of a second to import, which
    # every router start would pay for a call made only when a release is published.
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    error = JsonStrictValidator(SchemaVersion.from_version(spec)).validate_str(text)
    if error is not None:
        # The error's own text quotes the whole schema: name only the rule and where it failed.
        detail = getattr(error, "data", None)
        where = "/".join(str(p) for p in getattr(detail, "absolute_path", [])) or "(the document)"
        message = getattr(detail, "message", "schema violation")[:300]
        raise _invalid(f"the SBOM is not valid CycloneDX {spec}: {message} at {where}")
    root = (document.get("metadata") or {}).get("component") or {}
    if root.get("name") != COMPONENT or root.get("version") != version:
        raise _invalid(
            f"the SBOM describes {root.get('name', '?')} {root.get('version', '?')}, "
            f"not {COMPONENT} {version}",
            "sbom_component_mismatch",
        )
    return Sbom(raw, hashlib.sha256(raw).hexdigest(), spec, len(document.get("components") or []))
