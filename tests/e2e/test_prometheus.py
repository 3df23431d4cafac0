"""The shipped rules and dashboard against a real Prometheus (Debian's) scraping a running control plane.

Prometheus runs with deploy/prometheus/prometheus.yml, only its targets and CA file replaced, and
rules.yml with the recording interval shortened. A collector enrolls and works (a read, a
reconcilable mutation the device will not confirm, a task nobody can take, a refused enrollment),
then every expression of every rule and every dashboard panel is asked of Prometheus's HTTP API:
each must answer without error, and every metric or recording rule it names must exist there.
"""

from __future__ import annotations

import json
import re
import shutil
import ssl
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from common.embedded.process import free_ports
from tests.e2e.collector_harness import Collector, Platform
from tests.e2e.harness import ControlPlane

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
JOBS = ("versus-router", "versus-enrollment", "versus-gateway")


def _config(cp: ControlPlane, where: Path) -> Path:
    """The shipped scrape configuration aimed at ``cp``, scraping every second."""
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    config["global"].update(scrape_interval="1s", evaluation_interval="1s")
    targets = {
        "versus-router": f"127.0.0.1:{cp.port('router_metrics')}",
        "versus-enrollment": f"127.0.0.1:{cp.port('enrollment_metrics')}",
        "versus-gateway": f"127.0.0.1:{cp.port('gateway')}",
    }
    for job in config["scrape_configs"]:
        job["static_configs"] = [{"targets": [targets[job["job_name"]]]}]
        if "tls_config" in job:
            job["tls_config"]["ca_file"] = str(cp.ca_file)
    rules = yaml.safe_load((DEPLOY / "prometheus" / "rules.yml").read_text())
    for group in rules["groups"]:
        group["interval"] = "1s"
    (where / "rules.yml").write_text(yaml.safe_dump(rules))
    (where / "prometheus.yml").write_text(yaml.safe_dump(config))
    return where / "prometheus.yml"


def _expressions() -> list[tuple[str, str]]:
    """(where, expression) of every rule and every dashboard panel target."""
    found = []
    rules = yaml.safe_load((DEPLOY / "prometheus" / "rules.yml").read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            found.append((rule.get("record") or rule["alert"], rule["expr"]))
    for path in sorted((DEPLOY / "grafana").glob("*.json")):
        for panel in json.loads(path.read_text())["panels"]:
            for target in panel.get("targets", []):
                found.append((f"{path.name}: {panel['title']}", target["expr"]))
    return found


# Series that exist only where a feature is configured, and where else they are checked.
CONFIGURED_ONLY = {
    # One per audit sink; the shared control plane has none (tests/e2e/test_audit_export.py reads it).
    "versus_audit_export_oldest_undelivered_age_seconds",
}


def _names(expr: str) -> set[str]:
    """The series an expression reads: our metrics and recording rules (label values and functions
    are not names of ours)."""
    without_strings = re.sub(r'"[^"]*"', '""', expr)
    return set(re.findall(r"\bversus[_:][a-z0-9_:]*[a-z0-9_]", without_strings))


def _query(client: httpx.Client, expr: str) -> dict[str, Any]:
    reply = client.get("/api/v1/query", params={"query": expr})
    body: dict[str, Any] = reply.json()
    return body


def _workload(cp: ControlPlane, tmp_path: Path) -> None:
    collector = Collector(cp, tmp_path / "watched", tmp_path / "watched.log")
    collector.enroll()
    platform = Platform(cp)
    try:
        collector.start()
        read = platform.submit(collector.site_id, "echo", "read", "dev-prom-r", {}, "prom-read")
        mutation = platform.submit(
            collector.site_id, "append", "mutate_reconcilable", "dev-prom-m",
            {"unclear": True, "check_error": True}, "prom-mutation",
        )  # fmt: skip
        # Nobody runs this provider: it stays queued, so the queue's gauges have a series.
        platform.submit(collector.site_id, "echo", "read", "dev-prom-q", {}, "prom-queued", provider="nobody")
        platform.wait_state(read, {"success"})
        platform.wait_state(mutation, {"indeterminate"}, timeout=60)
    finally:
        platform.close()
    # An enrollment refused (an unknown token), for the refusals counter.
    with httpx.Client(
        verify=ssl.create_default_context(cafile=cp.ca_file), base_url=cp.gateway_url
    ) as gateway:
        refused = gateway.post("/api/collector/v1/enroll", json={"token": "vst_" + "x" * 40, "csr_pem": _CSR})
        assert refused.status_code == 401, refused.text
    # The collector stays up (its claims, tunnel-free) while Prometheus scrapes: stopped at teardown.
    _COLLECTORS.append(collector)


_COLLECTORS: list[Collector] = []
_CSR = "-----BEGIN CERTIFICATE REQUEST-----\nMAo=\n-----END CERTIFICATE REQUEST-----\n"


@pytest.mark.timeout(150)
def test_every_rule_and_panel_answers_from_a_real_prometheus(
    shared_control_plane: ControlPlane, tmp_path: Path
) -> None:
    cp = shared_control_plane
    (port,) = free_ports(1)
    config = _config(cp, tmp_path)
    log = (tmp_path / "prometheus.log").open("wb")
    prometheus = subprocess.Popen(
        [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=1h"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
            # Every job's target up before the work, so the counters' increases are seen.
            deadline = time.monotonic() + 60
            up: dict[str, str] = {}
            while time.monotonic() < deadline:
                try:
                    # While it starts Prometheus answers 503 in plain text: not up yet either.
                    targets = client.get("/api/v1/targets").json()["data"]["activeTargets"]
                except (httpx.TransportError, ValueError, KeyError):
                    targets = []
                up = {t["labels"]["job"]: t["health"] for t in targets}
                if set(up) == set(JOBS) and set(up.values()) == {"up"}:
                    break
                time.sleep(0.5)
            assert up == dict.fromkeys(JOBS, "up"), (up, (tmp_path / "prometheus.log").read_text()[-3000:])
            _workload(cp, tmp_path)
            # The routers' next fleet sample (every 2 s here) after the work, then a few rule evaluations.
            done = time.time()
            deadline = time.monotonic() + 40
            while time.monotonic() < deadline:
                sampled = _query(client, "max(versus_fleet_sampled_timestamp_seconds)")["data"]["result"]
                if sampled and float(sampled[0]["value"][1]) > done:
                    break
                time.sleep(0.5)
            time.sleep(3)
            known = set(client.get("/api/v1/label/__name__/values").json()["data"])
            failures = []
            for where, expr in _expressions():
                answer = _query(client, expr)
                if answer.get("status") != "success":
                    failures.append(f"{where}: {expr!r} errs: {answer.get('error')}")
                missing = sorted(n for n in _names(expr) if n not in known and n not in CONFIGURED_ONLY)
                if missing:
                    failures.append(f"{where}: {expr!r} names what does not exist: {missing}")
            assert failures == [], "\n".join(failures)
            # And the recording rules hold what the fleet is: the collector is active in its site.
            site = _COLLECTORS[-1].site_id
            active = _query(client, f'versus:collectors:by_site_session{{site="{site}", session="active"}}')
            assert [float(r["value"][1]) for r in active["data"]["result"]] == [1.0], active
            queued = _query(client, f'versus:queue_depth:by_site{{site="{site}"}}')
            assert [float(r["value"][1]) for r in queued["data"]["result"]] == [1.0], queued
    finally:
        prometheus.terminate()
        prometheus.wait(timeout=10)
        log.close()
        while _COLLECTORS:
            _COLLECTORS.pop().stop()
