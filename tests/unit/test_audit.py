"""`make audit`'s verdict from pip-audit's reports (tools/audit.py): a vulnerability fails, and an
audit that could not look a package up never passes as clean. pip-audit itself runs for real in
tests/integration/test_audit.py."""

from __future__ import annotations

from typing import Any

import pytest

from tools import audit


def _run(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *deps: dict[str, Any]
) -> tuple[int, str]:
    monkeypatch.setattr(audit, "audit", lambda lock, service: {"dependencies": list(deps), "fixes": []})
    status = audit.main(["--lock", "collector"])
    captured = capsys.readouterr()
    return status, captured.out + captured.err


def test_every_package_looked_up_and_none_vulnerable_passes(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    status, said = _run(monkeypatch, capsys, {"name": "tuf", "version": "7.0.1", "vulns": []})
    assert status == 0 and "1 pins audited" in said and "0 known vulnerabilities" in said


def test_a_known_vulnerability_fails_and_names_the_fix(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    vulnerable = {
        "name": "h11",
        "version": "0.14.0",
        "vulns": [{"id": "GHSA-vqfr-h8mv-ghfj", "fix_versions": ["0.16.0"]}],
    }
    status, said = _run(monkeypatch, capsys, vulnerable, {"name": "tuf", "version": "7.0.1", "vulns": []})
    assert status == 1 and "collector: h11 0.14.0: GHSA-vqfr-h8mv-ghfj (fixed in 0.16.0)" in said


def test_a_package_not_looked_up_is_not_a_clean_audit(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    skipped = {"name": "tuf", "skip_reason": "Dependency not found on PyPI and could not be audited"}
    status, said = _run(monkeypatch, capsys, {"name": "h11", "version": "0.16.0", "vulns": []}, skipped)
    assert status == 2 and "1 not looked up" in said and "can be reached" in said


def test_no_report_at_all_is_not_a_clean_audit(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def unreachable(lock: str, service: str) -> dict[str, Any]:
        raise audit.Unreachable("pip-audit gave no report on collector: Failed to resolve 'api.osv.dev'")

    monkeypatch.setattr(audit, "audit", unreachable)
    assert audit.main(["--lock", "collector"]) == 2
    assert "Failed to resolve" in capsys.readouterr().err
