"""Rewrite PostgreSQL / Redis URLs to point at another database."""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit


def with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{name}"))


def with_redis_db(url: str, db: int) -> str:
    parts = urlsplit(url)
    if parts.scheme == "unix":
        query = dict(parse_qsl(parts.query))
        query["db"] = str(db)
        # urlunsplit would drop the empty authority and yield "unix:/path".
        return f"unix://{parts.path}?{urlencode(query)}"
    return urlunsplit(parts._replace(path=f"/{db}"))
