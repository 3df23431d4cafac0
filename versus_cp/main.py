"""Command-line entry point for `versus-cp`.

Every expected failure (bad configuration, a busy port, an unreachable
database, a refused request) is reported as one line on stderr with a
non-zero exit status; tracebacks are reserved for bugs. Exit statuses:

- 0 success; 1 failure (unreachable service, internal error, startup failure);
- 2 bad usage, configuration or argument (argparse uses 2 as well);
- 3 not authenticated or not allowed (and `collectors probe`: not reachable);
- 4 not found;
- 5 refused in the current state (conflict or failed precondition).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from common.config.settings import CONFIG_FILE_ENV, Settings, load_settings
from common.errors import (
    ConfigError,
    Conflict,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PayloadTooLarge,
    PermissionDenied,
    StartupError,
    Unauthenticated,
    Unavailable,
    VersusError,
)
from versus_cp import __version__, endpoints
from versus_cp.argv import command_of

EXIT_STARTUP = 1
EXIT_CONFIG = 2
EXIT_DENIED = 3
EXIT_NOT_FOUND = 4
EXIT_REFUSED = 5

Handler = Callable[[Settings, argparse.Namespace], int]
Configure = Callable[[argparse.ArgumentParser], None]


def _cmd_up(settings: Settings, _: argparse.Namespace) -> int:
    from versus_cp.supervisor import Supervisor

    return asyncio.run(Supervisor(settings).run())


def _cmd_migrate(settings: Settings, _: argparse.Namespace) -> int:
    from versus_cp.migrate import migrate

    migrate(settings)
    return 0


def _service(name: str) -> Handler:
    def run(settings: Settings, _: argparse.Namespace) -> int:
        if name == "router":
            from router.server import serve
        elif name == "enrollment":
            from enrollment.server import serve
        elif name == "console":
            from console.server import serve
        else:
            from gateway.server import serve
        from common.runtime import early_signals, event_loop

        early_signals.imported()  # a stop signal from here on is a clean shutdown, not an exit
        with contextlib.suppress(KeyboardInterrupt):
            event_loop.run(serve(settings), settings.event_loop)
        return 0

    return run


_SERVICES = "needs DATABASE_URL and REDIS_URL"
# Commands that are the control plane (or set it up) rather than talk to a running one.
_SERVERS = frozenset({"up", "migrate", "router", "enrollment", "gateway", "console"})
# Each command's module is imported only when that command runs (or its help is asked for): a
# call pays for the imports it needs, not for every command's (grpc stubs, SQLAlchemy, TUF...).
COMMANDS: dict[str, tuple[str, Handler | str, Configure | str | None]] = {
    "up": ("Run the whole control plane (embedded PostgreSQL and Redis unless URLs are set).", _cmd_up, None),
    "migrate": ("Apply database migrations and exit.", _cmd_migrate, None),
    "router": (f"Run only the Task Router gRPC service ({_SERVICES}).", _service("router"), None),
    "enrollment": (f"Run only the Enrollment gRPC service ({_SERVICES}).", _service("enrollment"), None),
    "gateway": (f"Run only the collector gateway ({_SERVICES}).", _service("gateway"), None),
    "console": (
        "Run only the operator web console (needs REDIS_URL and the router).",
        _service("console"),
        None,
    ),
    "keys": (
        "List or rotate the dispatch and release signing keys.",
        "versus_cp.keys_cmd:run",
        "versus_cp.keys_cmd:add_arguments",
    ),
    "ca": (
        "Rotate the Collector CA and the gateway CA; see who depends on which.",
        "versus_cp.ca_cmd:run",
        "versus_cp.ca_cmd:add_arguments",
    ),
    "material": (
        "Where the key and CA material lives; share it with replicas on other hosts.",
        "versus_cp.material_cmd:run",
        "versus_cp.material_cmd:add_arguments",
    ),
    "backup": (
        "Back the deployment up (database and sealed key material), verify a backup, restore one.",
        "versus_cp.backup_cmd:run",
        "versus_cp.backup_cmd:add_arguments",
    ),
    "sites": (
        "Create, list, update and delete sites.",
        "versus_cp.enrollment_cmd:run_sites",
        "versus_cp.enrollment_cmd:add_site_arguments",
    ),
    "tokens": (
        "Issue, list and revoke enrollment tokens.",
        "versus_cp.enrollment_cmd:run_tokens",
        "versus_cp.enrollment_cmd:add_token_arguments",
    ),
    "tunnel": (
        "Bridge stdin/stdout to a device through a collector (works as an OpenSSH ProxyCommand).",
        "versus_cp.tunnel_cmd:run",
        "versus_cp.tunnel_cmd:add_arguments",
    ),
    "collectors": (
        "List, inspect, approve, deny, probe, drain, undrain and revoke collectors; switch vault modes;"
        " approve upgrades.",
        "versus_cp.fleet_cmd:run_collectors",
        "versus_cp.fleet_cmd:add_collector_arguments",
    ),
    "releases": (
        "Publish, list, show and yank collector releases (signed self-upgrades).",
        "versus_cp.releases_cmd:run",
        "versus_cp.releases_cmd:add_arguments",
    ),
    "vault-integrations": (
        "Register and list the external vaults (AppRole) that vault mode C uses.",
        "versus_cp.fleet_cmd:run_integrations",
        "versus_cp.fleet_cmd:add_integration_arguments",
    ),
    "tasks": (
        "Submit, get, watch and cancel tasks as a platform module would.",
        "versus_cp.tasks_cmd:run",
        "versus_cp.tasks_cmd:add_arguments",
    ),
    "credentials": (
        "Take device credentials back from running tasks (scrub, or scrub and kill).",
        "versus_cp.credentials_cmd:run",
        "versus_cp.credentials_cmd:add_arguments",
    ),
    "queue": (
        "The dispatch queue: list by outcome, show evidence, resolve indeterminate tasks.",
        "versus_cp.queue_cmd:run",
        "versus_cp.queue_cmd:add_arguments",
    ),
    "access": (
        "Create, list and revoke API tokens; bootstrap the first one.",
        "versus_cp.access_cmd:run",
        "versus_cp.access_cmd:add_arguments",
    ),
    "audit": (
        "List the audit log.",
        "versus_cp.access_cmd:run_audit",
        "versus_cp.access_cmd:add_audit_arguments",
    ),
}


def _resolve(ref: Callable[..., Any] | str) -> Any:
    """A command's handler or argument definer: the object itself, or ``"module:name"`` imported now."""
    if not isinstance(ref, str):
        return ref
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser with every command; ``only`` defines the arguments of that command alone
    (None: of all), so parsing one command imports only its module."""
    parser = argparse.ArgumentParser(
        prog="versus-cp",
        description="Versus collector control plane. Configuration: environment variables and an "
        "optional TOML file (docs/configuration.md).",
    )
    parser.add_argument("--version", action="version", version=f"versus-cp {__version__}")
    parser.add_argument("--config", metavar="FILE", help=f"TOML settings file (same as {CONFIG_FILE_ENV})")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (help_text, _, configure) in COMMANDS.items():
        command = sub.add_parser(name, help=help_text, description=help_text)
        if configure is not None and only in (None, name):
            _resolve(configure)(command)
    return parser


def exit_status(error: VersusError) -> int:
    """The documented exit status for a domain error (see the module docstring)."""
    for kinds, status in (
        ((InvalidArgument, PayloadTooLarge), EXIT_CONFIG),
        ((Unauthenticated, PermissionDenied), EXIT_DENIED),
        ((NotFound,), EXIT_NOT_FOUND),
        ((Conflict, FailedPrecondition), EXIT_REFUSED),
    ):
        if isinstance(error, kinds):
            return status
    return EXIT_STARTUP


def _one_line(message: str) -> str:
    return " ".join(message.split())


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser(only=command_of(sys.argv[1:] if argv is None else argv)).parse_args(argv)
    if args.config:
        # Children started by `up` inherit the environment, so they read the same file.
        os.environ[CONFIG_FILE_ENV] = args.config
    try:
        settings = load_settings()
        if args.command not in _SERVERS:
            # An operator command: find a running `up` on this state directory unless told otherwise.
            settings = endpoints.apply(settings)
        _, command, _ = COMMANDS[args.command]
        handler: Handler = _resolve(command)
        return handler(settings, args)
    except ConfigError as exc:
        print(f"versus-cp: error: {_one_line(exc.message)}", file=sys.stderr)
        return EXIT_CONFIG
    except VersusError as exc:
        # A refusal from a service carries its stable code for scripts; local startup failures do not.
        suffix = "" if isinstance(exc, StartupError | Unavailable) else f" ({exc.code})"
        print(f"versus-cp: error: {_one_line(exc.message)}{suffix}", file=sys.stderr)
        return exit_status(exc)
    except KeyboardInterrupt:
        return 130
