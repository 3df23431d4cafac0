"""Task dispatch, from SubmitTask to the report: validation, placement on one eligible collector,
device leases and signed envelopes, the claim's hand-out, reports and the unknown-outcome ladder,
cancels and resume verdicts, re-placement and sweeps; its SQL (``sql_*``) and the TaskRouter and
CollectorBridge gRPC adapters. :mod:`router.dispatch.service` puts the layers into one Router."""
