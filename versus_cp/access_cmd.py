"""API tokens and the audit log (served by the router's AccessService):

    versus-cp access create NAME --role viewer|operator|collector-admin|service [--ttl SECONDS]
    versus-cp access create NAME --role platform (--tenant T [--tenant T ...] | --all-tenants) [--ttl SECONDS]
    versus-cp access list
    versus-cp access revoke TOKEN_ID
    versus-cp access whoami
    versus-cp access bootstrap            # needs DATABASE_URL; no API token required
    versus-cp audit list [--subject-type T] [--subject ID] [--actor A] [--action PREFIX]
                         [--since TIME] [--until TIME] [--limit N]

Every command takes ``--json``. A created token is shown once.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from typing import Any

from google.protobuf.json_format import MessageToDict
from versus.access.v1 import access_pb2 as pb
from versus.access.v1 import access_pb2_grpc

from common.access.rbac import Role
from common.config.settings import Settings
from common.errors import ConfigError
from common.grpc.pb_struct import integral
from versus_cp import rpc
from versus_cp.output import enum_name, print_json, print_table, when

ROLES = {
    Role.VIEWER.value: pb.ROLE_VIEWER,
    Role.OPERATOR.value: pb.ROLE_OPERATOR,
    Role.COLLECTOR_ADMIN.value: pb.ROLE_COLLECTOR_ADMIN,
    Role.PLATFORM.value: pb.ROLE_PLATFORM,
    Role.SERVICE.value: pb.ROLE_SERVICE,
}


def _call(settings: Settings, method: str, request: Any) -> Any:
    return rpc.call(settings, settings.router_address, access_pb2_grpc.AccessServiceStub, method, request)


def _role(value: int) -> str:
    return enum_name(value, pb.Role, "ROLE_")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    create = sub.add_parser("create", help="Create an API token; the plaintext is shown once.")
    create.add_argument("name")
    create.add_argument("--role", required=True, choices=list(ROLES))
    create.add_argument("--ttl", type=int, default=0, help="lifetime in seconds (default: no expiry)")
    create.add_argument(
        "--tenant", action="append", default=[], dest="tenants", metavar="TENANT",
        help="platform tokens: a tenant the token may act for (repeat for several)",
    )  # fmt: skip
    create.add_argument(
        "--all-tenants", action="store_true", help="platform tokens: act for every tenant, deliberately"
    )
    listing = sub.add_parser("list", help="List API tokens (never their plaintext).")
    revoke = sub.add_parser("revoke", help="Revoke an API token (takes effect within 5 s everywhere).")
    revoke.add_argument("token_id")
    whoami = sub.add_parser("whoami", help="Show the token this command line presents.")
    bootstrap = sub.add_parser(
        "bootstrap", help="Create the first collector-admin token directly in DATABASE_URL (once)."
    )
    for p in (create, listing, revoke, whoami, bootstrap):
        p.add_argument("--json", action="store_true")


def _scope(role: int, tenants: Any, all_tenants: bool) -> str:
    if role != pb.ROLE_PLATFORM:
        return "fleet"
    if all_tenants:
        return "all tenants"
    return ",".join(tenants) or "unscoped (legacy)"


def _print_tokens(tokens: list[pb.ApiToken]) -> None:
    rows = [
        (t.token_id, t.name, _role(t.role), _scope(t.role, t.tenants, t.all_tenants), t.display_prefix + "…",
         when(t.created_at), when(t.expires_at), "revoked" if t.revoked_at.seconds else "active")
        for t in tokens
    ]  # fmt: skip
    print_table(["TOKEN", "NAME", "ROLE", "SCOPE", "PREFIX", "CREATED", "EXPIRES", "STATE"], rows)


def run(settings: Settings, args: argparse.Namespace) -> int:
    if args.action == "bootstrap":
        return _bootstrap(settings, args.json)
    if args.action == "create":
        reply = _call(
            settings,
            "CreateApiToken",
            pb.CreateApiTokenRequest(
                name=args.name,
                role=ROLES[args.role],
                ttl_seconds=args.ttl,
                tenants=args.tenants,
                all_tenants=args.all_tenants,
            ),
        )
        if args.json:
            print_json(reply)
        else:
            _print_tokens([reply.token])
            print(f"\nThe token is shown only this once:\n\n  {reply.plaintext}\n")
        return 0
    if args.action == "list":
        reply = _call(settings, "ListApiTokens", pb.ListApiTokensRequest())
        print_json(reply) if args.json else _print_tokens(list(reply.tokens))
        return 0
    if args.action == "revoke":
        reply = _call(settings, "RevokeApiToken", pb.RevokeApiTokenRequest(token_id=args.token_id))
        print_json(reply) if args.json else _print_tokens([reply.token])
        return 0
    reply = _call(settings, "WhoAmI", pb.WhoAmIRequest())
    scope = _scope(reply.role, reply.tenants, reply.all_tenants)
    print_json(reply) if args.json else print(
        f"{reply.name} ({reply.token_id}): {_role(reply.role)}, {scope}"
    )
    return 0


def _bootstrap(settings: Settings, as_json: bool) -> int:
    from versus_cp.access_bootstrap import ensure

    if not settings.database_url:
        raise ConfigError(
            "access bootstrap needs DATABASE_URL (`versus-cp up` bootstraps the embedded database)"
        )
    result = ensure(settings.database_url, settings.model_copy(update={"service_token": None}), service=False)
    if as_json:
        print(json.dumps({"created": result.admin_token is not None, "file": str(result.admin_token_file),
                          "token": result.admin_token}))  # fmt: skip
    elif result.admin_token is None:
        print("a collector-admin token already exists; nothing created (use `versus-cp access create`)")
    else:
        print(f"collector-admin token (shown once, saved 0600 to {result.admin_token_file}):")
        print(f"\n  {result.admin_token}\n")
    return 0


def add_audit_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = sub.add_parser("list", help="Audit events, newest first.")
    listing.add_argument("--subject-type", default="", help="e.g. collector, task, site, api_token")
    listing.add_argument("--subject", default="", help="subject id")
    listing.add_argument("--actor", default="")
    listing.add_argument("--action", dest="action_prefix", default="", help="action prefix, e.g. collector.")
    listing.add_argument("--since", type=_instant, help="at or after (ISO 8601, UTC unless it says)")
    listing.add_argument("--until", type=_instant, help="before (ISO 8601)")
    listing.add_argument("--limit", type=int, default=50)
    listing.add_argument("--json", action="store_true")


def _instant(text: str) -> dt.datetime:
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an ISO 8601 time, e.g. 2026-12-06T08:00") from None
    return when if when.tzinfo else when.replace(tzinfo=dt.UTC)


def run_audit(settings: Settings, args: argparse.Namespace) -> int:
    events: list[pb.AuditEvent] = []
    page = ""
    while len(events) < args.limit:
        request = pb.ListAuditEventsRequest(
            subject_type=args.subject_type, subject_id=args.subject, actor=args.actor,
            action_prefix=args.action_prefix, page_size=min(500, args.limit - len(events)), page_token=page,
        )  # fmt: skip
        if args.since is not None:
            request.since.FromDatetime(args.since)
        if args.until is not None:
            request.until.FromDatetime(args.until)
        reply = _call(settings, "ListAuditEvents", request)
        events.extend(reply.events)
        page = reply.next_page_token
        if not page:
            break
    if args.json:
        print_json(pb.ListAuditEventsResponse(events=events, next_page_token=page))
        return 0
    rows = [
        (when(e.at), e.actor, e.action, f"{e.subject_type}:{e.subject_id}",
         json.dumps(integral(MessageToDict(e.details)), separators=(",", ":"), sort_keys=True))
        for e in events
    ]  # fmt: skip
    print_table(["AT", "ACTOR", "ACTION", "SUBJECT", "DETAILS"], rows)
    return 0
