"""The audit export's outbox and loop against a real PostgreSQL: commit order, a late commit never
skipped, one exporter per sink across routers, a failing sink retried without loss."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from common.db import audit
from common.db.engine import create_async
from router.audit_export import outbox
from router.audit_export.exporter import Exporter
from router.audit_export.sinks import FileSink, SinkUnavailable


class Recording:
    """A sink that keeps what it was given, and fails while told to."""

    name = "memory"

    def __init__(self) -> None:
        self.events: list[Mapping[str, Any]] = []
        self.failing = False
        self.took = asyncio.Event()

    async def deliver(self, batch: Sequence[Mapping[str, Any]]) -> None:
        if self.failing:
            raise SinkUnavailable("down")
        self.events.extend(batch)
        self.took.set()

    async def close(self) -> None:
        return None


async def _audit(engine: AsyncEngine, action: str) -> None:
    async with engine.begin() as conn:
        await audit.record(conn, service="test", actor="t", action=action, subject_type="x", subject_id="1",
                           details={"password": "hunter2"})  # fmt: skip


@pytest.fixture
async def engine(database_url: str) -> Any:
    engine = create_async(database_url)
    yield engine
    await engine.dispose()


async def test_a_transaction_that_commits_late_is_delivered_not_skipped(engine: AsyncEngine) -> None:
    sink = Recording()
    exporter = Exporter(engine, [sink], "versus", batch=50)
    async with engine.begin() as conn:
        await outbox.ensure(conn, sink.name)
    await _audit(engine, "first")
    # A transaction takes the next id and stays open while a later one commits.
    late = await engine.connect()
    transaction = await late.begin()
    await audit.record(
        late, service="test", actor="t", action="late", subject_type="x", subject_id="1", details={}
    )
    await _audit(engine, "after")
    # Only rows of finished transactions older than every running one are offered: not "after"
    # yet, though it committed, because "late" (an older transaction) still runs.
    assert await exporter.once(sink) == 1
    assert [e["data"]["action"] for e in sink.events] == ["first"]
    await transaction.commit()
    await late.close()
    assert await exporter.once(sink) == 2
    assert [e["data"]["action"] for e in sink.events] == ["first", "late", "after"]
    assert await exporter.once(sink) == 0
    assert [e["data"]["details"] for e in sink.events] == [
        {"password": "[REDACTED]"},
        {},
        {"password": "[REDACTED]"},
    ]


async def test_one_exporter_per_sink_and_a_failed_batch_is_offered_again(engine: AsyncEngine) -> None:
    sink = Recording()
    first, second = Exporter(engine, [sink], "versus", batch=10), Exporter(engine, [sink], "versus", batch=10)
    async with engine.begin() as conn:
        await outbox.ensure(conn, sink.name)
    for n in range(25):
        await _audit(engine, f"a{n}")
    sink.failing = True
    with pytest.raises(SinkUnavailable):
        await first.once(sink)
    sink.failing = False
    # Two routers at once: each batch goes to one of them; nothing twice, nothing lost, in order.
    delivered = 0
    while True:
        counts = await asyncio.gather(first.once(sink), second.once(sink))
        delivered += sum(counts)
        if not any(counts):
            break
    assert delivered == 25
    assert [e["data"]["action"] for e in sink.events] == [f"a{n}" for n in range(25)]
    assert len({e["id"] for e in sink.events}) == 25


async def test_the_file_sink_appends_json_lines_and_rotates(engine: AsyncEngine, tmp_path: Path) -> None:
    path = tmp_path / "audit" / "events.jsonl"
    sink = FileSink(path, max_bytes=1024 * 1024, backups=2)
    sink.max_bytes = 2000  # small enough to rotate within the test
    exporter = Exporter(engine, [sink], "acme", batch=5)
    async with engine.begin() as conn:
        await outbox.ensure(conn, sink.name)
    for n in range(30):
        await _audit(engine, f"f{n}")
    while await exporter.once(sink):
        pass
    files = [path.with_name(f"{path.name}.2"), path.with_name(f"{path.name}.1"), path]
    assert all(f.exists() for f in files) and not path.with_name(f"{path.name}.3").exists()
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    lines = [json.loads(line) for f in files for line in f.read_text().splitlines()]
    actions = [e["data"]["action"] for e in lines]
    assert (
        actions == sorted(actions, key=lambda a: int(a[1:])) and actions[-1] == "f29"
    )  # the oldest rotated out
    assert all(e["source"] == "/acme/test" and e["specversion"] == "1.0" for e in lines)


async def test_the_loop_outlives_an_unreachable_database_and_a_failing_sink(engine: AsyncEngine) -> None:
    from router.audit_export.exporter import FAILURES

    # PostgreSQL away from the start (the cursor cannot even be created): retried, never raised.
    away = create_async("postgresql://nobody@127.0.0.1:9/none")
    sink = Recording()
    before = FAILURES.labels(sink.name)._value.get()
    stop = asyncio.Event()
    running = asyncio.create_task(Exporter(away, [sink], "versus").run(stop))
    await asyncio.sleep(1.5)
    stop.set()
    await asyncio.wait_for(running, 5)
    assert FAILURES.labels(sink.name)._value.get() > before
    await away.dispose()
    # A sink that refuses for a while gets everything once it takes again.
    await _audit(engine, "while-down")
    sink.failing = True
    stop = asyncio.Event()
    running = asyncio.create_task(Exporter(engine, [sink], "versus").run(stop))
    await asyncio.sleep(1.2)
    sink.failing = False
    await asyncio.wait_for(sink.took.wait(), 10)
    stop.set()
    await asyncio.wait_for(running, 5)
    assert [e["data"]["action"] for e in sink.events] == ["while-down"]
