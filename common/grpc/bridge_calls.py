"""Which CollectorBridgeService RPC each kind of call on an ``Exchange`` stream stands for.

Read from the proto itself: a ``BridgeCall`` field of the ``call`` oneof carries the request
message of exactly one unary RPC, so the gateway (gateway/router_link.py) and the router
(router/dispatch/exchange.py) cannot disagree on the pairs, and a call added to the oneof is
served as soon as its RPC exists.
"""

from __future__ import annotations

from versus.router.v1 import collector_bridge_pb2 as bpb

SERVICE = "versus.router.v1.CollectorBridgeService"


def _pairs() -> dict[str, str]:
    methods = bpb.DESCRIPTOR.services_by_name["CollectorBridgeService"].methods
    by_input = {m.input_type.full_name: m.name for m in methods if not m.client_streaming}
    oneof = bpb.BridgeCall.DESCRIPTOR.oneofs_by_name["call"]
    return {f.name: by_input[f.message_type.full_name] for f in oneof.fields if f.message_type is not None}


# Kind of call (the oneof field's name) -> the unary RPC's name: {"claim": "Claim", ...}.
BRIDGE_CALLS: dict[str, str] = _pairs()
