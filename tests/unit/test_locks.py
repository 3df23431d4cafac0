"""The locks and their check (tools/locks.py): the check fails whenever a lock and its inputs
disagree, and the collector is locked at the versions the control plane's tests run."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tools.locks import BY_NAME, LOCKS, ROOT, LockError, check, parse_lock


def _tree(tmp_path: Path) -> Path:
    """A copy of the lock inputs and the locks, to change."""
    for relative in ("pyproject.toml", "packaging/collector/pyproject.toml", "locks"):
        source, target = ROOT / relative, tmp_path / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if source.is_dir() else shutil.copy2)(source, target)
    return tmp_path


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new, 1))


def test_the_committed_locks_agree_with_their_inputs() -> None:
    assert check() == []


def test_a_dependency_added_without_locking_it_fails_the_check(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    _edit(tree / "pyproject.toml", '"jinja2>=3.1,<4",', '"jinja2>=3.1,<4",\n    "rich>=13",')
    problems = check(tree)
    assert "control-plane.txt: its inputs changed since it was made (pyproject.toml)" in problems
    assert "control-plane.txt: pyproject.toml requires rich, which is not locked" in problems


def test_a_range_the_locked_version_falls_outside_fails_the_check(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    version = next(p.version for p in parse_lock(BY_NAME["collector"].path.read_text()) if p.name == "hvac")
    _edit(tree / "packaging/collector/pyproject.toml", '"hvac>=2.3,<3"', f'"hvac>=2.3,<{version}"')
    problems = check(tree)
    assert any(p.startswith(f"collector.txt: hvac=={version} is outside") for p in problems), problems


def test_a_pin_edited_by_hand_fails_the_check(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    version = next(p.version for p in parse_lock(BY_NAME["collector"].path.read_text()) if p.name == "pyjwt")
    _edit(tree / "locks/collector.txt", f"pyjwt=={version}", "pyjwt==2.10.0")
    assert f"collector.txt: pyjwt==2.10.0 differs from control-plane.txt's {version}" in check(tree)


def test_a_pin_without_a_hash_fails_the_check(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    text = (tree / "locks/mitmproxy.txt").read_text()
    start = text.index("\nmitmproxy==") + 1
    line_end = text.index("\n", start)
    pin = text[start:line_end].removesuffix(" \\")
    rest = text[line_end + 1 :]
    while rest.startswith("    --hash="):
        rest = rest[rest.index("\n") + 1 :]
    (tree / "locks/mitmproxy.txt").write_text(text[:start] + pin + "\n" + rest)
    assert f"mitmproxy.txt: {pin} has no --hash" in check(tree)


def test_a_missing_lock_fails_the_check(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    (tree / "locks/salt.txt").unlink()
    assert check(tree) == ["salt.txt is missing"]


def test_pins_are_read_with_their_markers_apart_from_their_hashes() -> None:
    text = (
        "# inputs-sha256: 00\n"
        "colorama==0.4.6 ; sys_platform == 'win32' \\\n"
        "    --hash=sha256:" + "a" * 64 + " \\\n"
        "    --hash=sha256:" + "b" * 64 + "\n"
        "    # via pytest\n"
        "pyjwt[crypto]==2.15.1 \\\n"
        "    --hash=sha256:" + "c" * 64 + "\n"
    )
    colorama, pyjwt = parse_lock(text)
    assert (colorama.name, colorama.version, colorama.marker) == (
        "colorama",
        "0.4.6",
        'sys_platform == "win32"',
    )
    assert colorama.hashes == ("sha256:" + "a" * 64, "sha256:" + "b" * 64)
    assert (pyjwt.name, pyjwt.version, pyjwt.marker, len(pyjwt.hashes)) == ("pyjwt", "2.15.1", "", 1)


@pytest.mark.parametrize("line", ["requests>=2.31", "requests", "requests==2.*", "not a requirement ("])
def test_anything_but_one_pinned_version_is_refused(line: str) -> None:
    with pytest.raises(LockError):
        parse_lock(line + "\n")


def test_the_collector_ships_the_versions_and_files_the_tests_ran() -> None:
    dev = {p.name: p for p in parse_lock(BY_NAME["dev"].path.read_text())}
    for pin in parse_lock(BY_NAME["collector"].path.read_text()):
        assert (dev[pin.name].version, set(dev[pin.name].hashes)) == (pin.version, set(pin.hashes)), pin.name


def test_every_lock_is_hashed_throughout() -> None:
    for lock in LOCKS:
        pins = parse_lock(lock.path.read_text())
        assert pins and all(p.hashes for p in pins), lock.name
