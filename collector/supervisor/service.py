"""``versus-collector install-service``: a systemd unit that runs the supervisor.

The unit runs as a dedicated system user with its state under
``/var/lib/versus-collector`` (``StateDirectory=``, mode 0700), restarts the
supervisor whenever it exits, and confines it: no new privileges, a read-only
system, a private /tmp, no access to home directories or kernel tunables, and
only the network address families it needs. The supervisor, its releases
(``<state>/versions``) and the collector's state all live in that one writable
directory. tests/unit/test_collector_service.py runs ``systemd-analyze verify``
on what this writes.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

UNIT_NAME = "versus-collector.service"
DEFAULT_USER = "versus-collector"
DEFAULT_STATE_DIR = Path("/var/lib/versus-collector")


@dataclass(frozen=True, slots=True)
class ServiceOptions:
    executable: Path
    user: str = DEFAULT_USER
    state_dir: Path = DEFAULT_STATE_DIR
    manifest_url: str | None = None
    update_pubkey: str | None = None


def unit_text(options: ServiceOptions) -> str:
    """The unit file for ``options``."""
    argv = [str(options.executable), "supervise", "--state-dir", str(options.state_dir)]
    if options.manifest_url and options.update_pubkey:
        argv += ["--manifest-url", options.manifest_url, "--update-pubkey", options.update_pubkey]
    state_name = options.state_dir.name
    return f"""[Unit]
Description=Versus collector (supervisor: keeps the collector running and applies signed upgrades)
Documentation=https://versus.example/docs/upgrades
Wants=network-online.target
After=network-online.target

[Service]
Type=simple
User={options.user}
Group={options.user}
ExecStart={shlex.join(argv)}
Restart=always
RestartSec=5
# The supervisor stops the collector, which drains in-flight work first.
TimeoutStopSec=90
KillMode=mixed
StateDirectory={state_name}
StateDirectoryMode=0700
UMask=0077
Environment=VERSUS_COLLECTOR_STATE_DIR={options.state_dir}
NoNewPrivileges=yes
ProtectSystem=strict
ProtectHome=yes
PrivateTmp=yes
PrivateDevices=yes
ProtectKernelTunables=yes
ProtectKernelModules=yes
ProtectKernelLogs=yes
ProtectControlGroups=yes
ProtectClock=yes
ProtectHostname=yes
RestrictSUIDSGID=yes
RestrictRealtime=yes
RestrictNamespaces=yes
LockPersonality=yes
RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX
CapabilityBoundingSet=
AmbientCapabilities=
SystemCallArchitectures=native

[Install]
WantedBy=multi-user.target
"""


def default_executable() -> Path:
    """The ``versus-collector`` script beside this interpreter (a virtual environment's bin/)."""
    return Path(sys.executable).parent / "versus-collector"


def install(options: ServiceOptions, unit_dir: Path, *, create_user: bool, enable: bool) -> Path:
    """Write the unit (and create the system user, enable and start it when asked)."""
    if create_user:
        exists = subprocess.run(["id", "-u", options.user], capture_output=True).returncode == 0  # noqa: S607
        if not exists:
            subprocess.run(
                ["useradd", "--system", "--home-dir", str(options.state_dir), "--no-create-home",  # noqa: S607
                 "--shell", "/usr/sbin/nologin", options.user],
                check=True,
            )  # fmt: skip
        # Created now (systemd would at first start) so the host can be enrolled as that user first.
        options.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        shutil.chown(options.state_dir, options.user, options.user)
    unit_dir.mkdir(parents=True, exist_ok=True)
    path = unit_dir / UNIT_NAME
    path.write_text(unit_text(options))
    path.chmod(0o644)
    if enable:
        subprocess.run(["systemctl", "daemon-reload"], check=True)  # noqa: S607
        subprocess.run(["systemctl", "enable", "--now", UNIT_NAME], check=True)  # noqa: S607
    return path
