"""The enrollment process: EnrollmentService on its own gRPC port."""

from __future__ import annotations

import asyncio
import datetime as dt
from pathlib import Path

from sqlalchemy.ext.asyncio import AsyncEngine
from versus.enrollment.v1 import enrollment_pb2, enrollment_pb2_grpc

from common.access.api_tokens import TokenAuthenticator
from common.config.settings import Settings
from common.config.state_dir import ensure_writable
from common.db import engine as db_engine
from common.grpc.server import ServiceRegistration
from common.material import shared as material
from common.runtime.service import check_backends, require_backends, serve_grpc_service
from common.telemetry import capacity
from common.trust.keys import KeyPurpose
from common.trust.keystore import KeyStore, ReloadingKeySet
from common.trust.trust_bundle import BundleSource
from enrollment.authority import Authority
from enrollment.ca import CollectorCA
from enrollment.grpc_api import EnrollmentServicer
from enrollment.metrics import watch_authority
from enrollment.service import EnrollmentConfig, EnrollmentService
from enrollment.store import EnrollmentStore

SERVICE_NAME = enrollment_pb2.DESCRIPTOR.services_by_name["EnrollmentService"].full_name


def authority(settings: Settings, state: Path) -> Authority:
    """The CAs of the store under ``<state>/ca``, or the operator's Collector CA files."""
    cert, key = settings.collector_ca_cert_file, settings.collector_ca_key_file
    supplied = CollectorCA.from_files(cert, key) if cert is not None and key is not None else None
    return Authority.from_source(BundleSource.from_settings(settings, state), supplied)


def build_config(settings: Settings, state: Path) -> EnrollmentConfig:
    public = settings.public_gateway_url
    host_port = public.split("://", 1)[-1].split("/", 1)[0]
    return EnrollmentConfig(
        trust_domain=settings.trust_domain,
        public_url=public,
        gateway_addrs=(host_port,),
        gateway_server_name=settings.gateway_server_name,
        cert_lifetime=dt.timedelta(seconds=settings.collector_cert_lifetime_s),
    )


def build_service(settings: Settings, engine: AsyncEngine) -> EnrollmentService:
    state = ensure_writable(settings.state_dir)
    dispatch = ReloadingKeySet(KeyStore(state, KeyPurpose.DISPATCH))
    release = ReloadingKeySet(KeyStore(state, KeyPurpose.RELEASE))
    return EnrollmentService(
        EnrollmentStore(engine),
        authority(settings, state),
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
    database_url, redis_url = require_backends(settings, "enrollment")
    check_backends(database_url, redis_url)
    follower = await material.start_service(settings, database_url, material.Role.CORE)
    stop = asyncio.Event()
    following = asyncio.create_task(follower.run(stop)) if follower is not None else None
    engine = db_engine.create_async(database_url, application_name="versus-enrollment")
    capacity.watch_db("enrollment", engine)
    service = build_service(settings, engine)
    watch_authority(service.authority.bundle)
    try:
        await serve_grpc_service(
            settings,
            "enrollment",
            host=settings.enrollment_host,
            port=settings.enrollment_port,
            metrics_port=settings.enrollment_metrics_port,
            registrations=registrations(service),
            authenticator=TokenAuthenticator(engine),
        )
    finally:
        stop.set()
        if following is not None:
            await asyncio.wait({following}, timeout=5.0)
        await engine.dispose()
