"""The systemd units in deploy/: systemd accepts them, they are hardened, and they match the code."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from versus_cp.main import EXIT_CONFIG

pytestmark = pytest.mark.timeout(120)

UNITS = sorted((Path(__file__).resolve().parents[2] / "deploy" / "systemd").glob("*.service"))
# systemd-analyze's own scale: 0 (locked down) to 10 (exposed); below 2 is "OK".
MAX_EXPOSURE = 2.0


def _checkable(unit: Path, tmp_path: Path) -> Path:
    """The unit with its ExecStart pointing at an executable that exists here (verify checks it)."""
    copy = tmp_path / unit.name
    copy.write_text(unit.read_text().replace("/opt/versus/bin/versus-cp", "/bin/true"))
    return copy


def test_every_service_has_a_unit() -> None:
    assert [u.name for u in UNITS] == [
        f"versus-{name}.service" for name in ("console", "enrollment", "gateway", "migrate", "router")
    ]


@pytest.mark.parametrize("unit", UNITS, ids=lambda u: u.name)
def test_systemd_accepts_the_unit_and_rates_it_locked_down(unit: Path, tmp_path: Path) -> None:
    copy = _checkable(unit, tmp_path)
    verify = subprocess.run(
        ["systemd-analyze", "verify", str(copy)], capture_output=True, text=True, timeout=60, check=False
    )
    assert (verify.returncode, verify.stdout + verify.stderr) == (0, "")
    security = subprocess.run(
        ["systemd-analyze", "security", "--offline=true", str(copy)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    found = re.search(r"Overall exposure level for \S+: ([0-9.]+)", security.stdout)
    assert found, security.stdout + security.stderr
    assert float(found.group(1)) <= MAX_EXPOSURE


@pytest.mark.parametrize("unit", [u for u in UNITS if "migrate" not in u.name], ids=lambda u: u.name)
def test_a_long_running_service_reports_readiness_and_is_not_retried_on_a_refused_config(unit: Path) -> None:
    lines = unit.read_text().splitlines()
    assert "Type=notify" in lines
    assert f"RestartPreventExitStatus={EXIT_CONFIG}" in lines
    assert "After=network-online.target versus-migrate.service" in lines


def test_only_the_gateway_may_bind_a_low_port() -> None:
    for unit in UNITS:
        text = unit.read_text()
        if unit.name == "versus-gateway.service":
            assert "CapabilityBoundingSet=CAP_NET_BIND_SERVICE" in text
        else:
            assert "CapabilityBoundingSet=\n" in text and "AmbientCapabilities" not in text
