"""REDIS_URL naming a Sentinel group, against Debian's redis-sentinel: the control plane follows a
failover, and counters a promoted replica may have missed are rebuilt from PostgreSQL's truth."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
import redis

from common.config.settings import load_settings
from common.redis.client import check_reachable, create_async, describe
from router.core.live import InFlight
from tests.support.sentinel import SentinelGroup, sentinel_group

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def group(tmp_path: Path) -> Iterator[SentinelGroup]:
    with sentinel_group(tmp_path / "sentinel") as started:
        yield started


async def _until_written(client: redis.asyncio.Redis, key: str, value: str) -> int:
    """Write until a write succeeds (calls fail while the group fails over, for up to 30 s); how
    many failed."""
    failed = 0
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30
    while True:
        try:
            await client.set(key, value)
            return failed
        except redis.RedisError:
            failed += 1
            if loop.time() > deadline:
                raise
            await asyncio.sleep(0.2)


async def test_a_client_follows_the_master_through_a_failover(group: SentinelGroup) -> None:
    assert load_settings(redis_url=group.url).redis_url == group.url
    check_reachable(group.url)
    assert describe(group.url) == f"Sentinel group versus at 127.0.0.1:{group.ports['sentinel']}"
    client = create_async(group.url)
    try:
        await client.set("before", "1")
        assert await client.wait(1, 5000) == 1  # the replica has it
        old = group.kill_master()
        new = group.wait_failover(old)
        await _until_written(client, "after", "2")
        # The write landed on the promoted replica, which also had what was replicated before.
        with redis.Redis(port=new) as direct:
            assert direct.get("after") == b"2" and direct.get("before") == b"1"
            assert direct.info("replication")["role"] == "master"
    finally:
        await client.aclose()


async def test_counters_built_on_the_old_master_are_rebuilt_after_a_failover(group: SentinelGroup) -> None:
    truth: Mapping[tuple[str, str], int] = {("col-1", "ssh"): 2}

    async def load() -> Mapping[tuple[str, str], int]:
        return truth

    client = create_async(group.url)
    try:
        counters = InFlight(client, load)
        await counters.ensure_built()
        assert await counters.check_server() is False  # the server that built them holds them
        # Counts that went wrong on the old master (increments lost in a failover look the same);
        # the replica holds them and the marker too.
        await client.hincrby("versus:inflight:col-1", "ssh", 5)
        assert await client.wait(1, 5000) == 1
        new = group.wait_failover(group.kill_master())
        await _until_written(client, "probe", "1")
        with redis.Redis(port=new) as direct:
            assert direct.info("replication")["role"] == "master"
        assert await counters.check_server() is True
        assert (await counters.get(["col-1"]))["col-1"] == {"ssh": 2}
    finally:
        await client.aclose()


def test_bad_sentinel_urls_are_refused_with_the_reason() -> None:
    from common.errors import ConfigError

    for url, reason in [
        ("redis+sentinel://h:26379", "names no Sentinel service"),
        ("redis+sentinel://h:x/svc", "not host:port"),
        ("redis+sentinel://h:26379/svc/db", "/<service>/<db number>"),
        ("redis+sentinel://h:26379/svc?bogus=1", "unknown options"),
    ]:
        with pytest.raises(ConfigError, match=reason):
            load_settings(redis_url=url)
