"""The tunnel socket's control frames and limits, per tunnel protocol version (docs/gateway.md).

Binary frames are the session's bytes, nothing else. Text frames control the leg:

| frame | from | versions | meaning |
|---|---|---|---|
| ``eof`` | either | 1, 2 | this direction is closed (half-close); in 2 it takes one offset |
| ``error:<reason>`` | collector | 1, 2 | the device could not be reached; the session ends with the reason |
| ``ack:<offset>`` | either | 2 | everything before ``offset`` of this direction arrived |
| ``resume:<offset>`` | either | 2 | first frame of a leg: what this end has received (0 on the first leg) |

Version 1 is what collectors before resumable sessions speak: 64 KiB frames, no
acknowledgements, a dropped socket ends the session. Version 2 allows 1 MiB frames and resumes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from common.errors import InvalidArgument

V1 = 1
V2 = 2
SPOKEN = (V1, V2)
MAX_FRAME_BYTES = {V1: 64 * 1024, V2: 1024 * 1024}

EOF = "eof"
ERROR_PREFIX = "error:"
ACK_PREFIX = "ack:"
RESUME_PREFIX = "resume:"
# Offsets are byte counts of one session's direction: 2**63 is far past any session's length.
MAX_OFFSET = 2**63 - 1
_OFFSET = re.compile(r"0|[1-9][0-9]{0,18}")
_REASON = re.compile(r"[a-z][a-z0-9_]{0,63}")

Kind = Literal["eof", "error", "ack", "resume"]


@dataclass(frozen=True, slots=True)
class Control:
    """A parsed control frame: its kind, and its offset (ack, resume) or reason (error)."""

    kind: Kind
    offset: int = 0
    reason: str = ""


def negotiate(offered: int) -> int:
    """The version a leg speaks: the highest both ends speak (a collector offers its highest)."""
    if offered < V1:
        raise InvalidArgument(f"tunnel protocol {offered} is not a version", code="tunnel_version_invalid")
    return min(offered, SPOKEN[-1])


def parse_control(text: str, version: int) -> Control:
    """A text frame of ``version`` as a :class:`Control`; anything else is ``tunnel_frame_invalid``."""
    if text == EOF:
        return Control("eof")
    if text.startswith(ERROR_PREFIX):
        return Control("error", reason=_reason(text.removeprefix(ERROR_PREFIX)))
    if version >= V2:
        for prefix, kind in ((ACK_PREFIX, "ack"), (RESUME_PREFIX, "resume")):
            if text.startswith(prefix):
                return Control(kind, offset=_offset(text.removeprefix(prefix)))  # type: ignore[arg-type]
    raise InvalidArgument(f"not a tunnel control frame of protocol {version}", code="tunnel_frame_invalid")


def ack(offset: int) -> str:
    return ACK_PREFIX + str(_checked(offset))


def resume(offset: int) -> str:
    return RESUME_PREFIX + str(_checked(offset))


def error(reason: str) -> str:
    return ERROR_PREFIX + _reason(reason)


def is_reason(text: str) -> bool:
    """Whether ``text`` has the shape of a stable reason (snake_case, at most 64 characters)."""
    return bool(_REASON.fullmatch(text))


def _offset(text: str) -> int:
    if not _OFFSET.fullmatch(text):
        raise InvalidArgument("a tunnel offset is a decimal count of bytes", code="tunnel_frame_invalid")
    return _checked(int(text))


def _checked(offset: int) -> int:
    if not 0 <= offset <= MAX_OFFSET:
        raise InvalidArgument(f"tunnel offset {offset} is out of range", code="tunnel_frame_invalid")
    return offset


def _reason(reason: str) -> str:
    if not _REASON.fullmatch(reason):
        raise InvalidArgument(
            "a tunnel error reason is snake_case, at most 64 characters", code="tunnel_frame_invalid"
        )
    return reason
