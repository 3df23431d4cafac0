"""Device credentials (the router's CredentialService): vault mode B's store, and taking a
credential back from running tasks:

    versus-cp credentials put PROVIDER:TARGET --tenant T [--file PATH]   # the value: a JSON object,
                                                                        # from stdin or the file
    versus-cp credentials delete PROVIDER:TARGET --tenant T
    versus-cp credentials list [--tenant T]          # references, versions, field names; no values
    versus-cp credentials rewrap                     # after a master key rotation (docs/vault.md)
    versus-cp credentials revoke PROVIDER:TARGET [--kill] [--reason TEXT] [--wait SECONDS]
    versus-cp credentials show REVOCATION_ID
    versus-cp credentials revocations [--ref PROVIDER:TARGET] [--limit N]

Values come from standard input or a file, never the command line, and are never printed.

``revoke`` asks every collector running work on the device to wipe the credential its driver
holds (``--kill``: and stop those tasks), and prints where each collector stands: pending,
revoked (with what it scrubbed), unreachable (queued until it returns) or failed. With
``--wait`` it follows the revocation until no collector is pending, and exits 5 unless every
one revoked. Every command takes ``--json``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from versus.credential.v1 import credential_pb2 as pb
from versus.credential.v1 import credential_pb2_grpc

from common.config.settings import Settings
from versus_cp import rpc
from versus_cp.output import enum_name, print_json, print_table, when

EXIT_NOT_REVOKED = 5


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    revoke = sub.add_parser("revoke", help="Take a credential back from the tasks running with it.")
    revoke.add_argument("credential_ref", metavar="PROVIDER:TARGET")
    revoke.add_argument("--kill", action="store_true", help="also stop the tasks that held it")
    revoke.add_argument("--reason", default="")
    revoke.add_argument("--wait", type=float, default=0, metavar="SECONDS", help="follow it this long")
    show = sub.add_parser("show", help="One revocation and where each collector stands.")
    show.add_argument("revocation_id")
    put = sub.add_parser("put", help="Store or replace a device credential (vault mode B).")
    put.add_argument("credential_ref", metavar="PROVIDER:TARGET")
    put.add_argument("--tenant", required=True)
    put.add_argument("--file", type=Path, help="read the JSON object from this file instead of stdin")
    delete = sub.add_parser("delete", help="Delete a stored device credential.")
    delete.add_argument("credential_ref", metavar="PROVIDER:TARGET")
    delete.add_argument("--tenant", required=True)
    stored = sub.add_parser("list", help="Stored credentials: references, versions, field names (no values).")
    stored.add_argument("--tenant", default="")
    rewrap = sub.add_parser("rewrap", help="Wrap every stored data key with the active master key.")
    listing = sub.add_parser("revocations", help="Recent revocations, newest first.")
    listing.add_argument("--ref", default="", metavar="PROVIDER:TARGET")
    listing.add_argument("--limit", type=int, default=50)
    for p in (revoke, show, listing, put, delete, stored, rewrap):
        p.add_argument("--json", action="store_true")


def _call(settings: Settings, method: str, request: Any) -> Any:
    return rpc.call(
        settings, settings.router_address, credential_pb2_grpc.CredentialServiceStub, method, request
    )


def _state(value: int) -> str:
    return enum_name(value, pb.RevocationState, "REVOCATION_STATE_")


def _print(revocation: pb.Revocation) -> None:
    action = enum_name(revocation.action, pb.RevokeAction, "REVOKE_ACTION_")
    print(f"revocation {revocation.revocation_id} of {revocation.credential_ref} ({action}): "
          f"{_state(revocation.state)}")  # fmt: skip
    rows = [
        (t.collector_id, _state(t.state), ", ".join(f"{d}={r}" for d, r in sorted(t.results.items())) or "-",
         t.detail or "-", when(t.updated_at))
        for t in revocation.targets
    ]  # fmt: skip
    if rows:
        print_table(["COLLECTOR", "STATE", "RESULTS", "DETAIL", "UPDATED"], rows)
    else:
        print("no running task held it")


def _store_action(settings: Settings, args: argparse.Namespace) -> int:
    if args.action == "put":
        raw = args.file.read_bytes() if args.file else sys.stdin.buffer.read()
        request = pb.PutCredentialRequest(
            tenant_id=args.tenant, credential_ref=args.credential_ref, value=raw
        )
        reply = _call(settings, "PutCredential", request)
        c = reply.credential
        done = f"{c.credential_ref} stored for {c.tenant_id} (version {c.version})"
    elif args.action == "delete":
        request_d = pb.DeleteCredentialRequest(tenant_id=args.tenant, credential_ref=args.credential_ref)
        reply = _call(settings, "DeleteCredential", request_d)
        done = f"{args.credential_ref} deleted for {args.tenant}"
    elif args.action == "rewrap":
        reply = _call(settings, "RewrapCredentials", pb.RewrapCredentialsRequest())
        done = f"{reply.rewrapped} data keys wrapped again with master key {reply.active_key_id}"
    else:
        reply = _call(settings, "ListCredentials", pb.ListCredentialsRequest(tenant_id=args.tenant))
        if not args.json:
            rows = [
                (
                    c.tenant_id,
                    c.credential_ref,
                    c.version,
                    ", ".join(c.fields),
                    c.updated_by,
                    when(c.updated_at),
                )
                for c in reply.credentials
            ]
            print_table(["TENANT", "CREDENTIAL", "VERSION", "FIELDS", "BY", "UPDATED"], rows)
            return 0
        done = ""
    if args.json:
        print_json(reply)
    else:
        print(done)
    return 0


def run(settings: Settings, args: argparse.Namespace) -> int:
    if args.action in ("put", "delete", "list", "rewrap"):
        return _store_action(settings, args)
    if args.action == "revocations":
        listing = pb.ListRevocationsRequest(credential_ref=args.ref, page_size=args.limit)
        reply = _call(settings, "ListRevocations", listing)
        if args.json:
            print_json(reply)
        else:
            rows = [(r.revocation_id, r.credential_ref, _state(r.state), r.actor, when(r.created_at))
                    for r in reply.revocations]  # fmt: skip
            print_table(["REVOCATION", "CREDENTIAL", "STATE", "BY", "AT"], rows)
        return 0
    if args.action == "show":
        revocation = _call(
            settings, "GetRevocation", pb.GetRevocationRequest(revocation_id=args.revocation_id)
        )
    else:
        action = pb.REVOKE_ACTION_KILL if args.kill else pb.REVOKE_ACTION_SCRUB
        request = pb.RevokeCredentialRequest(
            credential_ref=args.credential_ref, action=action, reason=args.reason
        )
        revocation = _call(settings, "RevokeCredential", request)
        deadline = time.monotonic() + args.wait
        while revocation.revocation.state == pb.REVOCATION_STATE_PENDING and time.monotonic() < deadline:
            time.sleep(0.5)
            revocation = _call(
                settings,
                "GetRevocation",
                pb.GetRevocationRequest(revocation_id=revocation.revocation.revocation_id),
            )
    if args.json:
        print_json(revocation)
    else:
        _print(revocation.revocation)
    if args.action == "revoke" and args.wait and revocation.revocation.state != pb.REVOCATION_STATE_REVOKED:
        return EXIT_NOT_REVOKED
    return 0
