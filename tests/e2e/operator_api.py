"""The operator's gRPC API, called from the test process: set-up and polling without a process per call.

A `versus-cp` command costs about 0.6 CPU-seconds, nearly all of it Python importing the CLI,
and the suite's set-up (a site, an enrollment token, an API token for each test) and its polling
loops ran several hundred of them. ``OperatorApi`` sends the same requests over one channel per
service with the admin token and answers as the command's ``--json`` prints them (the same
conversion functions), so a test reads the same fields either way. Tests of the CLI itself run
``versus-cp`` (``harness.run_cli``).
"""

from __future__ import annotations

from typing import Any

from versus.access.v1 import access_pb2, access_pb2_grpc
from versus.credential.v1 import credential_pb2, credential_pb2_grpc
from versus.enrollment.v1 import enrollment_pb2, enrollment_pb2_grpc
from versus.fleet.v1 import fleet_pb2, fleet_pb2_grpc

from common.grpc.client import sync_channel
from versus_cp.access_cmd import ROLES
from versus_cp.enrollment_cmd import json_dict as enrollment_json
from versus_cp.output import json_dict


class OperatorApi:
    """One control plane's enrollment, fleet, access and credential services, as its admin."""

    def __init__(self, enrollment_address: str, router_address: str, admin_token: str) -> None:
        enrollment = sync_channel(enrollment_address, admin_token)
        router = sync_channel(router_address, admin_token)
        self._channels = (enrollment, router)
        self._enrollment = enrollment_pb2_grpc.EnrollmentServiceStub(enrollment)
        self._fleet = fleet_pb2_grpc.FleetServiceStub(router)
        self._access = access_pb2_grpc.AccessServiceStub(router)
        self._credentials = credential_pb2_grpc.CredentialServiceStub(router)

    def create_site(self, name: str, tenant: str = "acme") -> dict[str, Any]:
        """`sites create NAME --tenant TENANT --json`."""
        reply = self._enrollment.CreateSite(
            enrollment_pb2.CreateSiteRequest(name=name, tenant_id=tenant), timeout=10
        )
        return dict(enrollment_json(reply))

    def issue_token(
        self, site_id: str, *, manual_approval: bool = False, max_uses: int | None = None
    ) -> dict[str, Any]:
        """`tokens issue --site SITE_ID [--manual-approval] [--max-uses N] --json` (the service's
        defaults otherwise, as the CLI's are)."""
        manual, auto = enrollment_pb2.APPROVAL_MODE_MANUAL, enrollment_pb2.APPROVAL_MODE_AUTO
        request = enrollment_pb2.IssueEnrollmentTokenRequest(
            site_id=site_id, approval_mode=manual if manual_approval else auto
        )
        if max_uses is not None:
            request.max_uses = max_uses
        return dict(enrollment_json(self._enrollment.IssueEnrollmentToken(request, timeout=10)))

    def create_api_token(self, name: str, role: str, tenants: tuple[str, ...] = ()) -> str:
        """The plaintext of `access create NAME --role ROLE` (a platform token: ``--tenant`` each of
        ``tenants``, or ``--all-tenants`` when none are named)."""
        request = access_pb2.CreateApiTokenRequest(name=name, role=ROLES[role])
        if role == "platform":
            request.tenants.extend(tenants)
            request.all_tenants = not tenants
        return str(self._access.CreateApiToken(request, timeout=10).plaintext)

    def collector(self, collector_id: str) -> dict[str, Any]:
        """The ``collector`` of `collectors show COLLECTOR_ID --json`."""
        reply = self._fleet.GetCollector(fleet_pb2.GetCollectorRequest(collector_id=collector_id), timeout=10)
        return dict(json_dict(reply)["collector"])

    def revocation(self, revocation_id: str) -> dict[str, Any]:
        """`credentials show REVOCATION_ID --json`."""
        request = credential_pb2.GetRevocationRequest(revocation_id=revocation_id)
        return dict(json_dict(self._credentials.GetRevocation(request, timeout=10)))

    def close(self) -> None:
        for channel in self._channels:
            channel.close()
