"""Versioned install directories, the atomic switch, and what a crash mid-swap leaves
(collector/supervisor/layout.py and the supervisor's recovery)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from collector import __version__
from collector.supervisor.layout import ARTIFACT, BUNDLED, Layout
from collector.supervisor.loop import Options, Supervisor


def _artifact(tmp_path: Path, body: bytes = b"pex") -> Path:
    path = tmp_path / "download.pex"
    path.write_bytes(body)
    return path


def test_nothing_selected_runs_the_bundled_collector(tmp_path: Path) -> None:
    layout = Layout(tmp_path / "install")
    layout.prepare()
    assert layout.current() == BUNDLED and layout.version_name(BUNDLED) == __version__
    argv, env = layout.command(BUNDLED, ["run"])
    assert argv[1:] == ["-m", "collector", "run"] and env == {}


def test_stage_and_switch(tmp_path: Path) -> None:
    layout = Layout(tmp_path / "install")
    layout.prepare()
    staged = layout.stage("0.2.0", _artifact(tmp_path))
    assert (staged / ARTIFACT).read_bytes() == b"pex" and layout.current() == BUNDLED
    layout.switch("0.2.0")
    assert layout.current() == "0.2.0" and os.readlink(layout.current_link) == "releases/0.2.0"
    argv, env = layout.command("0.2.0", ["run"])
    assert argv[1:] == [str(staged / ARTIFACT), "run"]
    assert env == {"PEX_ROOT": str(staged / ".pex"), "PYTHONPATH": ""}
    layout.switch(BUNDLED)
    assert layout.current() == BUNDLED


def test_an_incomplete_release_directory_is_never_selected(tmp_path: Path) -> None:
    """A crash while staging leaves a staging directory, not a release; one whose artifact is gone
    (someone removed it) falls back to the bundled collector rather than failing to start."""
    layout = Layout(tmp_path / "install")
    layout.prepare()
    (layout.releases / ".staging-0.2.0-123").mkdir()
    (layout.releases / ".staging-0.2.0-123" / ARTIFACT).write_bytes(b"half")
    layout.stage("0.2.0", _artifact(tmp_path))
    layout.switch("0.2.0")
    (layout.releases / "0.2.0" / ARTIFACT).unlink()
    assert layout.current() == BUNDLED
    layout.prune({"0.3.0"})
    assert list(layout.releases.iterdir()) == []


def test_version_names_are_plain(tmp_path: Path) -> None:
    layout = Layout(tmp_path / "install")
    layout.prepare()
    with pytest.raises(ValueError, match="not a version name"):
        layout.stage("../escape", _artifact(tmp_path))


def test_a_supervisor_that_stopped_during_a_health_window_rolls_back_at_its_next_start(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    layout = Layout(state / "versions")
    layout.prepare()
    layout.stage("0.2.0", _artifact(tmp_path))
    layout.stage("0.3.0", _artifact(tmp_path, b"new"))
    layout.switch("0.2.0")
    # The sequence a crash interrupted: trial recorded, switched, new version not yet healthy.
    layout.begin_trial("0.3.0", "0.2.0")
    layout.switch("0.3.0")
    supervisor = Supervisor(Options(state_dir=state, install_dir=state / "versions"))
    supervisor._recover()
    assert layout.current() == "0.2.0" and layout.trial() is None
    report = json.loads((state / "update-status.json").read_text())
    assert report["state"] == "rolled_back" and report["version"] == "0.3.0"
    assert "health window" in report["detail"] and "0.3.0" in supervisor.failed
