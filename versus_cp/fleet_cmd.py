"""Operator commands for the fleet (served by the router's FleetService):

    versus-cp collectors list [--query Q] [--site SITE_ID] [--expiring 14d] [--outdated]
    versus-cp collectors show COLLECTOR_ID
    versus-cp collectors probe COLLECTOR_ID
    versus-cp collectors approve|drain|undrain COLLECTOR_ID
    versus-cp collectors deny|revoke COLLECTOR_ID [--reason TEXT]
    versus-cp collectors vault-mode COLLECTOR_ID A|B|C [--integration ID --secret-id-file PATH|-]
    versus-cp collectors update apply COLLECTOR_ID [--version V]
    versus-cp collectors update cancel COLLECTOR_ID
    versus-cp vault-integrations create NAME --address URL --role-id ID [--kv-mount M]
                                    [--path-prefix P] [--ca-file PEM] [--plain-secret-ids]
    versus-cp vault-integrations list

Every command takes ``--json``. ``probe`` exits 0 when the collector is
reachable and 3 when it is not, so scripts can gate on it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from pathlib import Path
from typing import Any

from versus.fleet.v1 import fleet_pb2 as pb
from versus.fleet.v1 import fleet_pb2_grpc

from common.config.settings import Settings
from versus_cp import rpc
from versus_cp.output import age, enum_name, fields, print_json, print_table, table, when

EXIT_UNREACHABLE = 3
# `collectors list --status/--session` values, as the list prints them.
STATUS_FILTER = {
    n.removeprefix("COLLECTOR_STATUS_").lower(): v
    for n, v in pb.CollectorStatus.items()
    if v != pb.COLLECTOR_STATUS_UNSPECIFIED
}
SESSION_FILTER = {
    n.removeprefix("SESSION_STATE_").lower(): v
    for n, v in pb.SessionState.items()
    if v != pb.SESSION_STATE_UNSPECIFIED
}

# Letters as the product names them, and the words the API uses.
VAULT_MODES = {
    "a": pb.VAULT_MODE_LOCAL,
    "local": pb.VAULT_MODE_LOCAL,
    "b": pb.VAULT_MODE_CLOUD_RELAYED,
    "relayed": pb.VAULT_MODE_CLOUD_RELAYED,
    "c": pb.VAULT_MODE_EXTERNAL,
    "external": pb.VAULT_MODE_EXTERNAL,
}
_VAULT_LABEL = {
    pb.VAULT_MODE_LOCAL: "A local",
    pb.VAULT_MODE_CLOUD_RELAYED: "B relayed",
    pb.VAULT_MODE_EXTERNAL: "C external",
}


def _call(settings: Settings, method: str, request: Any) -> Any:
    return rpc.call(settings, settings.router_address, fleet_pb2_grpc.FleetServiceStub, method, request)


def add_collector_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = sub.add_parser("list", help="List collectors with status, session state and drivers.")
    listing.add_argument("--query", default="", help="match collector id, hostname or site id")
    listing.add_argument("--site", default="")
    listing.add_argument(
        "--expiring", type=span, default=None, metavar="SPAN",
        help="only collectors whose certificate expires within SPAN (e.g. 14d, 12h, 30m, 90s)",
    )  # fmt: skip
    listing.add_argument(
        "--outdated", action="store_true", help="only collectors behind the latest release on their channel"
    )
    listing.add_argument("--status", choices=sorted(STATUS_FILTER), help="only collectors with this status")
    listing.add_argument(
        "--session", choices=sorted(SESSION_FILTER), help="only collectors whose session is in this state now"
    )
    listing.add_argument("--version", default="", help="only collectors running exactly this version")
    listing.add_argument("--driver", default="", help="only collectors whose capabilities list this driver")
    parsers = [listing]
    for name, text in (
        ("show", "Identity, live session, driver capabilities and vault mode of one collector."),
        ("probe", "Heartbeat freshness (reachable under 90 s), session state and queue depth."),
        ("approve", "Activate a collector waiting for manual approval."),
        ("drain", "Stop routing new work to the collector; in-flight work finishes."),
        ("undrain", "Route work to the collector again."),
    ):
        p = sub.add_parser(name, help=text)
        p.add_argument("collector_id")
        parsers.append(p)
    for name, text in (
        ("deny", "Refuse a collector waiting for manual approval (final)."),
        ("revoke", "Revoke the collector's identity for good; it must re-enroll with a new token."),
    ):
        p = sub.add_parser(name, help=text)
        p.add_argument("collector_id")
        p.add_argument("--reason", default="")
        parsers.append(p)
    vault = sub.add_parser("vault-mode", help="Switch the credential vault mode (the collector restarts).")
    vault.add_argument("collector_id")
    vault.add_argument(
        "mode", type=str.lower, choices=sorted(VAULT_MODES), help="A|B|C or local|relayed|external"
    )
    vault.add_argument("--integration", default="", help="vault integration id (mode C)")
    vault.add_argument(
        "--secret-id-file",
        type=Path,
        help="mode C: the collector's AppRole secret id - a response-wrapping token unless the "
        "integration takes plain ones - read from this file, or '-' for stdin (never the command line)",
    )
    parsers.append(vault)
    upgrade = sub.add_parser(
        "update", help="Approve or withdraw a collector's upgrade (manual update policy)."
    )
    upgrade.add_argument("step", choices=["apply", "cancel"])
    upgrade.add_argument("collector_id")
    upgrade.add_argument("--version", default="", help="the release to install (default: the latest)")
    parsers.append(upgrade)
    for p in parsers:
        p.add_argument("--json", action="store_true")


def _drivers(c: pb.Collector) -> str:
    return ",".join(d.provider for d in c.drivers) or "-"


def _status(c: pb.Collector) -> str:
    return enum_name(c.status, pb.CollectorStatus, "COLLECTOR_STATUS_")


def _session(c: pb.Collector) -> str:
    return enum_name(c.session_state, pb.SessionState, "SESSION_STATE_")


_SPAN_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def span(text: str) -> dt.timedelta:
    """``14d``, ``12h``, ``30m`` or ``90s`` as a duration."""
    number, unit = text[:-1], text[-1:].lower()
    if unit not in _SPAN_UNITS or not number.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a span like 14d, 12h, 30m or 90s")
    return dt.timedelta(seconds=int(number) * _SPAN_UNITS[unit])


_BADGE = {
    pb.UPDATE_BADGE_UP_TO_DATE: "",
    pb.UPDATE_BADGE_UPDATE_AVAILABLE: "update available",
    pb.UPDATE_BADGE_UPDATING: "updating",
    pb.UPDATE_BADGE_FAILED: "update failed",
    pb.UPDATE_BADGE_ROLLED_BACK: "rolled back",
}


def _version(c: pb.Collector) -> str:
    u = c.update
    badge = _BADGE.get(u.badge, "")
    if u.badge == pb.UPDATE_BADGE_UPDATING and u.target_version:
        badge += f" -> {u.target_version}"
    elif u.badge in (pb.UPDATE_BADGE_FAILED, pb.UPDATE_BADGE_ROLLED_BACK):
        badge += f" from {u.state_version}"
    elif u.badge == pb.UPDATE_BADGE_UPDATE_AVAILABLE:
        badge += f": {u.latest_version}"
    return (c.agent_version or "-") + (f" ({badge})" if badge else "")


def print_collectors(collectors: list[pb.Collector]) -> None:
    rows = [
        (
            c.collector_id,
            c.site_id,
            c.hostname or "-",
            _version(c),
            _status(c),
            _session(c),
            _drivers(c),
        )
        for c in collectors
    ]
    print_table(["COLLECTOR", "SITE", "HOSTNAME", "VERSION", "STATUS", "SESSION", "DRIVERS"], rows)


def print_detail(c: pb.Collector) -> None:
    s = c.session
    heartbeat = age(s.heartbeat_age_s if s.HasField("heartbeat_age_s") else None)
    running_vault = _VAULT_LABEL.get(s.vault_mode, "-")
    identity = [
        ("status", _status(c) + (" (drained by an operator)" if c.drained else "")),
        ("site", c.site_id),
        ("hostname", c.hostname or "-"),
        ("os/arch", f"{c.os or '-'}/{c.arch or '-'}"),
        ("fips", "yes" if c.fips else "no"),
        ("certificate serial", c.cert_serial),
        ("fingerprint (sha256)", c.cert_fingerprint_sha256 or "-"),
        ("certificate expires", when(c.cert_not_after)),
        ("enrolled", when(c.enrolled_at)),
        ("agent version", c.agent_version or "-"),
    ]
    state = _session(c) + (f" (said goodbye: {s.goodbye_reason})" if s.goodbye_reason else "")
    session = [
        ("state", state),
        ("protocol", str(s.protocol_version) if s.protocol_version else "-"),
        ("session id", s.session_id or "-"),
        ("established", when(s.established_at)),
        ("last heartbeat", f"{heartbeat} ago" if heartbeat != "never" else "never"),
        ("transport", s.transport or "-"),
        ("queue depth", c.queue_depth),
        ("vault mode (running)", running_vault),
    ]
    recorded = _VAULT_LABEL.get(c.vault_mode, "-")
    if c.vault_integration_id:
        recorded += f" via {c.vault_integration_id} (secret id v{c.vault_secret_version})"
    print(f"Collector {c.collector_id}\n")
    print("Identity\n" + _indent(fields(identity)))
    print("\nLive session\n" + _indent(fields(session)))
    print(f"\nCredential vault\n  recorded: {recorded}   running: {running_vault}")
    u = c.update
    agent = [
        ("running", u.running_version or "-"),
        ("latest", u.latest_version or "-"),
        ("policy", f"{u.policy or '-'} ({u.channel or 'stable'} channel)"),
        ("status", _BADGE.get(u.badge) or ("up to date" if u.badge == pb.UPDATE_BADGE_UP_TO_DATE else "-")),
        ("target", u.target_version or "-"),
        ("approved", u.approved_version or "-"),
    ]
    if u.state:
        report = f"{u.state} {u.state_version}" + (f": {u.detail}" if u.detail else "")
        agent.append(("last report", f"{report} ({when(u.state_at)})"))
    print("\nAgent version\n" + _indent(fields(agent)))
    print("\nDriver capabilities")
    if not c.drivers:
        print("  (none reported)")
    for d in c.drivers:
        print(f"\n  {d.provider} (max concurrency {d.max_concurrency})")
        rows = [
            (o.name, o.op_class, f"{o.timeout_s}s", "yes" if o.parallel_safe else "no") for o in d.operations
        ]
        print(_indent(table(["OPERATION", "CLASS", "TIMEOUT", "PARALLEL-SAFE"], rows), 4))


def _indent(text: str, n: int = 2) -> str:
    return "\n".join(" " * n + line for line in text.splitlines())


def run_collectors(settings: Settings, args: argparse.Namespace) -> int:
    cid = getattr(args, "collector_id", "")
    if args.action == "list":
        found: list[pb.Collector] = []
        page = ""
        while True:
            request = pb.ListCollectorsRequest(
                site_id=args.site, query=args.query, page_token=page, outdated=args.outdated,
                status=STATUS_FILTER.get(args.status or "", pb.COLLECTOR_STATUS_UNSPECIFIED),
                session_state=SESSION_FILTER.get(args.session or "", pb.SESSION_STATE_UNSPECIFIED),
                agent_version=args.version, driver=args.driver,
            )  # fmt: skip
            if args.expiring is not None:
                request.expiring_within.FromTimedelta(args.expiring)
            reply = _call(settings, "ListCollectors", request)
            found.extend(reply.collectors)
            page = reply.next_page_token
            if not page:
                break
        if args.json:
            print_json(pb.ListCollectorsResponse(collectors=found, outdated_count=reply.outdated_count))
        else:
            print_collectors(found)
            if reply.outdated_count:
                print(f"\n{reply.outdated_count} collector(s) behind the latest release "
                      "(versus-cp collectors list --outdated)")  # fmt: skip
        return 0
    if args.action == "probe":
        probe = _call(settings, "ProbeCollector", pb.ProbeCollectorRequest(collector_id=cid))
        if args.json:
            print_json(probe)
        else:
            heartbeat = age(probe.heartbeat_age_s if probe.HasField("heartbeat_age_s") else None)
            verdict = "reachable" if probe.reachable else "NOT reachable"
            state = enum_name(probe.session_state, pb.SessionState, "SESSION_STATE_")
            print(f"{cid}: {verdict} (last heartbeat {heartbeat}{' ago' if heartbeat != 'never' else ''}); "
                  f"session {state}; queue depth {probe.queue_depth}")  # fmt: skip
        return 0 if probe.reachable else EXIT_UNREACHABLE
    requests: dict[str, tuple[str, Any]] = {
        "show": ("GetCollector", pb.GetCollectorRequest(collector_id=cid)),
        "approve": ("ApproveCollector", pb.ApproveCollectorRequest(collector_id=cid)),
        "drain": ("DrainCollector", pb.DrainCollectorRequest(collector_id=cid)),
        "undrain": ("UndrainCollector", pb.UndrainCollectorRequest(collector_id=cid)),
    }
    if args.action in ("deny", "revoke"):
        kind = pb.DenyCollectorRequest if args.action == "deny" else pb.RevokeCollectorRequest
        requests[args.action] = (
            f"{args.action.title()}Collector",
            kind(collector_id=cid, reason=args.reason),
        )
    if args.action == "vault-mode":
        requests["vault-mode"] = (
            "SetVaultMode",
            pb.SetVaultModeRequest(
                collector_id=cid,
                vault_mode=VAULT_MODES[args.mode],
                integration_id=args.integration,
                secret_id=_secret_id(args.secret_id_file),
            ),
        )
    if args.action == "update":
        requests["update"] = (
            ("ApplyUpdate", pb.ApplyUpdateRequest(collector_id=cid, target_version=args.version))
            if args.step == "apply"
            else ("CancelUpdate", pb.CancelUpdateRequest(collector_id=cid))
        )
    method, request = requests[args.action]
    reply = _call(settings, method, request)
    if args.json:
        print_json(reply)
    elif args.action == "show":
        print_detail(reply.collector)
    else:
        print_collectors([reply.collector])
        if args.action == "vault-mode":
            print("\nSaved. A connected collector restarts to apply it on its next claim.")
        if args.action == "update" and args.step == "apply":
            approved = reply.collector.update.approved_version
            print(f"\nApproved {approved}: the collector's supervisor installs it after its next claim "
                  "(docs/upgrades.md).")  # fmt: skip
    return 0


def _secret_id(path: Path | None) -> str:
    """The secret id from a file or stdin ('-'); empty when none was given."""
    if path is None:
        return ""
    return (sys.stdin.read() if str(path) == "-" else path.read_text()).strip()


def add_integration_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    create = sub.add_parser("create", help="Register a HashiCorp Vault (AppRole) that mode C collectors use.")
    create.add_argument("name")
    create.add_argument("--address", required=True, help="https:// URL the collectors reach Vault at")
    create.add_argument("--role-id", required=True, help="AppRole role id (the secret id stays on the host)")
    create.add_argument("--kv-mount", default="secret", help="KV v2 mount with device credentials")
    create.add_argument(
        "--path-prefix",
        default="versus",
        help="credentials live at <mount>/data/<prefix>/<provider>/<target_ref>",
    )
    create.add_argument("--ca-file", type=Path, help="PEM of the CA behind the Vault's TLS certificate")
    create.add_argument(
        "--plain-secret-ids",
        action="store_true",
        help="collectors' secret ids are given unwrapped (only where the Vault cannot wrap them)",
    )
    listing = sub.add_parser("list", help="List vault integrations.")
    for p in (create, listing):
        p.add_argument("--json", action="store_true")


def run_integrations(settings: Settings, args: argparse.Namespace) -> int:
    if args.action == "create":
        plain = args.plain_secret_ids
        request = pb.CreateVaultIntegrationRequest(
            name=args.name, address=args.address, role_id=args.role_id, kv_mount=args.kv_mount,
            path_prefix=args.path_prefix, ca_pem=args.ca_file.read_text() if args.ca_file else "",
            secret_id_delivery=pb.SECRET_ID_DELIVERY_PLAIN if plain else pb.SECRET_ID_DELIVERY_WRAPPED,
        )  # fmt: skip
        reply = _call(settings, "CreateVaultIntegration", request)
        items = [reply.integration]
    else:
        reply = _call(settings, "ListVaultIntegrations", pb.ListVaultIntegrationsRequest())
        items = list(reply.integrations)
    if args.json:
        print_json(reply)
    else:
        plain_ids = pb.SECRET_ID_DELIVERY_PLAIN
        rows = [
            (i.integration_id, i.name, i.address, f"{i.kv_mount}/{i.path_prefix}",
             "plain" if i.secret_id_delivery == plain_ids else "wrapped", when(i.created_at))
            for i in items
        ]  # fmt: skip
        print_table(["INTEGRATION", "NAME", "ADDRESS", "KV PATH", "SECRET IDS", "CREATED"], rows)
    return 0
