"""Integrations → External Vaults: the HashiCorp Vault integrations collectors in mode C read device
credentials from (what ``versus-cp vault-integrations`` lists and creates), and the pick list the
collector page's mode C switch chooses from."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route
from versus.fleet.v1 import fleet_pb2

from common.errors import VersusError
from common.telemetry.logs import get_logger
from console import security
from console.views import timestamp

if TYPE_CHECKING:
    from console.pages import Console
    from console.sessions import Session

log = get_logger("versus.console")
DELIVERIES = {"wrapped": fleet_pb2.SECRET_ID_DELIVERY_WRAPPED, "plain": fleet_pb2.SECRET_ID_DELIVERY_PLAIN}
MAX_CA_PEM = 12 * 1024  # within the console's 16 KiB form limit


@dataclass(frozen=True)
class IntegrationView:
    integration_id: str
    name: str
    address: str
    role_id: str
    kv_mount: str
    path_prefix: str
    delivery: str
    has_ca: bool
    created_at: str


def integration_view(i: fleet_pb2.VaultIntegration) -> IntegrationView:
    delivery = next((k for k, v in DELIVERIES.items() if v == i.secret_id_delivery), "wrapped")
    return IntegrationView(
        i.integration_id, i.name, i.address, i.role_id, i.kv_mount, i.path_prefix or "versus", delivery,
        bool(i.ca_pem), timestamp(i.created_at),
    )  # fmt: skip


def routes(console: Console) -> list[Route]:
    backend = console.backend

    async def vaults(request: Request, session: Session) -> Response:
        try:
            listed = await backend.vault_integrations(session.token)
        except VersusError as exc:
            return console.failed(exc, session)
        created = request.query_params.get("created", "")[:200]
        shown = [integration_view(i) for i in listed]
        return console.page(
            "vaults.html", session=session, integrations=shown, created=created, deliveries=list(DELIVERIES)
        )

    async def create(request: Request) -> Response:
        try:
            session, fields = await console.checked_post(request)
        except security.Refused as exc:
            return console.refusal(exc.status, exc.code, str(exc))
        delivery = fields.get("delivery", "wrapped")
        if delivery not in DELIVERIES:
            return console.refusal(400, "secret_id_delivery_invalid", "delivery is wrapped or plain", session)

        def text(name: str, limit: int = 200) -> str:
            return fields.get(name, "").strip()[:limit]

        request_pb = fleet_pb2.CreateVaultIntegrationRequest(
            name=text("name"),
            address=text("address", 500),
            role_id=text("role_id"),
            kv_mount=text("kv_mount"),
            path_prefix=text("path_prefix"),
            ca_pem=fields.get("ca_pem", "")[:MAX_CA_PEM],
            secret_id_delivery=DELIVERIES[delivery],
        )
        try:
            made = await backend.create_vault_integration(session.token, request_pb)
        except VersusError as exc:
            return console.failed(exc, session, back="/integrations/vaults")
        log.info("console action", operator=session.name, action="create_vault_integration",
                 integration_id=made.integration_id)  # fmt: skip
        return RedirectResponse(f"/integrations/vaults?created={made.integration_id}", status_code=303)

    return [
        Route("/integrations/vaults", console.signed_in(vaults)),
        Route("/integrations/vaults", create, methods=["POST"]),
    ]
