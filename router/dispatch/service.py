"""The Task Router: submit, place, hand out, collect results, walk the ladder, sweep.

One class put together from layers, each in its own module:

- :mod:`router.core.base` - connections, caches, shared types and constants;
- :mod:`router.dispatch.dispatching` - submit and placement (leases, signed envelopes);
- :mod:`router.dispatch.outcomes` - the unknown-outcome ladder's I/O;
- :mod:`router.dispatch.handout` - claims: heartbeats, dispatches, offers and signed documents;
- :mod:`router.dispatch.cancels` - cancel, its delivery to collectors, resume verdicts;
- :mod:`router.dispatch.reports` - reports, resolve, reads;
- :mod:`router.dispatch.sweeps` - capabilities, collectors leaving, the sweeper.

Each operation is one PostgreSQL transaction; Redis side effects (in-flight
counters, wake-ups) run after it commits. Placement runs synchronously on
submit, so a refusal (device leased, op_class mismatch) writes nothing, and
again for queued work whenever a collector comes back, publishes
capabilities or frees capacity, and on the sweeper's tick. The SQL is in
the ``sql_*`` modules beside it (shared reads in :mod:`router.core.store`).
"""

from __future__ import annotations

from router.core.states import TERMINAL
from router.dispatch.core import NO_ELIGIBLE, NO_KEY_HELD, Claimed, DeviceLeased, ReportResult
from router.dispatch.handout import HandOut
from router.dispatch.reports import Reports
from router.dispatch.submit import SubmitRequest
from router.dispatch.sweeps import Sweeps


class Router(HandOut, Reports, Sweeps):
    """The router of one process (router/server.py builds it and serves it over gRPC)."""


__all__ = [
    "NO_ELIGIBLE",
    "NO_KEY_HELD",
    "TERMINAL",
    "Claimed",
    "DeviceLeased",
    "ReportResult",
    "Router",
    "SubmitRequest",
]
