"""Collector run configuration: defaults < TOML file (``--config``) < environment < flags.

| Setting | Flag | Environment | Default |
|---|---|---|---|
| state directory | ``--state-dir`` | ``VERSUS_COLLECTOR_STATE_DIR`` | ``$XDG_STATE_HOME/versus-collector`` |
| claim hold asked for | ``--claim-wait`` | ``VERSUS_COLLECTOR_CLAIM_WAIT_S`` | 25 s |
| drain grace on SIGTERM | ``--grace`` | ``VERSUS_COLLECTOR_GRACE_S`` | 30 s |
| longest reconnect backoff | ``--max-backoff`` | ``VERSUS_COLLECTOR_MAX_BACKOFF_S`` | 60 s |
| drivers to load | ``--drivers`` | ``VERSUS_COLLECTOR_DRIVERS`` | every installed driver |
| log format | ``--log-format`` | ``VERSUS_COLLECTOR_LOG_FORMAT`` | ``console`` |
| loopback ``/metrics`` port | ``--metrics-port`` | ``VERSUS_COLLECTOR_METRICS_PORT`` | 0 (none) |
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

from collector.agent_state import CollectorError, RunOptions

_KEYS = {
    "state_dir": ("VERSUS_COLLECTOR_STATE_DIR", Path),
    "claim_wait_s": ("VERSUS_COLLECTOR_CLAIM_WAIT_S", float),
    "socket_claim_wait_s": ("VERSUS_COLLECTOR_SOCKET_CLAIM_WAIT_S", float),
    "grace_s": ("VERSUS_COLLECTOR_GRACE_S", float),
    "max_backoff_s": ("VERSUS_COLLECTOR_MAX_BACKOFF_S", float),
    "ws_retry_s": ("VERSUS_COLLECTOR_WS_RETRY_S", float),
    "drivers": ("VERSUS_COLLECTOR_DRIVERS", str),
    "log_format": ("VERSUS_COLLECTOR_LOG_FORMAT", str),
    "metrics_port": ("VERSUS_COLLECTOR_METRICS_PORT", int),
}


def default_state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "versus-collector"


def resolve(flags: dict[str, Any], config_file: Path | None) -> tuple[RunOptions, str]:
    """Merge the sources; returns the run options and the log format."""
    values: dict[str, Any] = {}
    if config_file is not None:
        try:
            values.update(tomllib.loads(config_file.read_text()))
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise CollectorError(f"cannot read {config_file}: {exc}") from None
        unknown = set(values) - set(_KEYS)
        if unknown:
            raise CollectorError(f"{config_file} has unknown settings: {', '.join(sorted(unknown))}")
    for key, (env, _) in _KEYS.items():
        if env in os.environ:
            values[key] = os.environ[env]
    values.update({k: v for k, v in flags.items() if v is not None})
    try:
        converted = {key: _KEYS[key][1](value) for key, value in values.items()}
    except ValueError as exc:
        raise CollectorError(f"invalid setting: {exc}") from None
    drivers = converted.pop("drivers", None)
    log_format = str(converted.pop("log_format", "console"))
    options = RunOptions(
        state_dir=converted.pop("state_dir", default_state_dir()),
        drivers=tuple(d.strip() for d in drivers.split(",") if d.strip()) if drivers else None,
        **converted,
    )
    if (
        not 0 < options.claim_wait_s <= 55
        or not 0 < options.socket_claim_wait_s <= 240
        or options.grace_s < 0
        or options.max_backoff_s <= 0
        or options.ws_retry_s <= 0
        or not 0 <= options.metrics_port <= 65535
    ):
        raise CollectorError(
            "claim wait must be in (0, 55], socket claim wait in (0, 240], grace >= 0, "
            "max backoff and ws retry > 0, metrics port in [0, 65535]"
        )
    return options, log_format
