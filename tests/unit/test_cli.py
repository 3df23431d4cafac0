from __future__ import annotations

import json
from pathlib import Path

import pytest

from versus_cp.main import EXIT_CONFIG, main


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith(("VERSUS_", "DATABASE_URL", "REDIS_URL")):
            monkeypatch.delenv(name)


@pytest.mark.parametrize("command", ["router", "enrollment", "gateway"])
def test_standalone_service_without_backends_is_one_line_config_error(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([command]) == EXIT_CONFIG
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("versus-cp: error: DATABASE_URL and REDIS_URL must be set")


@pytest.mark.parametrize(
    ("command", "env", "said"),
    [
        ("enrollment", {"OTEL_TRACES_EXPORTER": "zipkin"}, "OTEL_TRACES_EXPORTER=zipkin: this build exports"),
        ("gateway", {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel:4318",
                     "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, "OTLP protocol 'http/json'"),
        ("router", {"VERSUS_AUDIT_WEBHOOK_URL": "https://siem.example/"}, "VERSUS_AUDIT_WEBHOOK_URL needs"),
    ],
)  # fmt: skip
def test_a_tracing_or_audit_setting_a_service_cannot_honour_stops_it_before_the_backends(
    command: str, env: dict[str, str], said: str, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    # Backends that do not answer: the setting is refused before anything is asked of them.
    monkeypatch.setenv("DATABASE_URL", "postgresql://nobody@127.0.0.1:9/none")
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:9")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert main([command]) == EXIT_CONFIG
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("versus-cp: error: " + said), err


def test_malformed_url_is_reported_before_anything_starts(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("REDIS_URL", "memcached://cache")
    assert main(["up"]) == EXIT_CONFIG
    assert capsys.readouterr().err == (
        "versus-cp: error: invalid configuration: REDIS_URL: must be a redis://, rediss://, unix:// "
        "or redis+sentinel:// URL\n"
    )


def test_unknown_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["launch"])
    assert info.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_keys_rotate_and_list(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("VERSUS_STATE_DIR", str(tmp_path))
    assert main(["keys", "list", "--json"]) == 0
    first = json.loads(capsys.readouterr().out)
    assert set(first) == {"dispatch", "release"}
    assert main(["keys", "rotate", "--set", "dispatch", "--lifetime-days", "30", "--grace", "0s"]) == 0
    assert "version 2, new key dsp-" in capsys.readouterr().out
    assert main(["keys", "list", "--set", "dispatch", "--json"]) == 0
    after = json.loads(capsys.readouterr().out)["dispatch"]
    assert len(after) == 2
    assert first["dispatch"][0]["kid"] in {k["kid"] for k in after}
    assert main(["keys", "list"]) == 0
    table = capsys.readouterr().out
    assert table.count("current") == 2 and "verifying" in table
    assert "PRIVATE" not in table
    # By default a new key only verifies for an hour before it signs.
    assert main(["keys", "rotate", "--set", "release"]) == 0
    assert "version 2" in capsys.readouterr().out
    assert main(["keys", "list", "--set", "release"]) == 0
    assert "waiting" in capsys.readouterr().out


def test_keys_rotate_refuses_bad_lifetime(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("VERSUS_STATE_DIR", str(tmp_path))
    assert main(["keys", "rotate", "--set", "release", "--lifetime-days", "0"]) == EXIT_CONFIG
    assert "--lifetime-days must be between 1 and" in capsys.readouterr().err


@pytest.mark.parametrize("flag", [["--max-uses", "0"], ["--max-uses", "-1"], ["--ttl", "0"], ["--ttl", "-5"]])
def test_tokens_issue_refuses_out_of_range_values(
    flag: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Refused before any request is sent, never clamped to a default."""
    with pytest.raises(SystemExit) as exited:
        main(["tokens", "issue", "--site", "site-1", *flag])
    assert exited.value.code == EXIT_CONFIG
    assert "must be at least 1" in capsys.readouterr().err


def test_json_output_keeps_zeros_and_whole_numbers(capsys: pytest.CaptureFixture[str]) -> None:
    from versus.access.v1 import access_pb2
    from versus.enrollment.v1 import enrollment_pb2

    from versus_cp.output import print_json

    print_json(
        enrollment_pb2.EnrollmentToken(token_id="t", max_uses=1, status=enrollment_pb2.TOKEN_STATUS_ACTIVE)
    )
    token = json.loads(capsys.readouterr().out)
    assert (token["uses"], token["max_uses"], token["status"]) == (0, 1, "TOKEN_STATUS_ACTIVE")
    event = access_pb2.AuditEvent(action="token.issue")
    event.details.update({"max_uses": 1, "ratio": 0.5})
    print_json(event)
    out = capsys.readouterr().out
    assert json.loads(out)["details"] == {"max_uses": 1, "ratio": 0.5}
    assert "1.0" not in out


def test_every_command_resolves_its_handler_and_arguments() -> None:
    """Commands name their modules as strings (imported when run): each one must resolve."""
    from versus_cp import main as cli

    parser = cli.build_parser()  # defines every command's arguments: each definer imports
    assert parser.parse_args(["collectors", "list"]).command == "collectors"
    for name, (_, handler, configure) in cli.COMMANDS.items():
        assert callable(cli._resolve(handler)), name
        if configure is not None:
            assert callable(cli._resolve(configure)), name
