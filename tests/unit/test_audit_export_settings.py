"""Audit export settings (router/audit_export/settings.py): what is refused at start, and the sinks named."""

from __future__ import annotations

from pathlib import Path

import pytest

from common.errors import ConfigError
from router.audit_export import settings
from router.audit_export.sinks import FileSink, SyslogSink, WebhookSink


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("FILE", "SYSLOG", "WEBHOOK_URL", "WEBHOOK_SECRET_FILE", "SOURCE", "BATCH", "FILE_MAX_BYTES"):
        monkeypatch.delenv(f"VERSUS_AUDIT_{name}", raising=False)


def test_no_setting_no_sink() -> None:
    assert settings.sinks(settings.load()) == []


async def test_each_sink_from_its_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "secret").write_text("0123456789abcdef0123\n")
    monkeypatch.setenv("VERSUS_AUDIT_FILE", str(tmp_path / "audit.jsonl"))
    monkeypatch.setenv("VERSUS_AUDIT_SYSLOG", "siem.example:6514")
    monkeypatch.setenv("VERSUS_AUDIT_WEBHOOK_URL", "https://siem.example/intake")
    monkeypatch.setenv("VERSUS_AUDIT_WEBHOOK_SECRET_FILE", str(tmp_path / "secret"))
    sinks = settings.sinks(settings.load())
    assert [type(s) for s in sinks] == [FileSink, SyslogSink, WebhookSink]
    assert "0123456789abcdef" not in repr(sinks[2])
    for sink in sinks:
        await sink.close()


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"VERSUS_AUDIT_WEBHOOK_URL": "https://siem.example/intake"}, "VERSUS_AUDIT_WEBHOOK_SECRET_FILE"),
        ({"VERSUS_AUDIT_WEBHOOK_URL": "http://siem.example/intake"}, "VERSUS_AUDIT_WEBHOOK_URL"),
        ({"VERSUS_AUDIT_SYSLOG": "siem.example"}, "VERSUS_AUDIT_SYSLOG"),
        ({"VERSUS_AUDIT_SYSLOG": "siem.example:70000"}, "VERSUS_AUDIT_SYSLOG"),
        ({"VERSUS_AUDIT_FILE_MAX_BYTES": "1000"}, "VERSUS_AUDIT_FILE_MAX_BYTES"),
        ({"VERSUS_AUDIT_BATCH": "0"}, "VERSUS_AUDIT_BATCH"),
        ({"VERSUS_AUDIT_SOURCE": "has spaces"}, "VERSUS_AUDIT_SOURCE"),
    ],
)
def test_a_bad_setting_stops_the_start_with_one_clear_line(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], says: str
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as refused:
        settings.load()
    assert refused.value.code == "audit_export_invalid" and says in refused.value.message


def test_a_short_or_missing_webhook_secret_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("VERSUS_AUDIT_WEBHOOK_URL", "https://siem.example/intake")
    monkeypatch.setenv("VERSUS_AUDIT_WEBHOOK_SECRET_FILE", str(tmp_path / "absent"))
    with pytest.raises(ConfigError, match="cannot read"):
        settings.sinks(settings.load())
    (tmp_path / "short").write_text("too short")
    monkeypatch.setenv("VERSUS_AUDIT_WEBHOOK_SECRET_FILE", str(tmp_path / "short"))
    with pytest.raises(ConfigError, match="at least 16 bytes"):
        settings.sinks(settings.load())
