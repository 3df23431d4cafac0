"""Versioned install directories and the switch between them.

Under the install directory (default ``<state>/versions``)::

    releases/<version>/versus-collector.pex   a staged release, complete or absent
    current  -> releases/<version>            what the supervisor starts; absent: the bundled
                                              collector (the one the supervisor itself came with)
    trial.json                                written before a switch, removed once the new
                                              version passed its health window

A release directory appears by a rename of a fully written, fsynced temporary
directory, and ``current`` changes by renaming a new symlink over it, so a
crash at any point leaves either the old or the new version selected and
complete. A crash during a trial is rolled back at the next start (``trial.json``
names the version to go back to). Nothing here touches the state directory:
identity, keys, journal and vault stay where they are.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from collector import __version__

ARTIFACT = "versus-collector.pex"
BUNDLED = ""  # the version name of "no release directory: the collector the supervisor came with"
_VERSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.+!_-]{0,63}$")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass(frozen=True, slots=True)
class Trial:
    version: str
    previous: str


class Layout:
    def __init__(self, root: Path):
        self.root = root
        self.releases = root / "releases"
        self.current_link = root / "current"
        self.trial_file = root / "trial.json"
        self.downloads = root / "downloads"

    def prepare(self) -> None:
        for path in (self.root, self.releases, self.downloads):
            path.mkdir(parents=True, exist_ok=True, mode=0o750)

    # --- what runs -------------------------------------------------------------------------------
    def current(self) -> str:
        """The selected version; :data:`BUNDLED` when none is (or the selected one is incomplete)."""
        try:
            target = os.readlink(self.current_link)
        except OSError:
            return BUNDLED
        version = Path(target).name
        return version if (self.releases / version / ARTIFACT).is_file() else BUNDLED

    def version_name(self, version: str) -> str:
        """How a version is reported: the bundled collector's own version number."""
        return version or __version__

    def command(self, version: str, args: list[str]) -> tuple[list[str], dict[str, str]]:
        """The argv and extra environment that start ``version`` with ``args``."""
        if version == BUNDLED:
            return [sys.executable, "-m", "collector", *args], {}
        artifact = self.releases / version / ARTIFACT
        # A PEX runs on the base interpreter and unpacks into a virtual environment of its own,
        # kept beside the artifact so that removing a version removes everything of it.
        interpreter = getattr(sys, "_base_executable", sys.executable) or sys.executable
        # PYTHONPATH is cleared: the release runs its own code, never a tree the host has on the path.
        env = {"PEX_ROOT": str(artifact.parent / ".pex"), "PYTHONPATH": ""}
        return [interpreter, str(artifact), *args], env

    # --- staging and switching -------------------------------------------------------------------
    def stage(self, version: str, artifact: Path) -> Path:
        """Install ``artifact`` as ``version`` (complete or not at all); returns its directory."""
        if not _VERSION.match(version):
            raise ValueError(f"{version!r} is not a version name")
        final = self.releases / version
        if (final / ARTIFACT).is_file():
            return final
        staging = self.releases / f".staging-{version}-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(mode=0o750)
        target = staging / ARTIFACT
        shutil.copyfile(artifact, target)
        target.chmod(0o550)
        with target.open("rb") as fh:
            os.fsync(fh.fileno())
        _fsync_dir(staging)
        shutil.rmtree(final, ignore_errors=True)
        staging.rename(final)
        _fsync_dir(self.releases)
        return final

    def switch(self, version: str) -> None:
        """Select ``version`` (:data:`BUNDLED`: the bundled collector) atomically."""
        if version == BUNDLED:
            self.current_link.unlink(missing_ok=True)
        else:
            temp = self.root / f".current-{os.getpid()}"
            temp.unlink(missing_ok=True)
            temp.symlink_to(Path("releases") / version)
            temp.replace(self.current_link)
        _fsync_dir(self.root)

    def begin_trial(self, version: str, previous: str) -> None:
        temp = self.trial_file.with_suffix(".tmp")
        temp.write_text(json.dumps({"version": version, "previous": previous}))
        temp.replace(self.trial_file)
        _fsync_dir(self.root)

    def trial(self) -> Trial | None:
        try:
            raw = json.loads(self.trial_file.read_text())
            return Trial(str(raw["version"]), str(raw["previous"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def end_trial(self) -> None:
        self.trial_file.unlink(missing_ok=True)
        _fsync_dir(self.root)

    def prune(self, keep: set[str]) -> None:
        """Remove release directories other than ``keep`` (and stale staging directories)."""
        for entry in self.releases.iterdir():
            if entry.name not in keep:
                shutil.rmtree(entry, ignore_errors=True)
