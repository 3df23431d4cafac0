"""JSON from protobuf ``Struct`` values (audit details) as people expect to read it."""

from __future__ import annotations

from typing import Any


def integral(value: Any) -> Any:
    """``value`` with every whole float (protobuf ``Struct`` has only doubles) as an int."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: integral(v) for k, v in value.items()}
    if isinstance(value, list):
        return [integral(v) for v in value]
    return value
