"""Service targets: one address, a list of replicas, or a gRPC URI; a list gRPC cannot dial is refused."""

from __future__ import annotations

import pytest

from common.config.settings import Settings, load_settings
from common.config.targets import grpc_target
from common.errors import ConfigError

pytestmark = pytest.mark.timeout(10)


@pytest.mark.parametrize(
    ("value", "target"),
    [
        ("127.0.0.1:50051", "127.0.0.1:50051"),
        ("router.internal:50051", "router.internal:50051"),
        ("10.0.0.1:50051, 10.0.0.2:50051", "ipv4:10.0.0.1:50051,10.0.0.2:50051"),
        ("[fd00::1]:50051,[fd00::2]:50051", "ipv6:[fd00::1]:50051,[fd00::2]:50051"),
        ("dns:///routers.internal:50051", "dns:///routers.internal:50051"),
        ("ipv4:10.0.0.1:1,10.0.0.2:1", "ipv4:10.0.0.1:1,10.0.0.2:1"),
    ],
)
def test_targets_gRPC_can_dial(value: str, target: str) -> None:
    assert grpc_target(value) == target


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("a.internal:1,b.internal:1", "dns:///"),
        ("10.0.0.1:1,[fd00::1]:1", "not both"),
        ("10.0.0.1", "not host:port"),
        (" , ", "empty"),
    ],
)
def test_lists_gRPC_cannot_dial_are_refused(value: str, reason: str) -> None:
    with pytest.raises(ConfigError, match=reason):
        grpc_target(value)


def test_settings_refuse_a_bad_target_or_a_wildcard_advertise() -> None:
    with pytest.raises(ConfigError, match="dns:///"):
        _load(router_target="a:1,b:1")
    with pytest.raises(ConfigError, match="wildcard"):
        _load(router_advertise="0.0.0.0:50051")
    assert _load(router_advertise="10.1.2.3:50051").router_advertise_address == "10.1.2.3:50051"
    assert _load(router_port=50061).router_advertise_address == "127.0.0.1:50061"


def _load(**values: object) -> Settings:
    return load_settings(**values)
