"""Field types of collector request bodies that PostgreSQL, protobuf and operators can take as they are.

PostgreSQL refuses NUL in text and JSONB, UTF-8 cannot encode lone surrogates,
and BIGINT (and so every stored counter) ends at 2**63 - 1: without these
checks such a body got past validation and failed at the database or in the
protobuf encoder as an internal error (found by schemathesis, see
tests/e2e/test_fuzz_gateway.py). Names and codes must be printable besides, so
they show up in listings and logs as what they are.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field


def _printable(value: str) -> str:
    if not value.isprintable():
        raise ValueError("must be printable characters (no control characters)")
    return value


def _storable(value: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("must be valid Unicode (no lone surrogates)") from None
    if "\x00" in value:
        raise ValueError("must not contain NUL characters")
    return value


Name = Annotated[str, AfterValidator(_printable)]
"""An identifier, code or version: printable characters only."""

FreeText = Annotated[str, AfterValidator(_storable)]
"""Human text such as an error message: any Unicode but NUL."""

MAX_INT64 = 2**63 - 1

Int64 = Annotated[int, Field(ge=0, le=MAX_INT64)]
"""A sequence number or epoch: stored as a PostgreSQL BIGINT."""
