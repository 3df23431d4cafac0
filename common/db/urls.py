"""PostgreSQL URLs as operators write them (libpq's form, one host or several) and as SQLAlchemy
reads them. Nothing here imports a database driver: settings validation uses it on every start
of every command."""

from __future__ import annotations

import re
from urllib.parse import parse_qs

from common.errors import StartupError
from common.telemetry.redaction import redact_url

_NETLOC = re.compile(r"^(?P<netloc>[^/?#]*)(?P<rest>.*)$", re.DOTALL)


def sqlalchemy_url(url: str) -> str:
    """Normalise any accepted PostgreSQL URL to the psycopg 3 SQLAlchemy dialect. A libpq
    multi-host URL (``postgresql://user@h1:5432,h2:5432/db?target_session_attrs=read-write``,
    the form docs/deployment.md gives for a Patroni cluster) becomes the ``?host=`` list
    SQLAlchemy reads; libpq still tries the hosts in order and keeps the first that qualifies."""
    _, sep, rest = url.partition("://")
    if not sep:
        raise StartupError(f"not a database URL: {redact_url(url)}")
    return f"postgresql+psycopg://{_hosts_to_query(rest)}"


def libpq_url(url: str) -> str:
    """The URL as libpq/psycopg understand it (no SQLAlchemy driver suffix)."""
    _, _, rest = url.partition("://")
    return f"postgresql://{rest}"


def _split(rest: str) -> tuple[str, str, str, str]:
    """userinfo with its ``@``, the host list, the path and the query of a URL's remainder."""
    match = _NETLOC.match(rest)
    assert match is not None  # the pattern matches any string
    userinfo, at, hostlist = match["netloc"].rpartition("@")
    path, _, query = match["rest"].partition("?")
    return userinfo + at, hostlist, path, query


def _hosts_to_query(rest: str) -> str:
    userinfo, hostlist, path, query = _split(rest)
    if "," not in hostlist:
        return rest
    named = "&".join(f"host={h}" for h in hostlist.split(","))
    return f"{userinfo}{path or '/'}?{named}{'&' + query if query else ''}"


def hosts(url: str) -> list[str]:
    """The ``host[:port]`` entries (or socket directories) a URL names, in the order libpq tries
    them; ``localhost`` when it names none."""
    _, _, rest = url.partition("://")
    _, hostlist, _, query = _split(rest)
    if hostlist:
        return hostlist.split(",")
    named = [h for value in parse_qs(query).get("host", []) for h in value.split(",")]
    return named or ["localhost"]
