"""Where a client dials a control-plane service: one address, several, or a gRPC name.

``VERSUS_ROUTER_TARGET`` and ``VERSUS_ENROLLMENT_TARGET`` take

- ``host:port`` - one service (a DNS name resolving to several addresses is balanced too);
- ``10.0.0.1:50051,10.0.0.2:50051`` - several replicas by address;
- any gRPC target URI, e.g. ``dns:///routers.internal:50051``.

Channels balance calls over every address with gRPC's ``round_robin`` policy
(common/grpc/client.py), so replicas share the load and a dead one is skipped
as soon as its connection fails. Pure code.
"""

from __future__ import annotations

import ipaddress

from common.errors import ConfigError

_URI_PREFIXES = ("dns:", "ipv4:", "ipv6:", "unix:", "unix-abstract:")


def _ip_of(item: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    host, sep, port = item.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(f"{item!r} is not host:port")
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


def grpc_target(value: str) -> str:
    """The gRPC target for a configured value; :class:`ConfigError` for a list gRPC cannot dial."""
    value = value.strip()
    if value.startswith(_URI_PREFIXES) or "://" in value:
        return value
    if not value:
        return value  # a channel nobody dials (tests of other parts); settings never give one
    items = [item.strip() for item in value.split(",") if item.strip()]
    if not items:
        raise ConfigError("an empty target")
    if len(items) == 1:
        _ip_of(items[0])  # checks host:port
        return items[0]
    addresses = [_ip_of(item) for item in items]
    if any(a is None for a in addresses):
        raise ConfigError(
            f"{value!r}: a list of replicas must give IP addresses; for a DNS name that resolves to "
            "several, give dns:///<name>:<port>"
        )
    versions = {a.version for a in addresses if a is not None}
    if len(versions) > 1:
        raise ConfigError(f"{value!r}: list IPv4 or IPv6 addresses, not both")
    return ("ipv4:" if versions == {4} else "ipv6:") + ",".join(items)
