"""Tasks from the command line, as a platform module would submit them (TaskRouterService):

    versus-cp tasks submit --site S --tenant T --provider P --operation O --class CLASS --target T
                           [--params JSON | --params-file FILE] [--key K] [--deadline SECONDS]
                           [--fips] [--label K=V ...] [--feature NAME ...] [--wait]
    versus-cp tasks list [--state S ...] [--site S] [--tenant T] [--provider P] [--operation O]
                         [--target T] [--label K=V ...] [--since HOURS] [--limit N]
    versus-cp tasks get TASK_ID
    versus-cp tasks watch TASK_ID          # each state change until the task settles
    versus-cp tasks cancel TASK_ID [--reason TEXT]
    versus-cp tasks output TASK_ID [--offset N] [--follow] [--out FILE]   # streamed output

Submitting needs a platform token (``versus-cp access create NAME --role platform --tenant T``, then
``VERSUS_API_TOKEN``); list, get and watch work with any viewer, cancel with an operator. Every
command takes ``--json``. ``watch`` and ``submit --wait`` exit 0 when the task succeeded and
5 when it settled otherwise (failed, expired, cancelled or indeterminate).
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import secrets
import sys
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.timestamp_pb2 import Timestamp
from versus.router.v1 import task_pb2, task_router_pb2_grpc
from versus.router.v1 import task_router_pb2 as pb

from common.config.settings import Settings
from common.errors import InvalidArgument
from common.grpc import token_files
from common.grpc.client import sync_channel
from versus_cp import rpc
from versus_cp.output import enum_name, fields, print_json, print_table, when

CLASSES = {
    "read": task_pb2.OP_CLASS_READ,
    "mutate_reconcilable": task_pb2.OP_CLASS_MUTATE_RECONCILABLE,
    "mutate_terminal": task_pb2.OP_CLASS_MUTATE_TERMINAL,
}
SETTLED = frozenset(
    {
        task_pb2.TASK_STATE_SUCCESS,
        task_pb2.TASK_STATE_FAILED,
        task_pb2.TASK_STATE_EXPIRED,
        task_pb2.TASK_STATE_CANCELLED,
        task_pb2.TASK_STATE_INDETERMINATE,
    }
)
STATES = [name.removeprefix("TASK_STATE_").lower() for name, v in task_pb2.TaskState.items() if v]
EXIT_NOT_SUCCESS = 5
PAGE = 500
DEFAULT_DEADLINE_S = 300


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    submit = sub.add_parser("submit", help="Submit a task (needs a platform token).")
    submit.add_argument("--site", required=True)
    submit.add_argument("--tenant", required=True)
    submit.add_argument("--provider", required=True)
    submit.add_argument("--operation", required=True)
    submit.add_argument("--class", dest="op_class", required=True, choices=list(CLASSES))
    submit.add_argument("--target", required=True, help="the device (target_ref)")
    params = submit.add_mutually_exclusive_group()
    params.add_argument("--params", default="", help="parameters as JSON text (sent as its bytes)")
    params.add_argument("--params-file", type=Path, help="parameters: this file's bytes")
    submit.add_argument("--key", default="", help="idempotency key (default: a new random one)")
    submit.add_argument(
        "--deadline",
        type=int,
        default=DEFAULT_DEADLINE_S,
        help=f"seconds from now (default {DEFAULT_DEADLINE_S})",
    )
    submit.add_argument("--fips", action="store_true", help="only a FIPS collector may run it")
    submit.add_argument("--label", action="append", default=[], metavar="K=V")
    submit.add_argument(
        "--feature", action="append", default=[], metavar="NAME",
        help="a collector feature the task needs, e.g. cancel (docs/protocol.md, floors)",
    )  # fmt: skip
    submit.add_argument("--wait", action="store_true", help="watch the task until it settles")
    listing = sub.add_parser("list", help="Tasks in every state, newest first (queued ones with why).")
    listing.add_argument(
        "--state", action="append", default=[], choices=STATES, help="only these states (repeatable)"
    )
    for name in ("site", "tenant", "provider", "operation", "target"):
        listing.add_argument(f"--{name}", default="")
    listing.add_argument("--label", action="append", default=[], metavar="K=V", help="labels it holds")
    listing.add_argument("--since", type=float, default=0, metavar="HOURS", help="created in the last HOURS")
    listing.add_argument("--limit", type=int, default=50, help="at most this many (default 50)")
    get = sub.add_parser("get", help="A task with its history.")
    get.add_argument("task_id")
    watch = sub.add_parser("watch", help="Print each state change until the task settles.")
    watch.add_argument("task_id")
    cancel = sub.add_parser(
        "cancel", help="Cancel a task (one a collector holds is asked to stop it; protocol 3)."
    )
    cancel.add_argument("task_id")
    cancel.add_argument("--reason", default="")
    output = sub.add_parser("output", help="Write a task's streamed output (protocol 4) to stdout or a file.")
    output.add_argument("task_id")
    output.add_argument("--offset", type=int, default=0, help="start at this byte (default 0)")
    output.add_argument(
        "--follow", action="store_true", help="keep writing as output arrives, until the task ends"
    )
    output.add_argument("--out", type=Path, help="write here instead of stdout")
    for p in (submit, listing, get, watch, cancel):
        p.add_argument("--json", action="store_true")


def _call(settings: Settings, method: str, request: Any) -> Any:
    return rpc.call(
        settings, settings.router_address, task_router_pb2_grpc.TaskRouterServiceStub, method, request
    )


def _state(value: int) -> str:
    return enum_name(value, task_pb2.TaskState, "TASK_STATE_")


def _labels(items: list[str]) -> dict[str, str]:
    labels = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InvalidArgument(f"--label {item!r} is not K=V", code="labels_invalid")
        labels[key] = value
    return labels


def _list(settings: Settings, args: argparse.Namespace) -> int:
    since = None
    if args.since:
        since = Timestamp()
        since.FromDatetime(dt.datetime.now(dt.UTC) - dt.timedelta(hours=args.since))
    found: list[task_pb2.Task] = []
    page = ""
    while len(found) < args.limit:
        request = pb.ListTasksRequest(
            states=[task_pb2.TaskState.Value(f"TASK_STATE_{s.upper()}") for s in args.state],
            site_id=args.site, tenant_id=args.tenant, provider=args.provider, operation=args.operation,
            target_ref=args.target, labels=_labels(args.label), created_after=since,
            page_size=min(PAGE, args.limit - len(found)), page_token=page,
        )  # fmt: skip
        reply = _call(settings, "ListTasks", request)
        found.extend(reply.tasks)
        page = reply.next_page_token
        if not page:
            break
    if args.json:
        print_json(pb.ListTasksResponse(tasks=found, next_page_token=page))
        return 0
    rows = [
        (t.task_id, _state(t.state), t.condition or t.error_code, t.site_id, t.target_ref,
         f"{t.provider}/{t.operation}", when(t.created_at))
        for t in found
    ]  # fmt: skip
    print_table(["TASK", "STATE", "WHY", "SITE", "TARGET", "OPERATION", "CREATED"], rows)
    return 0


def _submit_request(args: argparse.Namespace) -> pb.SubmitTaskRequest:
    if args.params_file is not None:
        try:
            params = args.params_file.read_bytes()
        except OSError as exc:
            raise InvalidArgument(
                f"cannot read {args.params_file}: {exc.strerror}", code="params_invalid"
            ) from None
    else:
        if args.params:
            try:
                json.loads(args.params)
            except ValueError:
                raise InvalidArgument("--params is not JSON (use --params-file for other bytes)",
                                      code="params_invalid") from None  # fmt: skip
        params = args.params.encode()
    labels = _labels(args.label)
    if args.deadline < 1:
        raise InvalidArgument("--deadline must be at least 1 second", code="deadline_past")
    deadline = Timestamp()
    deadline.FromDatetime(dt.datetime.now(dt.UTC) + dt.timedelta(seconds=args.deadline))
    return pb.SubmitTaskRequest(
        provider=args.provider, operation=args.operation, op_class=CLASSES[args.op_class],
        target_ref=args.target, site_id=args.site, tenant_id=args.tenant, params=params,
        idempotency_key=args.key or f"cli-{secrets.token_hex(12)}", deadline=deadline,
        requires_fips=args.fips, labels=labels, features=sorted(set(args.feature)),
    )  # fmt: skip


def _print_task(task: task_pb2.Task) -> None:
    print(fields([
        ("task", task.task_id), ("state", _state(task.state)),
        ("operation", f"{task.provider}/{task.operation}"), ("target", task.target_ref),
        ("site / tenant", f"{task.site_id} / {task.tenant_id}"), ("idempotency key", task.idempotency_key),
        ("attempts", task.attempts), ("deadline", when(task.deadline)),
        ("error", task.error_code or "-"), ("condition", task.condition or "-"),
        ("features", ", ".join(task.features) or "-"),
        ("cancel requested", when(task.cancel_requested_at) if task.HasField("cancel_requested_at") else "-"),
    ]))  # fmt: skip
    if task.evidence:
        print(f"\nEvidence\n  {task.evidence}")
    if task.result:
        print(f"\nResult\n  {task.result.decode(errors='replace')}")
    if task.history:
        print("\nHistory")
        rows = [(when(h.at), _state(h.from_state), _state(h.to_state), h.reason) for h in task.history]
        print_table(["AT", "FROM", "TO", "REASON"], rows)


def _watch(settings: Settings, task_id: str, as_json: bool) -> int:
    """Follow WatchTask until the task settles; the exit status says how it ended."""
    address = settings.router_address
    with sync_channel(address, token_files.operator_token(settings)) as channel:
        stub = task_router_pb2_grpc.TaskRouterServiceStub(channel)
        last: task_pb2.Task | None = None
        try:
            for reply in stub.WatchTask(pb.WatchTaskRequest(task_id=task_id)):
                last = reply.task
                if as_json:
                    print(json.dumps({"task_id": last.task_id, "state": _state(last.state),
                                      "attempts": last.attempts, "error_code": last.error_code}))  # fmt: skip
                else:
                    print(f"{when(last.updated_at)}  {_state(last.state)}", flush=True)
                if last.state in SETTLED:
                    break
        except grpc.RpcError as exc:
            raise rpc.error_from(exc, address) from None
    if last is None or last.state not in SETTLED:
        print("versus-cp: the watch ended before the task settled", file=sys.stderr)
        return 1
    return 0 if last.state == task_pb2.TASK_STATE_SUCCESS else EXIT_NOT_SUCCESS


def _output(settings: Settings, args: argparse.Namespace) -> int:
    """ReadOutput to a file or stdout, one chunk at a time; checks the SHA-256 when it reads it all."""
    if args.offset < 0:
        raise InvalidArgument("--offset must not be negative", code="offset_invalid")
    address = settings.router_address
    request = pb.ReadOutputRequest(task_id=args.task_id, offset=args.offset, follow=args.follow)
    sha, written, last = hashlib.sha256(), 0, None
    sink = open(args.out, "wb") if args.out else sys.stdout.buffer  # noqa: SIM115 - closed below
    try:
        with sync_channel(address, token_files.operator_token(settings)) as channel:
            stub = task_router_pb2_grpc.TaskRouterServiceStub(channel)
            try:
                for message in stub.ReadOutput(request):
                    sink.write(message.data)
                    sha.update(message.data)
                    written += len(message.data)
                    last = message
            except grpc.RpcError as exc:
                raise rpc.error_from(exc, address) from None
    finally:
        sink.flush()
        if args.out:
            sink.close()
    whole = last is not None and last.sha256 and args.offset == 0 and written == last.length
    if whole and last is not None and sha.hexdigest() != last.sha256:
        print("versus-cp: the output read differs from its recorded SHA-256", file=sys.stderr)
        return 1
    if args.out:
        done = "complete" if last is not None and last.complete else "so far"
        print(f"{written} bytes written to {args.out} ({done})", file=sys.stderr)
    return 0


def run(settings: Settings, args: argparse.Namespace) -> int:
    if args.action == "output":
        return _output(settings, args)
    if args.action == "submit":
        reply = _call(settings, "SubmitTask", _submit_request(args))
        if args.json and not args.wait:
            print_json(reply)
        elif not args.json:
            print(f"task {reply.task.task_id} is {_state(reply.task.state)}")
        return _watch(settings, reply.task.task_id, args.json) if args.wait else 0
    if args.action == "list":
        return _list(settings, args)
    if args.action == "watch":
        return _watch(settings, args.task_id, args.json)
    if args.action == "get":
        reply = _call(settings, "GetTask", pb.GetTaskRequest(task_id=args.task_id))
        if args.json:
            print_json(reply)
        else:
            _print_task(reply.task)
        return 0
    reply = _call(settings, "CancelTask", pb.CancelTaskRequest(task_id=args.task_id, reason=args.reason))
    if args.json:
        print_json(reply)
    elif reply.task.state != task_pb2.TASK_STATE_CANCELLED and reply.task.HasField("cancel_requested_at"):
        # Work a collector holds: asked to stop; the task ends when it answers (`tasks watch`).
        print(f"task {reply.task.task_id} is {_state(reply.task.state)}; its collector was asked to stop it")
    else:
        print(f"task {reply.task.task_id} is {_state(reply.task.state)}")
    return 0
