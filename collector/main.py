"""`versus-collector`: the reference collector's command line.

    versus-collector enroll --url URL --token-file PATH|- [--ca-pin sha256/...] [--state-dir DIR]
    versus-collector run [--state-dir DIR] [--config FILE] [--claim-wait S] [--grace S] [--drivers a,b]
    versus-collector status [--state-dir DIR] [--json] [--offline]
    versus-collector supervise [--state-dir DIR] [--install-dir DIR] [--manifest-url URL --update-pubkey KEY]
    versus-collector install-service [--user U] [--state-dir DIR] [--manifest-url URL --update-pubkey KEY]

Expected failures are one line on stderr (``code: message``) and exit status 1.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from collector import __version__, credentials_cli, local_metrics
from collector.agent import Agent
from collector.agent_state import CollectorError
from collector.config import default_state_dir, resolve
from collector.enroll import EnrollError, EnrollOptions, enroll, status
from collector.state import StatePaths
from collector.status import local_status, render
from common.telemetry.logs import configure_logging, get_logger

log = get_logger("versus.collector.main")


def _state_dir() -> Path:
    return Path(os.environ.get("VERSUS_COLLECTOR_STATE_DIR", default_state_dir()))


class _RefuseToken(argparse.Action):
    """``--token VALUE`` is refused without repeating the value (it is a secret)."""

    def __call__(self, parser: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
        parser.error(
            "enrollment tokens are not taken on the command line, where ps and shell history show them: "
            "use --token-file - and paste it, or --token-file PATH"
        )


def _seconds(text: str) -> float:
    """A duration option: a finite number of seconds above zero (a zero or negative bound would
    end every attempt at once; argparse turns the refusal into a usage error, exit 2)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be a number of seconds above 0")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="versus-collector", description="Versus reference collector.")
    parser.add_argument("--version", action="version", version=f"versus-collector {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    e = sub.add_parser(
        "enroll", help="Enroll with a one-time token and store the identity.", allow_abbrev=False
    )
    e.add_argument("--token", action=_RefuseToken, help=argparse.SUPPRESS)
    e.add_argument("--url", required=True, help="gateway URL, e.g. https://gw.example.net")
    e.add_argument(
        "--token-file", required=True, type=Path,
        help="file holding the enrollment token (vst_...); '-' reads it from standard input (asked for "
        "without echo on a terminal). Never on the command line, where ps and shell history see it",
    )  # fmt: skip
    e.add_argument("--ca-pin", help="sha256/... pin of the gateway's internal CA")
    e.add_argument("--collector-id", help="choose the collector id (default: generated)")
    e.add_argument("--force", action="store_true", help="enroll again over an existing identity")
    e.add_argument("--state-dir", type=Path, default=_state_dir())
    r = sub.add_parser("run", help="Claim, verify, execute and report tasks until SIGTERM.")
    r.add_argument("--state-dir", type=Path)
    r.add_argument("--config", type=Path, help="TOML file with run settings")
    r.add_argument("--claim-wait", type=float, dest="claim_wait_s")
    r.add_argument(
        "--socket-claim-wait", type=float, dest="socket_claim_wait_s",
        help="an idle collector's claim hold on the control socket (seconds)",
    )  # fmt: skip
    r.add_argument("--grace", type=float, dest="grace_s")
    r.add_argument("--max-backoff", type=float, dest="max_backoff_s")
    r.add_argument("--ws-retry", type=float, dest="ws_retry_s", help="seconds on HTTPS before retrying WSS")
    r.add_argument("--drivers", help="comma-separated driver names to load (default: all installed)")
    r.add_argument("--log-format", choices=["console", "json"])
    r.add_argument(
        "--metrics-port", type=int, dest="metrics_port", help="serve /metrics on 127.0.0.1 at this port"
    )
    s = sub.add_parser(
        "status",
        help="Show identity, gateway, session, protocol, held tasks, journal, certificate and update state.",
    )
    s.add_argument("--state-dir", type=Path, default=_state_dir())
    s.add_argument("--json", action="store_true", help="one JSON object (collector/status.py)")
    s.add_argument("--offline", action="store_true", help="do not ask the gateway for the enrollment status")
    v = sub.add_parser(
        "supervise", help="Run the collector, restart it when it exits, and apply signed upgrades."
    )
    v.add_argument("--state-dir", type=Path, default=_state_dir())
    v.add_argument(
        "--install-dir", type=Path, help="where releases are staged (default: <state-dir>/versions)"
    )
    v.add_argument(
        "--manifest-url", help="the gateway's update metadata URL, .../api/collector/v1/updates/metadata/"
    )
    v.add_argument(
        "--update-pubkey", help="a release key id or public key the update repository's root must hold"
    )
    v.add_argument("--health-window", type=_seconds, default=120.0, dest="health_window_s",
                   help="seconds a new version has to reach the control plane")  # fmt: skip
    v.add_argument("--check-interval", type=_seconds, default=5.0, dest="check_interval_s")
    # Defaults in collector/supervisor (not imported here: the collector's start stays light).
    v.add_argument("--update-timeout", type=_seconds, dest="update_timeout_s",
                   help="seconds one upgrade attempt may take in all (1800)")  # fmt: skip
    v.add_argument("--bootstrap-timeout", type=_seconds, dest="bootstrap_timeout_s",
                   help="seconds the first walk of the repository's roots may take (300)")  # fmt: skip
    v.add_argument("--download-retry", type=_seconds, dest="download_retry_s",
                   help="seconds before a broken download is tried again; doubles (60)")  # fmt: skip
    v.add_argument("run_args", nargs="*", help="extra arguments for `run` (after --)")
    c = sub.add_parser(
        "credentials", help="Set, remove and list the sealed device credentials (vault mode A)."
    )
    credentials_cli.add_arguments(c, _state_dir())
    i = sub.add_parser("install-service", help="Write (and enable) a systemd unit running the supervisor.")
    i.add_argument("--user", default="versus-collector")
    i.add_argument("--state-dir", type=Path, default=Path("/var/lib/versus-collector"))
    i.add_argument("--executable", type=Path, help="the versus-collector program (default: this one)")
    i.add_argument("--manifest-url")
    i.add_argument("--update-pubkey")
    i.add_argument("--unit-dir", type=Path, default=Path("/etc/systemd/system"))
    i.add_argument("--no-enable", action="store_true", help="only write the unit (and user)")
    i.add_argument("--no-create-user", action="store_true")
    return parser


# Options of `supervise` whose defaults are collector/supervisor's own.
SUPERVISOR_BOUNDS = ("update_timeout_s", "bootstrap_timeout_s", "download_retry_s")


def _supervise(args: argparse.Namespace) -> int:
    from collector.supervisor.loop import Options, Supervisor

    if bool(args.manifest_url) != bool(args.update_pubkey):
        raise CollectorError("--manifest-url and --update-pubkey go together (both enable self-update)")
    configure_logging(service="collector-supervisor")
    state = args.state_dir
    if not (state / "identity.json").exists():
        raise CollectorError(f"no identity in {state}; run `versus-collector enroll` first")
    options = Options(
        state_dir=state, install_dir=args.install_dir or state / "versions", manifest_url=args.manifest_url,
        update_pubkey=args.update_pubkey, health_window_s=args.health_window_s,
        check_interval_s=args.check_interval_s, run_args=list(args.run_args),
        **{name: getattr(args, name) for name in SUPERVISOR_BOUNDS if getattr(args, name) is not None},
    )  # fmt: skip
    return Supervisor(options).run()


def _install_service(args: argparse.Namespace) -> int:
    from collector.supervisor import service

    if bool(args.manifest_url) != bool(args.update_pubkey):
        raise CollectorError("--manifest-url and --update-pubkey go together (both enable self-update)")
    options = service.ServiceOptions(
        executable=args.executable or service.default_executable(), user=args.user, state_dir=args.state_dir,
        manifest_url=args.manifest_url, update_pubkey=args.update_pubkey,
    )  # fmt: skip
    path = service.install(
        options, args.unit_dir, create_user=not args.no_create_user, enable=not args.no_enable
    )
    print(f"wrote {path}")
    return 0


def _status(args: argparse.Namespace) -> int:
    """Local facts always; the control plane's enrollment status when it answers (not --offline)."""
    if not StatePaths(args.state_dir).identity.exists():
        raise EnrollError(
            "not_enrolled", f"no identity in {args.state_dir}; run versus-collector enroll first"
        )
    facts = local_status(args.state_dir)
    if not args.offline:
        try:
            facts["enrollment"] = status(args.state_dir)
        except EnrollError as exc:
            facts["enrollment"] = {
                "error": {"code": exc.code, "message": str(exc).removeprefix(f"{exc.code}: ")}
            }
    if args.json:
        print(json.dumps(facts, indent=2, sort_keys=True))
    else:
        print("\n".join(render(facts)))
    return 0


def _run(args: argparse.Namespace, argv: Sequence[str]) -> int:
    flags = {
        k: getattr(args, k)
        for k in (
            "state_dir",
            "claim_wait_s",
            "socket_claim_wait_s",
            "grace_s",
            "max_backoff_s",
            "ws_retry_s",
            "drivers",
            "log_format",
            "metrics_port",
        )
    }
    options, log_format = resolve(flags, args.config)
    configure_logging(fmt=log_format, service="collector")

    agents: list[Agent] = []

    async def main() -> None:
        agents.append(Agent(options))
        if options.metrics_port:
            bound = local_metrics.serve(agents[0], options.metrics_port)
            log.info("metrics on loopback", port=bound)
        await agents[0].run()

    asyncio.run(main())
    if agents and agents[0].fatal:
        raise CollectorError(agents[0].fatal)
    if agents and agents[0].restart_requested and not agents[0].stopping.is_set():
        # Same arguments, fresh process image: new session id, settings re-read from the state dir.
        # Not when a stop signal came while the restart drained: that stop is the operator's last
        # word (`stopping` is set only by SIGTERM/SIGINT), and a new image would lose it.
        sys.stdout.flush()
        sys.stderr.flush()
        os.execv(sys.executable, [sys.executable, "-m", "collector", *argv])  # noqa: S606 - fixed argv
    return 0


def read_token(path: Path) -> str:
    """The enrollment token from ``path``, or from standard input for ``-``."""
    if str(path) == "-":
        text = getpass.getpass("enrollment token: ") if sys.stdin.isatty() else sys.stdin.readline()
    else:
        try:
            text = path.read_text()
        except OSError as exc:
            raise EnrollError("token_file_unreadable", f"cannot read {path}: {exc.strerror or exc}") from None
    token = text.strip()
    if not token:
        raise EnrollError(
            "token_missing", f"no enrollment token in {'standard input' if str(path) == '-' else path}"
        )
    return token


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "enroll":
            token = read_token(args.token_file)
            identity = enroll(
                EnrollOptions(args.url, token, args.state_dir, args.ca_pin, args.collector_id, args.force)
            )
            print(
                f"enrolled as {identity['collector_id']} in site {identity['site_id']}: {identity['status']}"
            )
            if identity["status"] == "pending":
                print("waiting for an operator to approve it; check with `versus-collector status`")
            return 0
        if args.command == "run":
            return _run(args, list(sys.argv[1:] if argv is None else argv))
        if args.command == "supervise":
            return _supervise(args)
        if args.command == "install-service":
            return _install_service(args)
        if args.command == "credentials":
            return credentials_cli.run(args)
        return _status(args)
    except (EnrollError, CollectorError, credentials_cli.CredentialsError) as exc:
        print(f"versus-collector: error: {exc}", file=sys.stderr)
        return 1
