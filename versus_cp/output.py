"""How operator commands print: aligned tables for people, JSON (protobuf field names) for scripts."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp

from common.grpc.pb_struct import integral


def json_dict(message: Message) -> Any:
    """The protobuf JSON mapping with proto field names, every field (zeros and empty values too),
    enums by their full names (``TOKEN_STATUS_ACTIVE``); whole numbers from ``Struct`` values
    (audit details) as integers, not ``1.0``."""
    as_dict = MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    return integral(as_dict)


def print_json(message: Message) -> None:
    """``message`` as :func:`json_dict` maps it, indented, on stdout."""
    print(json.dumps(json_dict(message), indent=2))


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Left-aligned columns separated by two spaces; the last column is not padded."""
    cells = [[str(h) for h in headers], *[["" if c is None else str(c) for c in r] for r in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = []
    for row in cells:
        padded = [c.ljust(widths[i]) if i < len(row) - 1 else c for i, c in enumerate(row)]
        lines.append("  ".join(padded).rstrip())
    return "\n".join(lines)


def fields(pairs: Sequence[tuple[str, Any]]) -> str:
    """``label   value`` lines with the values aligned."""
    width = max((len(k) for k, _ in pairs), default=0)
    return "\n".join(f"{k.ljust(width)}   {v}" for k, v in pairs)


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], empty: str = "(none)") -> None:
    print(table(headers, rows) if rows else empty)


def when(stamp: Timestamp) -> str:
    """An RFC 3339 UTC time to the second, or '-' when unset."""
    if not stamp.seconds and not stamp.nanos:
        return "-"
    return stamp.ToDatetime().strftime("%Y-%m-%dT%H:%M:%SZ")


def age(seconds: float | None) -> str:
    """A short human age: 42s, 5m, 3h, 2d."""
    if seconds is None:
        return "never"
    s = int(seconds)
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m"
    if s < 172800:
        return f"{s // 3600}h"
    return f"{s // 86400}d"


def enum_name(value: int, enum_type: Any, prefix: str) -> str:
    """``SESSION_STATE_ACTIVE`` -> ``active``."""
    name: str = enum_type.Name(value)
    return name.removeprefix(prefix).lower().replace("_", "-") if value else "-"
