"""One P-256 collector key for tests that put collectors straight into PostgreSQL.

Such collectors never enrolled, but the router checks every report's signature
against the key on record (common/trust/report_signature.py): rows get ``PUBLIC_DER``
and reports are signed with :func:`signed`, as a real collector signs them.
"""

from __future__ import annotations

import time

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from versus.router.v1 import collector_bridge_pb2 as bpb

from common.trust import report_signature
from common.trust.report_signature import ReportStatement

KEY = ec.generate_private_key(ec.SECP256R1())
PUBLIC_DER = KEY.public_key().public_bytes(
    serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
)


def signed(request: bpb.ReportRequest) -> bpb.ReportRequest:
    """``request`` with the collector's signature over what it says."""
    outcome = bpb.ReportOutcome.Name(request.outcome).removeprefix("REPORT_OUTCOME_").lower()
    statement = ReportStatement(
        request.collector_id,
        request.task_id,
        outcome,
        request.result,
        request.error_code,
        request.error_message,
    )
    request.signature = report_signature.sign(KEY, statement, int(time.time()))
    return request
