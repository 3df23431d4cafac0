"""The console in a real browser: Debian's Chromium, headless, driven by Playwright for Python
(its own browser download is never used; `make system-deps` installs chromium).

An operator signs in, finds a collector by host, probes, drains, undrains and revokes it (and the
revoked collector's connection is closed); with JavaScript disabled the pages still read. Each
page is screenshotted: into the test's directory, or into VERSUS_CONSOLE_SCREENSHOTS when set
(`make console-screenshots` refreshes docs/console/).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from tests.e2e.collector_harness import Collector, Platform, cli_json, wait_for
from tests.e2e.harness import ControlPlane

pytestmark = pytest.mark.timeout(240)
CHROMIUM = "/usr/bin/chromium"
# What the machine's closed network needs (see ../.library/env): no background connections.
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]  # fmt: skip


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if shutil.which(CHROMIUM) is None:
        raise RuntimeError("Chromium missing: run `make system-deps` (make test does)")
    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        yield launched
        launched.close()


def _shots(tmp_path: Path) -> Path:
    where = Path(os.environ.get("VERSUS_CONSOLE_SCREENSHOTS", tmp_path / "screenshots"))
    where.mkdir(parents=True, exist_ok=True)
    return where


def _sign_in(page: Page, base: str, token: str) -> None:
    page.goto(f"{base}/signin")
    page.get_by_label("API token").fill(token)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("heading", name="Collectors", exact=True)).to_be_visible()


def test_an_operator_probes_drains_undrains_and_revokes_a_collector(
    start_control_plane: Callable[..., ControlPlane], tmp_path: Path, browser: Browser
) -> None:
    cp = start_control_plane()
    collector = Collector(cp, tmp_path / "collector", tmp_path / "collector.log")
    collector_id = collector.enroll()
    collector.start()
    shots = _shots(tmp_path)
    base = f"https://localhost:{cp.env['VERSUS_CONSOLE_PORT']}"
    context = browser.new_context(ignore_https_errors=True, viewport={"width": 1280, "height": 900})
    try:
        wait_for(lambda: cli_json(["collectors", "show", collector_id], cp.env)["collector"].get(
            "session_state") == "SESSION_STATE_ACTIVE", timeout=60)  # fmt: skip
        hostname = cli_json(["collectors", "show", collector_id], cp.env)["collector"]["hostname"]
        page = context.new_page()
        page.goto(f"{base}/signin")
        page.screenshot(path=shots / "signin.png")
        _sign_in(page, base, cp.admin_token)
        page.get_by_label("Search by collector ID, hostname or site").fill(hostname)
        page.get_by_role("button", name="Search").click()
        expect(page.get_by_role("link", name=collector_id)).to_be_visible()
        page.screenshot(path=shots / "collectors.png", full_page=True)
        page.get_by_role("link", name=collector_id).click()
        expect(page.get_by_role("heading", name="Live Session")).to_be_visible()

        page.get_by_role("button", name="Probe").click()
        expect(page.get_by_role("status")).to_contain_text("Probe: reachable")
        page.screenshot(path=shots / "collector.png", full_page=True)

        page.get_by_role("link", name="Drain").click()
        expect(page.get_by_text("No new work will be routed")).to_be_visible()
        page.screenshot(path=shots / "confirm-drain.png")
        page.get_by_role("button", name=f"Drain {collector_id}").click()
        expect(page.get_by_role("status")).to_contain_text("Drained")
        assert cli_json(["collectors", "show", collector_id], cp.env)["collector"]["drained"] is True

        page.get_by_role("link", name="Undrain").click()
        page.get_by_role("button", name=f"Undrain {collector_id}").click()
        expect(page.get_by_role("status")).to_contain_text("Undrained")
        assert not cli_json(["collectors", "show", collector_id], cp.env)["collector"].get("drained")

        page.get_by_role("link", name="Revoke").click()
        expect(page.get_by_text("There is no undo")).to_be_visible()
        page.screenshot(path=shots / "confirm-revoke.png")
        page.get_by_label("Reason (kept in the audit log)").fill("decommissioned")
        page.get_by_role("button", name=f"Revoke {collector_id}").click()
        expect(page.get_by_role("status")).to_contain_text("Revoked")
        # The revoked collector's connection is closed: the collector hears it and stops.
        wait_for(lambda: "identity was revoked" in collector.log(), timeout=30)
        assert collector.proc is not None
        assert collector.proc.wait(30) != 0
    finally:
        context.close()
        collector.stop()


def test_pages_read_with_javascript_disabled(
    start_control_plane: Callable[..., ControlPlane], tmp_path: Path, browser: Browser
) -> None:
    cp = start_control_plane()
    collector = Collector(cp, tmp_path / "collector", tmp_path / "collector.log")
    collector_id = collector.enroll()
    base = f"https://localhost:{cp.env['VERSUS_CONSOLE_PORT']}"
    context = browser.new_context(ignore_https_errors=True, java_script_enabled=False)
    try:
        page = context.new_page()
        _sign_in(page, base, cp.admin_token)
        page.get_by_role("link", name=collector_id).click()
        expect(page.get_by_role("heading", name="Identity")).to_be_visible()
        expect(page.get_by_role("heading", name="Driver Capabilities")).to_be_visible()
    finally:
        context.close()


def test_an_operator_resolves_an_indeterminate_task_from_the_queue(
    start_control_plane: Callable[..., ControlPlane], tmp_path: Path, browser: Browser
) -> None:
    cp = start_control_plane()
    collector = Collector(cp, tmp_path / "collector", tmp_path / "collector.log")
    collector.enroll()
    collector.start()
    platform = Platform(cp)
    shots = _shots(tmp_path)
    base = f"https://localhost:{cp.env['VERSUS_CONSOLE_PORT']}"
    context = browser.new_context(ignore_https_errors=True, viewport={"width": 1280, "height": 900})
    try:
        # A one-shot change that landed on the device while its collector was killed: indeterminate.
        task_id = platform.submit(
            collector.site_id, "apply_once", "mutate_terminal", "sw-q", {"sleep": 30}, "k-q"
        )
        wait_for(lambda: len(collector.device("sw-q")) == 1, timeout=60)
        collector.kill()
        collector.start()
        platform.wait_state(task_id, {"indeterminate"}, timeout=90)

        page = context.new_page()
        _sign_in(page, base, cp.admin_token)
        page.get_by_role("link", name="Dispatch queue").click()
        page.get_by_label("Outcome").select_option("indeterminate")
        page.get_by_role("button", name="Filter").click()
        rows = page.get_by_role("row").filter(has_text="indeterminate")
        expect(rows).to_have_count(1)
        page.screenshot(path=shots / "queue.png", full_page=True)
        rows.get_by_role("link").first.click()
        expect(page.get_by_role("heading", name="Resolve this indeterminate task")).to_be_visible()
        page.screenshot(path=shots / "dispatch.png", full_page=True)
        page.get_by_label("was applied (success)").check()
        page.get_by_label("Note").fill("checked sw-q: the change is there")
        page.get_by_role("button", name="Resolve").click()
        expect(page.get_by_role("status")).to_contain_text("Resolved: the task is now success")
        assert platform.wait_state(task_id, {"success"}, timeout=10).state
        events = cli_json(["audit", "list", "--subject", task_id], cp.env)["events"]
        assert any("checked sw-q" in str(e.get("details")) for e in events), events
    finally:
        context.close()
        platform.close()
        collector.stop()
