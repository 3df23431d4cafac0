"""Timestamps for protobuf messages, converted at the gRPC edge."""

from __future__ import annotations

import datetime as dt

from google.protobuf.timestamp_pb2 import Timestamp


def timestamp(value: dt.datetime | float | None) -> Timestamp | None:
    """A Timestamp from an aware datetime or Unix seconds; None (field left unset) for None."""
    if value is None:
        return None
    out = Timestamp()
    if isinstance(value, dt.datetime):
        out.FromDatetime(value)
    else:
        out.FromNanoseconds(int(value * 1e9))
    return out
