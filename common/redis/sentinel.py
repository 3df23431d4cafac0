"""``REDIS_URL`` naming a Sentinel group: the master is whichever Redis the sentinels say.

    redis+sentinel://[[user]:password@]host1:26379,host2:26379[,...]/<service>[/<db>][?sentinel_password=...]
    rediss+sentinel://...   (TLS to the sentinels and to Redis)

The password in the URL is Redis's; ``sentinel_password`` is the sentinels' own
when they require one. After a failover, connections to the old master are
dropped and new ones go to the new master (redis-py's Sentinel support); what
the control plane keeps in Redis is rebuilt or refreshed as after a FLUSHALL
(docs/reliability.md). Pure code: parsing only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import parse_qs, unquote

SCHEMES = ("redis+sentinel", "rediss+sentinel")
DEFAULT_SENTINEL_PORT = 26379


@dataclass(frozen=True, slots=True)
class SentinelUrl:
    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int = 0
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    sentinel_password: str | None = field(default=None, repr=False)
    tls: bool = False


def is_sentinel(url: str) -> bool:
    return url.split("://", 1)[0] in SCHEMES


def parse(url: str) -> SentinelUrl:
    """The parts of a Sentinel URL; ``ValueError`` says what is wrong."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in SCHEMES:
        raise ValueError("must be a redis+sentinel:// or rediss+sentinel:// URL")
    rest, _, query = rest.partition("?")
    netloc, _, path = rest.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    if not at:
        userinfo, hosts = "", netloc
    username, _, password = userinfo.partition(":") if userinfo else ("", "", "")
    sentinels = []
    for item in hosts.split(","):
        host, colon, port = item.strip().rpartition(":")
        if not colon:
            host, port = item.strip(), str(DEFAULT_SENTINEL_PORT)
        host = host.strip("[]")
        if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
            raise ValueError(f"names a sentinel that is not host:port ({item.strip()!r})")
        sentinels.append((host, int(port)))
    parts = [p for p in path.split("/") if p]
    if not parts:
        raise ValueError("names no Sentinel service (redis+sentinel://host:26379/<service>)")
    if len(parts) > 2 or (len(parts) == 2 and not parts[1].isdigit()):
        raise ValueError("the path must be /<service> or /<service>/<db number>")
    options = parse_qs(query)
    unknown = sorted(set(options) - {"sentinel_password"})
    if unknown:
        raise ValueError(f"has unknown options: {', '.join(unknown)}")
    return SentinelUrl(
        sentinels=tuple(sentinels),
        service=unquote(parts[0]),
        db=int(parts[1]) if len(parts) == 2 else 0,
        username=unquote(username) or None,
        password=unquote(password) or None,
        sentinel_password=options["sentinel_password"][0] if "sentinel_password" in options else None,
        tls=scheme == "rediss+sentinel",
    )
