"""The dispatch queue (served by the router's TaskRouterService):

    versus-cp queue list [--outcome all|indeterminate|reconciling|unknown|success|failed]
                         [--site S] [--collector C] [--target T] [--limit N]
    versus-cp queue show DISPATCH_ID
    versus-cp queue resolve TASK_ID --success|--failed [--note TEXT]

``indeterminate`` and ``reconciling`` are states of the dispatch's task (the
operator-facing outcome); ``unknown``, ``success`` and ``failed`` are states of
the dispatch itself. Every command takes ``--json``.
"""

from __future__ import annotations

import argparse
from typing import Any

from versus.router.v1 import task_pb2, task_router_pb2_grpc
from versus.router.v1 import task_router_pb2 as pb

from common.config.settings import Settings
from versus_cp import rpc
from versus_cp.output import enum_name, fields, print_json, print_table, when

# outcome -> (dispatch states, task states)
OUTCOMES: dict[str, tuple[list[Any], list[Any]]] = {
    "all": ([], []),
    "indeterminate": ([], [task_pb2.TASK_STATE_INDETERMINATE]),
    "reconciling": ([], [task_pb2.TASK_STATE_RECONCILING]),
    "unknown": ([task_pb2.TASK_STATE_UNKNOWN], []),
    "success": ([task_pb2.TASK_STATE_SUCCESS], []),
    "failed": ([task_pb2.TASK_STATE_FAILED], []),
}
PAGE = 200


def _call(settings: Settings, method: str, request: Any) -> Any:
    stub = task_router_pb2_grpc.TaskRouterServiceStub
    return rpc.call(settings, settings.router_address, stub, method, request)


def _state(value: int) -> str:
    return enum_name(value, task_pb2.TaskState, "TASK_STATE_")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = sub.add_parser(
        "list", help="Dispatches, newest first, filtered by outcome, site, collector, target."
    )
    listing.add_argument("--outcome", choices=list(OUTCOMES), default="all")
    listing.add_argument("--site", default="")
    listing.add_argument("--collector", default="")
    listing.add_argument("--target", default="")
    listing.add_argument("--limit", type=int, default=100, help="at most this many rows (default 100)")
    show = sub.add_parser("show", help="One dispatch with its task's evidence and history.")
    show.add_argument("dispatch_id")
    resolve = sub.add_parser("resolve", help="Settle an indeterminate task after checking the device.")
    resolve.add_argument("task_id")
    verdict = resolve.add_mutually_exclusive_group(required=True)
    verdict.add_argument("--success", action="store_true", help="the change landed")
    verdict.add_argument("--failed", action="store_true", help="the change did not land")
    resolve.add_argument("--note", default="", help="what you checked (kept in the history and audit log)")
    for p in (listing, show, resolve):
        p.add_argument("--json", action="store_true")


def _rows(dispatches: list[task_pb2.Dispatch]) -> list[tuple[Any, ...]]:
    return [
        (
            d.dispatch_id, d.task_id, _state(d.state), _state(d.task_state), d.collector_id, d.target_ref,
            f"{d.provider}/{d.operation}", when(d.created_at),
        )
        for d in dispatches
    ]  # fmt: skip


def run(settings: Settings, args: argparse.Namespace) -> int:
    if args.action == "list":
        states, task_states = OUTCOMES[args.outcome]
        found: list[task_pb2.Dispatch] = []
        page = ""
        while len(found) < args.limit:
            request = pb.ListDispatchesRequest(
                states=states, task_states=task_states, site_id=args.site, collector_id=args.collector,
                target_ref=args.target, page_size=min(PAGE, args.limit - len(found)), page_token=page,
            )  # fmt: skip
            reply = _call(settings, "ListDispatches", request)
            found.extend(reply.dispatches)
            page = reply.next_page_token
            if not page:
                break
        if args.json:
            print_json(pb.ListDispatchesResponse(dispatches=found, next_page_token=page))
        else:
            headers = [
                "DISPATCH",
                "TASK",
                "DISPATCH STATE",
                "TASK STATE",
                "COLLECTOR",
                "TARGET",
                "OPERATION",
                "CREATED",
            ]
            print_table(headers, _rows(found))
        return 0
    if args.action == "show":
        reply = _call(settings, "GetDispatch", pb.GetDispatchRequest(dispatch_id=args.dispatch_id))
        if args.json:
            print_json(reply)
            return 0
        d, t = reply.dispatch, reply.task
        print(f"Dispatch {d.dispatch_id} (attempt {d.attempt}, {d.kind})\n")
        print(fields([
            ("task", t.task_id), ("operation", f"{d.provider}/{d.operation}"), ("target", d.target_ref),
            ("collector", d.collector_id), ("site", d.site_id), ("dispatch state", _state(d.state)),
            ("task state", _state(t.state)), ("handed out", when(d.handed_at)),
            ("reported", when(d.reported_at)),
            ("error", f"{d.error_code}: {d.error_message}" if d.error_code else "-"),
        ]))  # fmt: skip
        print(f"\nEvidence\n  {t.evidence or '(none)'}")
        print("\nHistory")
        rows = [(when(h.at), _state(h.from_state), _state(h.to_state), h.reason) for h in t.history]
        print_table(["AT", "FROM", "TO", "REASON"], rows)
        return 0
    resolution = pb.RESOLUTION_SUCCESS if args.success else pb.RESOLUTION_FAILED
    reply = _call(
        settings,
        "ResolveIndeterminate",
        pb.ResolveIndeterminateRequest(task_id=args.task_id, resolution=resolution, note=args.note),
    )
    if args.json:
        print_json(reply)
    else:
        print(f"task {reply.task.task_id} is now {_state(reply.task.state)}")
    return 0
