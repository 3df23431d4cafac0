"""The shipped alerting and recording rules (deploy/prometheus/) through Debian's promtool: valid,
and every alert fires on what should fire it and stays quiet on a healthy fleet (tests.yml)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PROMTOOL, *args], cwd=DEPLOY / "prometheus", capture_output=True, text=True, timeout=60
    )


def test_the_rules_are_valid() -> None:
    done = _promtool("check", "rules", "rules.yml")
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_passes_its_unit_tests() -> None:
    done = _promtool("test", "rules", "tests.yml")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout + done.stderr


def test_every_alert_is_tested_firing_and_quiet() -> None:
    rules = yaml.safe_load((DEPLOY / "prometheus" / "rules.yml").read_text())
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
    tests = yaml.safe_load((DEPLOY / "prometheus" / "tests.yml").read_text())["tests"]
    fired = {t["alertname"] for case in tests for t in case.get("alert_rule_test", []) if t["exp_alerts"]}
    quiet = {t["alertname"] for case in tests for t in case.get("alert_rule_test", []) if not t["exp_alerts"]}
    assert alerts == fired == quiet


def test_the_scrape_config_names_the_jobs_the_rules_expect() -> None:
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    jobs = {c["job_name"] for c in config["scrape_configs"]}
    assert jobs == {"versus-router", "versus-enrollment", "versus-gateway"}
    assert config["rule_files"] == ["rules.yml"]


@pytest.mark.parametrize("path", sorted((DEPLOY / "grafana").glob("*.json")), ids=lambda p: p.name)
def test_the_dashboard_reads_only_versus_series_and_prometheus_own(path: Path) -> None:
    dashboard = json.loads(path.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert exprs and all(isinstance(e, str) and e for e in exprs)
    for expr in exprs:
        names = set(re.findall(r"\b[a-z_][a-z0-9_:]*\b(?=\s*[{\[(]|\s*$|\s*\))", expr))
        assert any(n.startswith(("versus_", "versus:")) or n == "up" for n in names), expr
