"""`versus-cp ca`: rotate the Collector CA and the gateway CA with overlap; see who depends on which.

    versus-cp ca status [--json]
    versus-cp ca rotate --ca collector|gateway
    versus-cp ca activate --ca collector|gateway CA_ID [--force]
    versus-cp ca retire --ca collector|gateway CA_ID [--force]
    versus-cp ca issue-server-cert --name NAME [--name NAME ...] --out DIR [--stem STEM]

A rotation is three steps (docs/day2.md). ``rotate`` adds a new CA beside the
old one: a new version of the trust bundle, which collectors receive, signed,
with their next claim. ``activate`` makes it the CA that issues: for the
Collector CA, new certificates and every collector's next renewal (collectors
holding a certificate of another CA renew within minutes); for the gateway CA,
the gateway's server certificate, which the gateway reissues and loads at
once — so it is refused while a live collector does not yet hold a bundle with
the new CA (it could no longer connect). ``retire`` drops the old CA: refused
for the active one, and for a Collector CA while live collectors hold a
certificate it issued. ``--force`` overrides the fleet checks, naming who is
left behind. ``status`` shows the CAs and, from the running control plane,
which bundle version each collector holds and who issued its certificate.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from pathlib import Path
from typing import Any, cast

from versus.fleet.v1 import fleet_pb2

from common.config.settings import Settings
from common.config.state_dir import write_private, write_public
from common.errors import FailedPrecondition
from common.trust.ca_store import KINDS, CaStore, Kind, Trust
from common.trust.pki import spki_pin
from common.trust.tls import issue_server_cert, san_entries
from versus_cp import material_cmd, rpc

# Collectors that can still connect: not revoked or denied, certificate not expired.
_GONE = (
    fleet_pb2.COLLECTOR_STATUS_REVOKED,
    fleet_pb2.COLLECTOR_STATUS_DENIED,
    fleet_pb2.COLLECTOR_STATUS_EXPIRED,
)
_SHOWN = 5


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="ca_action", required=True, metavar="ACTION")
    issue = sub.add_parser(
        "issue-server-cert",
        help="Issue a server certificate from the active gateway CA (gateways and the load balancer "
        "in front of them, when several hosts serve; docs/deployment.md).",
    )
    issue.add_argument(
        "--name", action="append", required=True, help="DNS name or IP address; repeat (the first is the CN)."
    )
    issue.add_argument("--out", type=Path, required=True, help="Directory to write the files to.")
    issue.add_argument(
        "--stem",
        default="server",
        help="File names: STEM.pem (certificate, then the CA), STEM.key, STEM.bundle.pem (all three, "
        "as HAProxy's crt takes them). Default: server.",
    )
    status = sub.add_parser("status", help="The CAs, the bundle version and which collectors depend on what.")
    status.add_argument("--json", action="store_true")
    rotate = sub.add_parser("rotate", help="Add a new CA beside the current one (not issuing yet).")
    rotate.add_argument("--ca", choices=KINDS, required=True, dest="kind")
    for name, text in (
        ("activate", "Make a CA the one that issues."),
        ("retire", "Drop a CA from the trust bundle and delete its key."),
    ):
        action = sub.add_parser(name, help=text)
        action.add_argument("--ca", choices=KINDS, required=True, dest="kind")
        action.add_argument("ca_id", metavar="CA_ID")
        action.add_argument(
            "--force", action="store_true", help="Skip the check that no live collector is left behind."
        )


def run(settings: Settings, args: argparse.Namespace) -> int:
    if args.ca_action == "status":
        return _status(settings, CaStore(material_cmd.current_state(settings)), args.json)
    if args.ca_action == "issue-server-cert":
        return _issue_server_cert(CaStore(material_cmd.current_state(settings)), args)
    # In shared mode the change becomes the next version every replica follows.
    with material_cmd.editing(settings) as state:
        return _change(settings, CaStore(state), args)


def _change(settings: Settings, store: CaStore, args: argparse.Namespace) -> int:
    kind = cast(Kind, args.kind)
    _check_managed(settings, kind)
    if args.ca_action == "rotate":
        trust = store.rotate(kind)
        new = trust.cas[kind][-1]
        print(f"{kind} CA {new.ca_id} added (bundle version {trust.version}); activate it once "
              f"`versus-cp ca status` shows every collector holds version {trust.version}")  # fmt: skip
        return 0
    trust = store.load_or_create()
    entry = trust.entry(kind, args.ca_id)
    if entry is None:
        raise FailedPrecondition(f"{args.ca_id} is not a {kind} CA", code="ca_not_found")
    if args.ca_action == "activate":
        if kind == "gateway" and trust.active[kind] != args.ca_id:
            _refuse_if_left_behind(
                _not_holding(_collectors(settings), entry.added_in),
                args.force,
                "ca_not_held",
                f"collectors without bundle version {entry.added_in} yet could not reach the gateway",
            )
        trust = store.activate(kind, args.ca_id)
        print(f"{kind} CA {args.ca_id} is active (bundle version {trust.version})")
        return 0
    if kind == "collector" and trust.active[kind] != args.ca_id:
        _refuse_if_left_behind(
            _issued_by(_collectors(settings), args.ca_id),
            args.force,
            "ca_in_use",
            f"live collectors hold certificates {args.ca_id} issued; they renew under the active CA soon",
        )
    trust = store.retire(kind, args.ca_id)
    print(f"{kind} CA {args.ca_id} retired (bundle version {trust.version})")
    return 0


def _issue_server_cert(store: CaStore, args: argparse.Namespace) -> int:
    names: list[str] = args.name
    chain, key = issue_server_cert(store, names[0], san_entries(names))
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True, mode=0o700)
    write_private(out / f"{args.stem}.key", key)
    write_public(out / f"{args.stem}.pem", chain)
    write_private(out / f"{args.stem}.bundle.pem", chain + key)
    active = store.load().active["gateway"]
    print(f"server certificate for {', '.join(names)} from gateway CA {active} written to "
          f"{out}/{args.stem}.*; issue again after the gateway CA is rotated and activated")  # fmt: skip
    return 0


def _check_managed(settings: Settings, kind: Kind) -> None:
    supplied = (
        settings.collector_ca_cert_file is not None
        if kind == "collector"
        else settings.gateway_ca_file is not None or settings.tls_cert_file is not None
    )
    if supplied:
        raise FailedPrecondition(
            f"the {kind} CA is supplied by the operator (configuration files); rotate it there",
            code="ca_operator_supplied",
        )


def _refuse_if_left_behind(ids: list[str], force: bool, code: str, why: str) -> None:
    if not ids:
        return
    named = ", ".join(sorted(ids)[:_SHOWN]) + (" ..." if len(ids) > _SHOWN else "")
    if not force:
        raise FailedPrecondition(f"{len(ids)} {why}: {named} (--force to go ahead anyway)", code=code)
    print(f"going ahead with --force; left behind: {named}")


def _collectors(settings: Settings) -> list[Any]:
    return [c for c in rpc.all_collectors(settings) if c.status not in _GONE]


def _held(c: Any) -> int | None:
    version = c.session.key_versions.get("trust")
    return int(version) if version else None


def _not_holding(collectors: list[Any], version: int) -> list[str]:
    return [c.collector_id for c in collectors if (_held(c) or 0) < version]


def _issued_by(collectors: list[Any], ca_id: str) -> list[str]:
    return [c.collector_id for c in collectors if c.cert_issuer == ca_id]


def _status(settings: Settings, store: CaStore, as_json: bool) -> int:
    trust = store.load_or_create()
    collectors = _collectors(settings)
    out: dict[str, Any] = {"version": trust.version}
    out.update({kind: _kind_status(trust, kind, collectors) for kind in KINDS})
    held: dict[str, list[str]] = {}
    for c in collectors:
        label = str(_held(c) or "unknown")
        held.setdefault(label, []).append(c.collector_id)
    out["held_by"] = {label: sorted(ids) for label, ids in sorted(held.items())}
    if as_json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"trust bundle version {trust.version}")
    for kind in KINDS:
        print(f"{kind} CAs:")
        for ca in out[kind]["cas"]:
            users = f"  {len(ca['issued_to'])} live certificates" if kind == "collector" else ""
            print(f"  {ca['id']}  {'active' if ca['active'] else 'trusted':7}  since bundle {ca['added_in']}"
                  f"  until {ca['not_after']}{users}")  # fmt: skip
    for label, ids in out["held_by"].items():
        who = (
            f"collectors holding bundle version {label}"
            if label != "unknown"
            else "collectors not heard from"
        )
        print(f"  {len(ids):5}  {who}: {', '.join(ids[:_SHOWN])}{' ...' if len(ids) > _SHOWN else ''}")
    return 0


def _kind_status(trust: Trust, kind: Kind, collectors: list[Any]) -> dict[str, Any]:
    cas = []
    for entry in trust.cas[kind]:
        item: dict[str, Any] = {
            "id": entry.ca_id,
            "active": entry.ca_id == trust.active[kind],
            "added_in": entry.added_in,
            "not_after": entry.cert.not_valid_after_utc.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "pin": spki_pin(entry.cert),
        }
        if kind == "collector":
            item["issued_to"] = sorted(_issued_by(collectors, entry.ca_id))
        cas.append(item)
    return {"active": trust.active[kind], "cas": cas}
