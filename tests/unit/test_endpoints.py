"""What `versus-cp up` publishes in endpoints.json (versus_cp/endpoints.py)."""

from __future__ import annotations

import json
from pathlib import Path

from common.config.settings import Settings
from versus_cp import endpoints


def test_the_embedded_servers_urls_are_published_and_an_operators_own_are_not(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path)
    db = "postgresql://postgres@/versus?host=/tmp/pg-sock&port=5432"
    redis = "unix:///tmp/redis.sock?db=0"
    record = json.loads(endpoints.write(settings, tmp_path, db, redis).read_text())
    assert (record["database_url"], record["redis_url"]) == (db, redis)
    assert record["router"] == settings.router_address and record["gateway_url"] == settings.gateway_url
    # Servers of the operator's own (their URLs may hold a password): nothing written.
    record = json.loads(endpoints.write(settings, tmp_path).read_text())
    assert record["database_url"] is None and record["redis_url"] is None
    endpoints.remove(tmp_path)
    assert not (tmp_path / endpoints.FILE_NAME).exists()
