"""Enrollment metrics (Prometheus), on the enrollment service's metrics port (docs/operations.md).

Enrollments and renewals by result, refusals by their stable code (a bounded set: common/errors.py
codes the service raises), and the certificate authorities collectors trust, read from the trust
bundle at scrape time: how many of each kind (two while a rotation overlaps) and when the one that
issues now expires.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from cryptography import x509
from prometheus_client import Counter
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import REGISTRY, Collector

from common.trust import pki
from common.trust.pki import spki_pin
from common.trust.trust_bundle import Bundle

ENROLLMENTS = Counter(
    "versus_enrollment_enrollments_total",
    "Collectors enrolled, by the status they enrolled in (active, or pending an operator's approval).",
    ["status"],
)
REFUSALS = Counter(
    "versus_enrollment_refusals_total",
    "Enrollments and renewals refused, by call (enroll, renew) and stable error code.",
    ["call", "code"],
)
RENEWALS = Counter("versus_enrollment_renewals_total", "Collector certificates renewed.")


class AuthorityGauges(Collector):
    """The trust bundle's CAs as gauges, parsed once per bundle version."""

    def __init__(self, bundle: Callable[[], Bundle]):
        self._bundle = bundle
        self._seen: tuple[int, list[GaugeMetricFamily]] | None = None

    def collect(self) -> Iterator[GaugeMetricFamily]:
        bundle = self._bundle()
        if self._seen is None or self._seen[0] != bundle.version:
            self._seen = (bundle.version, _families(bundle))
        yield from self._seen[1]


def _families(bundle: Bundle) -> list[GaugeMetricFamily]:
    count = GaugeMetricFamily(
        "versus_ca_certificates", "CAs collectors trust, by kind (collector, gateway): 2 while a rotation "
        "overlaps.", labels=["ca"],
    )  # fmt: skip
    expiry = GaugeMetricFamily(
        "versus_ca_active_expiry_timestamp_seconds",
        "When the CA that issues now expires (Unix time), by kind.", labels=["ca"],
    )  # fmt: skip
    version = GaugeMetricFamily("versus_trust_bundle_version", "The trust bundle's version.")
    version.add_metric([], float(bundle.version))
    count.add_metric(["collector"], float(len(bundle.collector)))
    count.add_metric(["gateway"], float(len(bundle.gateway)))
    collector = [x509.load_pem_x509_certificate(p.encode()) for p in bundle.collector]
    gateway = [x509.load_pem_x509_certificate(p.encode()) for p in bundle.gateway]
    issuing = {
        "collector": [c for c in collector if pki.ca_id(c) == bundle.collector_active],
        "gateway": [c for c in gateway if spki_pin(c) == bundle.gateway_pin],
    }
    for kind, certs in issuing.items():
        for cert in certs[:1]:
            expiry.add_metric([kind], cert.not_valid_after_utc.timestamp())
    return [count, expiry, version]


def watch_authority(bundle: Callable[[], Bundle]) -> None:
    """Export the CAs of ``bundle()`` (once per process)."""
    REGISTRY.register(AuthorityGauges(bundle))
