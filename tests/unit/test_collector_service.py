"""`versus-collector install-service` writes a unit systemd accepts without a warning (issue 20, item 5)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from collector.main import main
from collector.supervisor.service import UNIT_NAME, ServiceOptions, unit_text


def _verify(unit: Path) -> str:
    """``systemd-analyze verify``'s complaints about ``unit`` (it exits 0 on unknown keys, so the
    output is what counts)."""
    done = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60, check=False
    )
    return (
        f"exit {done.returncode}: {done.stdout}{done.stderr}"
        if done.returncode or done.stdout or done.stderr
        else ""
    )


def _executable(tmp_path: Path) -> Path:
    exe = tmp_path / "versus-collector"
    exe.write_text("#!/bin/sh\nexit 0\n")
    exe.chmod(0o755)
    return exe


def test_the_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    exe = _executable(tmp_path)
    url = "https://gw.example:8443/api/collector/v1/updates/metadata/"
    argv = ["install-service", "--executable", str(exe), "--unit-dir", str(tmp_path / "units"), "--no-enable",
            "--no-create-user", "--manifest-url", url, "--update-pubkey", "rel-1"]  # fmt: skip
    assert main(argv) == 0
    unit = tmp_path / "units" / UNIT_NAME
    text = unit.read_text()
    assert _verify(unit) == ""
    for hardening in ("NoNewPrivileges=yes", "ProtectSystem=strict", "ProtectHome=yes", "PrivateTmp=yes",
                      "User=versus-collector", "StateDirectoryMode=0700", "Restart=always"):  # fmt: skip
        assert hardening in text.splitlines(), hardening
    assert "--manifest-url https://gw.example:8443/api/collector/v1/updates/metadata/" in text
    assert f"ExecStart={exe} supervise --state-dir /var/lib/versus-collector" in text


def test_the_check_catches_a_broken_unit(tmp_path: Path) -> None:
    """The verification above can fail: a misspelt option is reported."""
    unit = tmp_path / UNIT_NAME
    unit.write_text(
        unit_text(ServiceOptions(_executable(tmp_path))).replace("NoNewPrivileges", "NoNewPrivilege")
    )
    assert "NoNewPrivilege" in _verify(unit)


def test_without_both_update_flags_the_unit_supervises_but_never_updates(tmp_path: Path) -> None:
    text = unit_text(ServiceOptions(_executable(tmp_path), update_pubkey="rel-1"))
    assert "--manifest-url" not in text and "--update-pubkey" not in text
