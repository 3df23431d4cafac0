"""The collector's own ``/metrics``, on loopback only, when asked for (``--metrics-port``).

For a node agent or a local Prometheus on the collector's host: the collector exposes nothing to
its network (it only ever dials out), so the listener binds 127.0.0.1 whatever the host's
addresses. Every value is read from the running agent when scraped, on the listener's thread:
plain attributes and one small file (the certificate), never the journal's database, which
belongs to the agent's thread.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from cryptography import x509
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

HOST = "127.0.0.1"


class AgentGauges(Collector):
    """The agent's state as gauges."""

    def __init__(self, agent: Any):
        self.agent = agent

    def collect(self) -> Iterator[GaugeMetricFamily]:
        agent = self.agent
        info = GaugeMetricFamily(
            "versus_collector_info", "This collector: id, session, protocol, transport, vault mode (1).",
            labels=["collector_id", "session_id", "protocol", "transport", "vault_mode", "version"],
        )  # fmt: skip
        info.add_metric(
            [agent.collector_id, agent.session_id, str(agent.client.protocol), agent.client.transport,
             agent.vault_mode, agent.version],
            1.0,
        )  # fmt: skip
        yield info
        last = GaugeMetricFamily(
            "versus_collector_last_claim_timestamp_seconds", "When a claim was last answered (Unix time)."
        )
        last.add_metric([], agent.last_claim_at or float("nan"))
        yield last
        running = GaugeMetricFamily(
            "versus_collector_tasks_in_flight", "Tasks running now, by provider.", labels=["provider"]
        )
        for provider, count in dict(agent.in_flight).items():
            running.add_metric([provider], float(count))
        yield running
        held = GaugeMetricFamily(
            "versus_collector_tasks_held", "Tasks received and not yet reported, at the last claim."
        )
        held.add_metric([], float(agent.held_count))
        yield held
        cert = GaugeMetricFamily(
            "versus_collector_cert_expiry_timestamp_seconds", "When this collector's certificate expires."
        )
        try:
            pem = agent.paths.cert.read_bytes()
            cert.add_metric([], x509.load_pem_x509_certificate(pem).not_valid_after_utc.timestamp())
        except (OSError, ValueError):
            cert.add_metric([], float("nan"))
        yield cert
        scraped = GaugeMetricFamily("versus_collector_scrape_timestamp_seconds", "When this scrape was read.")
        scraped.add_metric([], time.time())
        yield scraped


def serve(agent: Any, port: int) -> int:
    """Start the loopback listener for ``agent`` on ``port`` (0: any free port); the port bound."""
    registry = CollectorRegistry()
    registry.register(AgentGauges(agent))
    server, _ = start_http_server(port, addr=HOST, registry=registry)
    return int(server.server_address[1])
