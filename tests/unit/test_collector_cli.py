"""`versus-collector enroll` takes its token from a file or standard input, never from argv."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from collector.enroll import EnrollError
from collector.main import build_parser, read_token


def test_the_token_comes_from_a_file_or_standard_input(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "token"
    path.write_text("vst_fromfile\n")
    assert read_token(path) == "vst_fromfile"
    monkeypatch.setattr("sys.stdin", io.StringIO("vst_fromstdin\nignored\n"))
    assert read_token(Path("-")) == "vst_fromstdin"


@pytest.mark.parametrize("content", ["", "\n", "   \n"])
def test_an_empty_token_is_refused(tmp_path: Path, content: str) -> None:
    path = tmp_path / "token"
    path.write_text(content)
    with pytest.raises(EnrollError, match="no enrollment token"):
        read_token(path)


def test_an_unreadable_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(EnrollError, match="cannot read"):
        read_token(tmp_path / "missing")


def test_a_token_on_the_command_line_is_not_accepted(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["enroll", "--url", "https://gw:8443", "--token", "vst_secret"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "--token-file" in err and "vst_secret" not in err  # the secret is not echoed either


@pytest.mark.parametrize(
    "flag", ["--update-timeout", "--bootstrap-timeout", "--download-retry", "--check-interval"]
)
@pytest.mark.parametrize("value", ["0", "-5", "nan", "inf", "soon"])
def test_a_supervisor_bound_must_be_seconds_above_zero(
    flag: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as refused:
        build_parser().parse_args(["supervise", f"{flag}={value}"])
    assert refused.value.code == 2
    assert "seconds" in capsys.readouterr().err


def test_supervisor_bounds_are_taken_as_given_or_left_to_the_supervisor() -> None:
    args = build_parser().parse_args(["supervise", "--update-timeout", "90", "--download-retry", "2.5"])
    assert (args.update_timeout_s, args.download_retry_s, args.bootstrap_timeout_s) == (90.0, 2.5, None)
