"""The enrollment process: EnrollmentService on its own gRPC port."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from sqlalchemy.ext.asyncio import AsyncEngine
from versus.enrollment.v1 import enrollment_pb2, enrollment_pb2_grpc

from common.api_tokens import TokenAuthenticator
from common.db import engine as db_engine
from common.grpc_server import ServiceRegistration
from common.keys import KeyPurpose
from common.keystore import KeyStore, ReloadingKeySet
from common.runtime import require_backends, serve_grpc_service
from common.settings import Settings
from common.state_dir import ensure_writable
from common.tls import spki_pin
from enrollment.ca import CollectorCA
from enrollment.grpc_api import EnrollmentServicer
from enrollment.service import EnrollmentConfig, EnrollmentService
from enrollment.store import EnrollmentStore

SERVICE_NAME = enrollment_pb2.DESCRIPTOR.services_by_name["EnrollmentService"].full_name


def load_ca(settings: Settings, state: Path) -> CollectorCA:
    """The configured Collector CA files, or the one under ``<state>/collector-ca`` (created on first use)."""
    cert, key = settings.collector_ca_cert_file, settings.collector_ca_key_file
    if cert is not None and key is not None:
        return CollectorCA.from_files(cert, key)
    return CollectorCA.load_or_create(state / "collector-ca")


def gateway_ca(settings: Settings, state: Path) -> tuple[str | None, str | None]:
    """PEM and SPKI pin of the CA collectors should trust for the gateway, if it is not a public one."""
    from cryptography import x509

    path = settings.gateway_ca_file or (state / "tls" / "gateway-ca.pem")
    if not path.exists():
        return None, None
    pem = path.read_text()
    return pem, spki_pin(x509.load_pem_x509_certificate(pem.encode()))


def build_config(settings: Settings, state: Path) -> EnrollmentConfig:
    ca_pem, pin = gateway_ca(settings, state)
    public = settings.public_gateway_url
    host_port = public.split("://", 1)[-1].split("/", 1)[0]
    return EnrollmentConfig(
        trust_domain=settings.trust_domain,
        public_url=public,
        gateway_addrs=(host_port,),
        gateway_server_name=settings.gateway_server_name,
        gateway_ca_pem=ca_pem,
        gateway_ca_pin=pin,
        cert_lifetime=dt.timedelta(seconds=settings.collector_cert_lifetime_s),
    )


def build_service(settings: Settings, engine: AsyncEngine) -> EnrollmentService:
    state = ensure_writable(settings.state_dir)
    dispatch = ReloadingKeySet(KeyStore(state, KeyPurpose.DISPATCH))
    release = ReloadingKeySet(KeyStore(state, KeyPurpose.RELEASE))
    return EnrollmentService(
        EnrollmentStore(engine),
        load_ca(settings, state),
        dispatch.get,
        release.get,
        build_config(settings, state),
    )


def registrations(service: EnrollmentService) -> list[ServiceRegistration]:
    return [
        ServiceRegistration(
            SERVICE_NAME,
            EnrollmentServicer(service),
            enrollment_pb2_grpc.add_EnrollmentServiceServicer_to_server,
        )
    ]


async def serve(settings: Settings) -> None:
    database_url, _ = require_backends(settings, "enrollment")
    engine = db_engine.create_async(database_url)
    try:
        await serve_grpc_service(
            settings,
            "enrollment",
            host=settings.enrollment_host,
            port=settings.enrollment_port,
            metrics_port=settings.enrollment_metrics_port,
            registrations=registrations(build_service(settings, engine)),
            authenticator=TokenAuthenticator(engine),
        )
    finally:
        await engine.dispose()
