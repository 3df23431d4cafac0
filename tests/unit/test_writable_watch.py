"""The readiness watch of the service processes (common/db/writable.py): its callback fires when
the answer changes (writable or not, and why not), never on a repeated answer."""

from __future__ import annotations

from collections.abc import Iterator

from common.db.writable import READ_ONLY, WritableWatch


def _watch(answers: list[str | None], calls: list[str | None]) -> WritableWatch:
    replies: Iterator[str | None] = iter(answers)

    async def probe(url: str) -> str | None:
        assert url == "postgresql://db/versus"
        return next(replies)

    async def changed(reason: str | None) -> None:
        calls.append(reason)

    return WritableWatch("postgresql://db/versus", changed, probe=probe)


async def test_edges_only() -> None:
    calls: list[str | None] = []
    watch = _watch([None, "unreachable: refused", READ_ONLY, READ_ONLY, None, None], calls)
    for _ in range(6):
        await watch.step()
    assert calls == ["unreachable: refused", READ_ONLY, None]
    assert watch.reason is None
