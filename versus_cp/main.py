"""Command-line entry point for `versus-cp`.

Every expected failure (bad configuration, a busy port, an unreachable
database) is reported as one line on stderr with a non-zero exit status:
2 for configuration errors, 1 for everything else. Tracebacks are reserved
for bugs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
from collections.abc import Callable, Sequence

from common.errors import ConfigError, VersusError
from common.settings import CONFIG_FILE_ENV, Settings, load_settings
from versus_cp import __version__, enrollment_cmd, keys_cmd, tunnel_cmd

EXIT_STARTUP = 1
EXIT_CONFIG = 2

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
        else:
            from gateway.server import serve
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(serve(settings))
        return 0

    return run


_SERVICES = "needs DATABASE_URL and REDIS_URL"
COMMANDS: dict[str, tuple[str, Handler, Configure | None]] = {
    "up": ("Run the whole control plane (embedded PostgreSQL and Redis unless URLs are set).", _cmd_up, None),
    "migrate": ("Apply database migrations and exit.", _cmd_migrate, None),
    "router": (f"Run only the Task Router gRPC service ({_SERVICES}).", _service("router"), None),
    "enrollment": (f"Run only the Enrollment gRPC service ({_SERVICES}).", _service("enrollment"), None),
    "gateway": (f"Run only the collector gateway ({_SERVICES}).", _service("gateway"), None),
    "keys": ("List or rotate the dispatch and release signing keys.", keys_cmd.run, keys_cmd.add_arguments),
    "sites": (
        "Create, list, update and delete sites.",
        enrollment_cmd.run_sites,
        enrollment_cmd.add_site_arguments,
    ),
    "tokens": (
        "Issue, list and revoke enrollment tokens.",
        enrollment_cmd.run_tokens,
        enrollment_cmd.add_token_arguments,
    ),
    "tunnel": (
        "Bridge stdin/stdout to a device through a collector (works as an OpenSSH ProxyCommand).",
        tunnel_cmd.run,
        tunnel_cmd.add_arguments,
    ),
    "collectors": (
        "Approve or deny collectors waiting for manual approval.",
        enrollment_cmd.run_collectors,
        enrollment_cmd.add_collector_arguments,
    ),
}


def build_parser() -> argparse.ArgumentParser:
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
        if configure is not None:
            configure(command)
    return parser


def _one_line(message: str) -> str:
    return " ".join(message.split())


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.config:
        # Children started by `up` inherit the environment, so they read the same file.
        os.environ[CONFIG_FILE_ENV] = args.config
    try:
        settings = load_settings()
        _, command, _ = COMMANDS[args.command]
        return command(settings, args)
    except ConfigError as exc:
        print(f"versus-cp: error: {_one_line(exc.message)}", file=sys.stderr)
        return EXIT_CONFIG
    except VersusError as exc:
        print(f"versus-cp: error: {_one_line(exc.message)}", file=sys.stderr)
        return EXIT_STARTUP
    except KeyboardInterrupt:
        return 130
