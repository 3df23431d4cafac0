"""Operator commands served by the Enrollment Service:

    versus-cp sites create NAME --tenant T [--update-policy manual|auto|pinned] [--pinned-version V]
                                   [--channel stable|beta]
    versus-cp sites list [--tenant T]
    versus-cp sites update SITE_ID [--name N] [--update-policy P] [--pinned-version V] [--channel C]
    versus-cp sites delete SITE_ID
    versus-cp tokens issue --site SITE_ID [--max-uses N] [--ttl SECONDS] [--manual-approval]
    versus-cp tokens list [--site SITE_ID]
    versus-cp tokens revoke TOKEN_ID [--with-collectors]

Every command takes ``--json`` for machine-readable output.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from typing import Any

from google.protobuf.json_format import MessageToDict
from versus.enrollment.v1 import enrollment_pb2 as pb
from versus.enrollment.v1 import enrollment_pb2_grpc

from common.config.settings import Settings
from enrollment.tokens import DEFAULT_TTL, MAX_TTL, MAX_USES_LIMIT
from versus_cp import rpc

_POLICIES = {
    "manual": pb.UPDATE_POLICY_MANUAL,
    "auto": pb.UPDATE_POLICY_AUTO,
    "pinned": pb.UPDATE_POLICY_PINNED,
}
_POLICY_NAMES = {v: k for k, v in _POLICIES.items()}
_CHANNELS = {"stable": pb.UPDATE_CHANNEL_STABLE, "beta": pb.UPDATE_CHANNEL_BETA}
_CHANNEL_NAMES = {v: k for k, v in _CHANNELS.items()}
_TOKEN_STATUS = {
    pb.TOKEN_STATUS_ACTIVE: "active",
    pb.TOKEN_STATUS_EXHAUSTED: "exhausted",
    pb.TOKEN_STATUS_EXPIRED: "expired",
    pb.TOKEN_STATUS_REVOKED: "revoked",
}


def _call(settings: Settings, method: str, request: Any) -> Any:
    return rpc.call(
        settings, settings.enrollment_address, enrollment_pb2_grpc.EnrollmentServiceStub, method, request
    )


def json_dict(message: Any) -> Any:
    """``message`` as ``--json`` prints it: proto field names, fields at their defaults left out."""
    return MessageToDict(message, preserving_proto_field_name=True)


def _json(message: Any) -> None:
    print(json.dumps(json_dict(message), indent=2))


def add_site_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    create = sub.add_parser("create", help="Create a site (a reachability domain).")
    create.add_argument("name")
    create.add_argument("--tenant", required=True)
    create.add_argument("--update-policy", choices=list(_POLICIES), default="manual")
    create.add_argument("--pinned-version")
    create.add_argument("--channel", choices=list(_CHANNELS), default="stable",
                        help="release channel the auto policy follows")  # fmt: skip
    listing = sub.add_parser("list", help="List sites with their collector counts.")
    listing.add_argument("--tenant", default="")
    upd = sub.add_parser("update", help="Rename a site or change its update policy.")
    upd.add_argument("site_id")
    upd.add_argument("--name")
    upd.add_argument("--update-policy", choices=list(_POLICIES))
    upd.add_argument("--pinned-version")
    upd.add_argument("--channel", choices=list(_CHANNELS))
    delete = sub.add_parser("delete", help="Delete a site (refused while collectors are enrolled in it).")
    delete.add_argument("site_id")
    for p in (create, listing, upd, delete):
        p.add_argument("--json", action="store_true")


def _print_sites(sites: list[pb.Site]) -> None:
    print(f"{'SITE':20} {'NAME':24} {'TENANT':16} {'POLICY':16} {'CHANNEL':8} COLLECTORS")
    for s in sites:
        policy = _POLICY_NAMES.get(s.update_policy, "?") + (
            f" {s.pinned_version}" if s.pinned_version else ""
        )
        channel = _CHANNEL_NAMES.get(s.update_channel, "stable")
        print(f"{s.site_id:20} {s.name:24} {s.tenant_id:16} {policy:16} {channel:8} {s.collector_count}")


def run_sites(settings: Settings, args: argparse.Namespace) -> int:
    if args.action == "create":
        reply = _call(settings, "CreateSite", pb.CreateSiteRequest(
            name=args.name, tenant_id=args.tenant, update_policy=_POLICIES[args.update_policy],
            pinned_version=args.pinned_version or "", update_channel=_CHANNELS[args.channel],
        ))  # fmt: skip
        _json(reply) if args.json else _print_sites([reply.site])
    elif args.action == "list":
        sites: list[pb.Site] = []
        page = ""
        while True:
            reply = _call(settings, "ListSites", pb.ListSitesRequest(tenant_id=args.tenant, page_token=page))
            sites.extend(reply.sites)
            page = reply.next_page_token
            if not page:
                break
        _json(pb.ListSitesResponse(sites=sites)) if args.json else _print_sites(sites)
    elif args.action == "update":
        request = pb.UpdateSiteRequest(site_id=args.site_id)
        if args.name is not None:
            request.name = args.name
        if args.update_policy is not None:
            request.update_policy = _POLICIES[args.update_policy]
        if args.pinned_version is not None:
            request.pinned_version = args.pinned_version
        if args.channel is not None:
            request.update_channel = _CHANNELS[args.channel]
        reply = _call(settings, "UpdateSite", request)
        _json(reply) if args.json else _print_sites([reply.site])
    else:
        _call(settings, "DeleteSite", pb.DeleteSiteRequest(site_id=args.site_id))
        print(json.dumps({"deleted": args.site_id}) if args.json else f"deleted {args.site_id}")
    return 0


def _seconds(delta: dt.timedelta) -> int:
    return int(delta.total_seconds())


def _positive(text: str) -> int:
    """An integer of at least 1: out-of-range values are refused, never clamped to a default."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def add_token_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    issue = sub.add_parser("issue", help="Issue an enrollment token; the plaintext is shown once.")
    issue.add_argument("--site", required=True)
    issue.add_argument("--max-uses", type=_positive, default=1, help=f"1-{MAX_USES_LIMIT} (default 1)")
    issue.add_argument(
        "--ttl",
        type=_positive,
        default=_seconds(DEFAULT_TTL),
        help=f"lifetime in seconds (default {_seconds(DEFAULT_TTL)}, max {_seconds(MAX_TTL)})",
    )
    issue.add_argument(
        "--manual-approval", action="store_true", help="collectors wait for an operator to approve"
    )
    listing = sub.add_parser("list", help="List tokens with status and uses remaining.")
    listing.add_argument("--site", default="")
    revoke = sub.add_parser("revoke", help="Revoke a token before it expires.")
    revoke.add_argument("token_id")
    revoke.add_argument(
        "--with-collectors",
        action="store_true",
        help="also revoke every pending or active collector this token enrolled (a leaked token)",
    )
    for p in (issue, listing, revoke):
        p.add_argument("--json", action="store_true")


def _print_tokens(tokens: list[pb.EnrollmentToken]) -> None:
    print(f"{'TOKEN':22} {'SITE':18} {'PREFIX':12} {'STATUS':10} {'USES LEFT':9} {'APPROVAL':8} EXPIRES")
    for t in tokens:
        approval = "manual" if t.approval_mode == pb.APPROVAL_MODE_MANUAL else "auto"
        expires = t.expires_at.ToJsonString()
        left = f"{t.max_uses - t.uses}/{t.max_uses}"
        status = _TOKEN_STATUS.get(t.status, "?")
        prefix = t.display_prefix + "…"
        print(f"{t.token_id:22} {t.site_id:18} {prefix:12} {status:10} {left:9} {approval:8} {expires}")


def run_tokens(settings: Settings, args: argparse.Namespace) -> int:
    if args.action == "issue":
        mode = pb.APPROVAL_MODE_MANUAL if args.manual_approval else pb.APPROVAL_MODE_AUTO
        request = pb.IssueEnrollmentTokenRequest(
            site_id=args.site,
            max_uses=args.max_uses,
            ttl_seconds=args.ttl,
            approval_mode=mode,
        )
        reply = _call(settings, "IssueEnrollmentToken", request)
        if args.json:
            _json(reply)
        else:
            _print_tokens([reply.token])
            print("\nThe token is shown only this once:\n")
            print(f"  {reply.plaintext}\n")
            print("On the collector host run the command below and paste the token when asked")
            print("(or save it in a file readable only by you and pass --token-file FILE):\n")
            print(f"  {reply.enroll_command}\n")
    elif args.action == "list":
        reply = _call(settings, "ListEnrollmentTokens", pb.ListEnrollmentTokensRequest(site_id=args.site))
        _json(reply) if args.json else _print_tokens(list(reply.tokens))
    else:
        revoke = pb.RevokeEnrollmentTokenRequest(token_id=args.token_id, with_collectors=args.with_collectors)
        reply = _call(settings, "RevokeEnrollmentToken", revoke)
        if args.json:
            _json(reply)
        else:
            _print_tokens([reply.token])
            if args.with_collectors:
                revoked = ", ".join(reply.revoked_collector_ids) or "none"
                print(f"\ncollectors it enrolled, revoked now: {revoked}")
    return 0
