"""The gateway follows a gateway CA rotation without a restart.

When an operator activates a new gateway CA (``versus-cp ca activate --ca gateway``),
``trust.json`` changes; the gateway then reissues its server certificate under
the new CA (common/trust/tls.py ensure_gateway_tls) and loads it into the live SSL
context, so every handshake from then on presents it while open connections
carry on. With an operator's own certificate files (or ones `versus-cp ca
issue-server-cert` wrote, as on the gateways of a multi-host deployment), replacing
the files is enough: the gateway loads the new pair the same way.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from common.errors import VersusError
from common.telemetry.logs import get_logger
from common.trust.ca_store import CaStore
from common.trust.tls import GatewayTls

log = get_logger("versus.gateway.tls")

CHECK_INTERVAL_S = 1.0


class Stoppable(Protocol):
    should_exit: bool


async def follow_gateway_ca(
    context: ssl.SSLContext,
    store: CaStore,
    reissue: Callable[[], GatewayTls | None],
    server: Stoppable,
    interval_s: float = CHECK_INTERVAL_S,
) -> None:
    """Until ``server`` stops: when the CA store changes, reissue and load the server certificate."""
    seen = store.mtime_ns()
    while not server.should_exit:
        await asyncio.sleep(interval_s)
        mtime = store.mtime_ns()
        if mtime == seen:
            continue
        try:
            tls = reissue()
            if tls is not None:
                context.load_cert_chain(str(tls.cert_file), str(tls.key_file))
                log.info("gateway certificate loaded", ca_pin=tls.pin)
            seen = mtime
        except (OSError, ssl.SSLError, VersusError) as exc:
            # The old certificate stays in use; the next change or check tries again.
            log.warning("cannot load the gateway certificate; keeping the current one", error=str(exc))


def _mtimes(*paths: Path) -> tuple[int, ...]:
    try:
        return tuple(p.stat().st_mtime_ns for p in paths)
    except OSError:
        return ()


async def follow_cert_files(
    context: ssl.SSLContext,
    cert_file: Path,
    key_file: Path,
    server: Stoppable,
    interval_s: float = CHECK_INTERVAL_S,
) -> None:
    """Until ``server`` stops: when the operator replaces the certificate files (after a gateway
    CA rotation, say: `versus-cp ca issue-server-cert`), load them into the live SSL context.
    A pair that does not load (half written, mismatched) leaves the current one in use."""
    seen = _mtimes(cert_file, key_file)
    while not server.should_exit:
        await asyncio.sleep(interval_s)
        now = _mtimes(cert_file, key_file)
        if not now or now == seen:
            continue
        try:
            context.load_cert_chain(str(cert_file), str(key_file))
            log.info("gateway certificate reloaded from its files", cert_file=str(cert_file))
            seen = now
        except (OSError, ssl.SSLError) as exc:
            log.warning("cannot load the replaced certificate files; keeping the current one", error=str(exc))
