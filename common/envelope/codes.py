"""Stable error codes for rejected envelopes, in the order the verifier checks them.

Collectors report these codes back to the control plane, and other
implementations must produce the same code for the same input (see the
vectors), so they never change meaning.
"""

from __future__ import annotations

from enum import StrEnum


class Rejection(StrEnum):
    # Input that cannot be an envelope at all.
    TOO_LARGE = "envelope_too_large"
    MALFORMED = "envelope_malformed"
    BAD_ENCODING = "envelope_bad_encoding"
    BAD_LENGTH = "envelope_bad_length"
    PARAMS_TOO_LARGE = "params_too_large"
    # The verification rules, in order.
    UNKNOWN_KID = "unknown_kid"
    KID_EXPIRED = "kid_expired"
    BAD_SIGNATURE = "bad_signature"
    WRONG_COLLECTOR = "wrong_collector"
    NOT_YET_VALID = "not_yet_valid"
    EXPIRED = "expired"
    PARAMS_HASH_MISMATCH = "params_hash_mismatch"
    REPLAYED_TASK = "replayed_task"


class EnvelopeError(Exception):
    """An envelope was refused; ``code`` is the stable reason."""

    def __init__(self, code: Rejection, message: str):
        super().__init__(f"{code.value}: {message}")
        self.code = code
        self.message = message
