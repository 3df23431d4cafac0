"""What a live page's stream compares (console/live.py): only what the page shows, and not the
heartbeat's age, which changes every second."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from console.live import fingerprint, reader
from console.queue_views import DispatchPage, DispatchView
from console.views import CollectorFilters, CollectorPage, CollectorView

pytestmark = pytest.mark.timeout(10)

VIEW = CollectorView(
    collector_id="col-1", site_id="site-1", hostname="h1", os="linux", arch="amd64", version="1.0.0",
    fips=False, status="active", session="active", drained=False, cert_serial="1", cert_fingerprint="aa",
    cert_not_after="", enrolled_at="", session_id="s", established_at="", heartbeat_age="1 s",
    transport="wss", queue_depth=0, vault_mode="A", running_vault_mode="A", update_badge="",
    latest_version="", update_policy="manual",
)  # fmt: skip


class Backend:
    def __init__(self) -> None:
        self.view = VIEW
        self.work: list[Any] = []
        self.asked: list[Any] = []

    async def collector(self, token: str, collector_id: str) -> CollectorView:
        self.asked.append((token, collector_id))
        return self.view

    async def collectors(self, token: str, filters: CollectorFilters, page: str) -> CollectorPage:
        self.asked.append((token, filters, page))
        return CollectorPage([self.view], "", 0)

    async def dispatches(self, token: str, outcome: str, site: str, collector_id: str, page: str,
                         page_size: int = 50) -> DispatchPage:  # fmt: skip
        return DispatchPage(self.work, "")


@pytest.mark.parametrize("path", ["/audit", "/sites", "/queue?outcome=nope", "/collectors/a/b", "/signin"])
def test_pages_without_live_data_have_no_stream(path: str) -> None:
    assert reader(Backend(), "tok", path) is None  # type: ignore[arg-type]


async def test_a_detail_page_changes_with_its_state_not_with_its_heartbeat_age() -> None:
    backend = Backend()
    read = reader(backend, "tok", "/collectors/col-1")  # type: ignore[arg-type]
    assert read is not None
    before = fingerprint(await read())
    backend.view = dataclasses.replace(VIEW, heartbeat_age="3 s")
    assert fingerprint(await read()) == before
    backend.view = dataclasses.replace(VIEW, drained=True)
    drained = fingerprint(await read())
    assert drained != before
    assert backend.asked[0] == ("tok", "col-1")  # as the signed-in operator, for that collector
    backend.work = [  # new work in its Recent work table is a change too
        DispatchView(
            dispatch_id="dsp-1",
            task_id="tsk-1",
            collector_id="col-1",
            site_id="site-1",
            target_ref="sw",
            provider="stub",
            operation="echo",
            op_class="read",
            state="success",
            task_state="success",
            attempt=1,
            kind="execute",
            created_at="",
            reported_at="",
            error_code="",
            error_message="",
        )
    ]
    assert fingerprint(await read()) != drained


async def test_the_list_is_read_with_the_page_s_own_filters() -> None:
    backend = Backend()
    read = reader(backend, "tok", "/collectors?status=pending&driver=ssh&page=col-9")  # type: ignore[arg-type]
    assert read is not None
    await read()
    assert backend.asked == [("tok", CollectorFilters(status="pending", driver="ssh"), "col-9")]
