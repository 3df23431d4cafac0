"""systemd's readiness protocol (sd_notify(3)): ``READY=1`` once serving, ``STOPPING=1`` when a
graceful stop begins. The units in deploy/ are ``Type=notify``, so ``systemctl start`` returns
when the service serves and units ordered after it start only then. Without ``NOTIFY_SOCKET``
(not under systemd) every call does nothing."""

from __future__ import annotations

import os
import socket

from common.telemetry.logs import get_logger

log = get_logger("versus.systemd")


def notify(state: str) -> bool:
    """Send ``state`` to systemd's notification socket; whether it was sent."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):  # an abstract socket
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.connect(address)
            sock.sendall(state.encode())
    except OSError as exc:
        log.warning("systemd notification failed", state=state, error=str(exc))
        return False
    return True


def ready() -> bool:
    return notify("READY=1")


def stopping() -> bool:
    return notify("STOPPING=1")
