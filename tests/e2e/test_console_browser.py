"""The console in a real browser: Debian's Chromium, headless, driven by Playwright for Python
(its own browser download is never used; `make system-deps` installs chromium).

An operator signs in, finds a collector by host, probes, drains, undrains and revokes it (and the
revoked collector's connection is closed); a viewer sees no action it cannot take, and a form
another site makes the browser post is refused; with JavaScript disabled the pages still read. Each
page is screenshotted: into the test's directory, or into VERSUS_CONSOLE_SCREENSHOTS when set
(`make console-screenshots` refreshes docs/console/).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, ConsoleMessage, expect

from tests.e2e.browser_support import (
    OtherSite,
    check_accessible,
    console_context,
    launched_browser,
    screenshot_dir,
    sign_in,
)
from tests.e2e.collector_harness import Collector, Platform, cli_json, wait_for
from tests.e2e.harness import ControlPlane, control_plane_for

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    yield from launched_browser()


@pytest.fixture(scope="module")
def browser_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """The module's control plane: its pages list the fleet, so only this module's collectors
    (and the screenshots in docs/console/ show only what these tests made)."""
    yield from control_plane_for(tmp_path_factory, "browser-control-plane")


def test_an_operator_probes_drains_undrains_and_revokes_a_collector(
    browser_plane: ControlPlane, tmp_path: Path, browser: Browser
) -> None:
    cp = browser_plane
    collector = Collector(cp, tmp_path / "collector", tmp_path / "collector.log")
    collector_id = collector.enroll()
    collector.start()
    shots = screenshot_dir(tmp_path)
    base = f"https://localhost:{cp.env['VERSUS_CONSOLE_PORT']}"
    context = console_context(browser)
    refused: list[str] = []

    def watch(message: ConsoleMessage) -> None:
        if "Content Security Policy" in message.text:
            refused.append(message.text)

    context.on("console", watch)
    try:
        wait_for(lambda: cp.api.collector(collector_id).get(
            "session_state") == "SESSION_STATE_ACTIVE", timeout=60)  # fmt: skip
        hostname = cp.api.collector(collector_id)["hostname"]
        page = context.new_page()
        page.goto(f"{base}/signin")
        page.screenshot(path=shots / "signin.png")
        sign_in(page, base, cp.admin_token)
        page.get_by_role("link", name="Collectors", exact=True).click()
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
        assert cp.api.collector(collector_id)["drained"] is True

        page.get_by_role("link", name="Undrain").click()
        page.get_by_role("button", name=f"Undrain {collector_id}").click()
        expect(page.get_by_role("status")).to_contain_text("Undrained")
        assert not cp.api.collector(collector_id).get("drained")

        # Live: another operator drains it from the CLI; the open page shows it without a reload.
        page.evaluate("window.__notReloaded = true")
        cli_json(["collectors", "drain", collector_id], cp.env)
        expect(page.locator("#main .badge", has_text="drained")).to_be_visible(timeout=15_000)
        cli_json(["collectors", "undrain", collector_id], cp.env)
        expect(page.locator("#main .badge", has_text="drained")).to_have_count(0, timeout=15_000)
        assert page.evaluate("window.__notReloaded") is True

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
        assert refused == []  # nothing on the pages breaks the console's own CSP
    finally:
        context.close()
        collector.stop()


def test_pages_read_with_javascript_disabled(
    browser_plane: ControlPlane, tmp_path: Path, browser: Browser
) -> None:
    cp = browser_plane
    collector = Collector(cp, tmp_path / "collector", tmp_path / "collector.log")
    collector_id = collector.enroll()
    base = f"https://localhost:{cp.env['VERSUS_CONSOLE_PORT']}"
    context = console_context(browser, java_script_enabled=False)
    try:
        page = context.new_page()
        sign_in(page, base, cp.admin_token)
        page.get_by_role("link", name="Collectors", exact=True).click()
        page.get_by_role("link", name=collector_id).click()
        expect(page.get_by_role("heading", name="Identity")).to_be_visible()
        expect(page.get_by_role("heading", name="Driver Capabilities")).to_be_visible()
    finally:
        context.close()


def test_an_operator_resolves_an_indeterminate_task_from_the_queue(
    browser_plane: ControlPlane, tmp_path: Path, browser: Browser
) -> None:
    cp = browser_plane
    collector = Collector(cp, tmp_path / "collector", tmp_path / "collector.log")
    collector_id = collector.enroll()
    collector.start()
    platform = Platform(cp)
    shots = screenshot_dir(tmp_path)
    base = f"https://localhost:{cp.env['VERSUS_CONSOLE_PORT']}"
    context = console_context(browser, bypass_csp=True)
    try:
        page = context.new_page()
        page.goto(f"{base}/signin")
        check_accessible(page, "signin")
        sign_in(page, base, cp.admin_token)
        # The indeterminate queue, open while the task becomes indeterminate: it appears live.
        watching = context.new_page()
        watching.goto(f"{base}/queue?outcome=indeterminate")
        expect(watching.get_by_role("row").filter(has_text="indeterminate")).to_have_count(0)
        watching.evaluate("window.__notReloaded = true")

        # A one-shot change that landed on the device while its collector was killed: indeterminate.
        task_id = platform.submit(
            collector.site_id, "apply_once", "mutate_terminal", "sw-q", {"sleep": 30}, "k-q"
        )
        wait_for(lambda: len(collector.device("sw-q")) == 1, timeout=60)
        collector.kill()
        collector.start()
        platform.wait_state(task_id, {"indeterminate"}, timeout=90)
        expect(watching.get_by_role("row").filter(has_text="indeterminate")).to_have_count(1, timeout=15_000)
        assert watching.evaluate("window.__notReloaded") is True
        watching.close()

        page.goto(f"{base}/collectors")
        check_accessible(page, "collectors")
        # Its own collector: the module's other tests have theirs (one revoked) on the same list.
        page.get_by_role("link", name=collector_id).click()
        check_accessible(page, "collector")
        page.get_by_role("link", name="Drain").click()
        check_accessible(page, "confirm")
        page.get_by_role("link", name="Dispatch queue").click()
        page.get_by_label("Outcome").select_option("indeterminate")
        page.get_by_role("button", name="Filter").click()
        rows = page.get_by_role("row").filter(has_text="indeterminate")
        expect(rows).to_have_count(1)
        page.screenshot(path=shots / "queue.png", full_page=True)
        check_accessible(page, "queue")
        rows.get_by_role("link").first.click()
        expect(page.get_by_role("heading", name="Resolve this indeterminate task")).to_be_visible()
        check_accessible(page, "dispatch")
        page.screenshot(path=shots / "dispatch.png", full_page=True)
        # The note's label sits beside its own field, on its row (it once sat right of the fieldset).
        note, field = page.locator("label[for=note]").bounding_box(), page.locator("#note").bounding_box()
        assert note is not None and field is not None
        assert note["x"] + note["width"] <= field["x"] + 1, (note, field)
        assert abs((note["y"] + note["height"] / 2) - (field["y"] + field["height"] / 2)) < 8, (note, field)
        page.get_by_label("was applied (success)").check()
        page.get_by_label("Note").fill("checked sw-q: the change is there")
        page.get_by_role("button", name="Resolve").click()
        expect(page.get_by_role("status")).to_contain_text("Resolved: the task is now success")
        assert platform.wait_state(task_id, {"success"}, timeout=10).state
        events = cli_json(["audit", "list", "--subject", task_id], cp.env)["events"]
        assert any("checked sw-q" in str(e.get("details")) for e in events), events
        page.get_by_role("link", name="Audit log").click()
        expect(page.get_by_text("checked sw-q")).to_be_visible()
        page.screenshot(path=shots / "audit.png", full_page=True)
        check_accessible(page, "audit")
    finally:
        context.close()
        platform.close()
        collector.stop()


def test_an_admin_sets_a_site_policy_issues_a_token_and_enrolls_a_collector_with_the_shown_command(
    browser_plane: ControlPlane, tmp_path: Path, browser: Browser
) -> None:
    cp = browser_plane
    site_id = cp.api.create_site("rack-7")["site"]["site_id"]
    shots = screenshot_dir(tmp_path)
    base = f"https://localhost:{cp.env['VERSUS_CONSOLE_PORT']}"
    context = console_context(browser, bypass_csp=True)
    collector = Collector(cp, tmp_path / "collector", tmp_path / "collector.log")
    try:
        page = context.new_page()
        sign_in(page, base, cp.admin_token)
        page.get_by_role("link", name="Sites").click()
        page.screenshot(path=shots / "sites.png", full_page=True)
        check_accessible(page, "sites")
        page.get_by_role("link", name=site_id).click()
        page.get_by_label("Policy", exact=True).select_option("auto")
        page.get_by_role("button", name="Save policy").click()
        expect(page.get_by_role("status")).to_contain_text("Update policy saved")
        shown = next(s for s in cli_json(["sites", "list"], cp.env)["sites"] if s["site_id"] == site_id)
        assert shown["update_policy"] == "UPDATE_POLICY_AUTO", shown

        page.get_by_label("Max uses").fill("1")
        page.get_by_role("button", name="Issue token").click()
        expect(page.get_by_role("heading", name="Enrollment token issued")).to_be_visible()
        plaintext = page.locator("#plaintext").inner_text()
        command = page.locator("#enroll-command").inner_text()
        assert len(plaintext) > 20
        assert plaintext not in command  # the command never carries the token
        page.screenshot(path=shots / "token-issued.png")
        check_accessible(page, "token issued")
        # The site's collectors, open in another tab while the collector enrolls: it appears live.
        watching = context.new_page()
        watching.goto(f"{base}/collectors?site={site_id}")
        expect(watching.get_by_text("No collector matches.")).to_be_visible()
        watching.evaluate("window.__notReloaded = true")
        # Enrolled on the "collector host" exactly as the page says.
        collector_id = collector.enroll(site_id, issued={"enroll_command": command, "plaintext": plaintext})
        expect(watching.get_by_role("link", name=collector_id)).to_be_visible(timeout=15_000)
        assert watching.evaluate("window.__notReloaded") is True
        watching.close()
        page.goto(f"{base}/sites/{site_id}")
        expect(page.get_by_text("0 of 1")).to_be_visible()  # the token was used
        assert plaintext not in page.content()  # only its prefix is ever listed
        page.screenshot(path=shots / "site.png", full_page=True)
        check_accessible(page, "site")

        # A second token, revoked from the page.
        page.get_by_role("button", name="Issue token").click()
        page.get_by_role("link", name="Back to the site").click()
        # Revoking asks first, as revoking a collector does (it used to happen on one click).
        active = page.get_by_role("link", name=re.compile("Revoke token"))
        expect(active).to_have_count(1)
        active.click()
        expect(page.get_by_role("heading", name=re.compile("Revoke token"))).to_be_visible()
        assert {t["status"] for t in cli_json(["tokens", "list", "--site", site_id], cp.env)["tokens"]} == {
            "TOKEN_STATUS_EXHAUSTED", "TOKEN_STATUS_ACTIVE"}  # fmt: skip
        check_accessible(page, "confirm token revoke")
        page.get_by_role("button", name=re.compile("Revoke token")).click()
        expect(page.get_by_role("status")).to_contain_text("Token revoked")
        statuses = {t["status"] for t in cli_json(["tokens", "list", "--site", site_id], cp.env)["tokens"]}
        assert statuses == {"TOKEN_STATUS_EXHAUSTED", "TOKEN_STATUS_REVOKED"}, statuses

        page.get_by_role("link", name="Releases").click()
        expect(page.get_by_role("heading", name="Publish a release")).to_be_visible()
        page.screenshot(path=shots / "releases.png", full_page=True)
        check_accessible(page, "releases")
    finally:
        context.close()
        collector.stop()


def test_a_viewer_cannot_act_and_another_site_cannot_post_as_the_operator(
    browser_plane: ControlPlane, tmp_path: Path, browser: Browser
) -> None:
    cp = browser_plane
    collector_id = Collector(cp, tmp_path / "collector", tmp_path / "collector.log").enroll()
    base = f"https://localhost:{cp.env['VERSUS_CONSOLE_PORT']}"
    other = OtherSite(f"{base}/collectors/{collector_id}/drain")
    context = console_context(browser)
    try:
        page = context.new_page()
        sign_in(page, base, cp.mint_token("viewer", "browser-viewer"))
        page.goto(f"{base}/collectors/{collector_id}")
        expect(page.get_by_role("button", name="Probe")).to_be_visible()  # a viewer may probe
        for link in ("Drain", "Revoke"):
            expect(page.get_by_role("link", name=link)).to_have_count(0)
        expect(page.get_by_role("button", name="Switch vault mode")).to_have_count(0)
        page.get_by_role("button", name="Sign out").click()

        sign_in(page, base, cp.admin_token)
        page.goto(f"{base}/collectors/{collector_id}")
        expect(page.get_by_role("link", name="Drain")).to_be_visible()  # an admin could drain it
        page.goto(other.url)  # the other site's form submits itself at once
        expect(page.get_by_text("cross_site_request")).to_be_visible()
        assert not cp.api.collector(collector_id).get("drained")
    finally:
        context.close()
        other.close()


def test_an_operator_follows_a_running_task_cancels_and_retries_it_and_finds_a_waiting_one(
    browser_plane: ControlPlane, tmp_path: Path, browser: Browser
) -> None:
    cp = browser_plane
    collector = Collector(cp, tmp_path / "collector", tmp_path / "collector.log")
    collector.enroll()
    collector.start()
    platform = Platform(cp)
    shots = screenshot_dir(tmp_path)
    base = f"https://localhost:{cp.env['VERSUS_CONSOLE_PORT']}"
    context = console_context(browser, bypass_csp=True)
    empty_site = cp.api.create_site("rack-empty")["site"]["site_id"]
    try:
        # A task for a site with no collector waits, and the Tasks page says why.
        waiting = platform.submit(empty_site, "echo", "read", "sw-w", {}, "k-waiting")
        page = context.new_page()
        sign_in(page, base, cp.admin_token)
        page.get_by_role("link", name="Tasks", exact=True).click()
        page.get_by_label("State").select_option("waiting")
        page.get_by_role("button", name="Filter").click()
        row = page.get_by_role("row").filter(has_text=waiting)
        expect(row).to_contain_text("no eligible collector")
        check_accessible(page, "tasks")

        # A task streaming its output slowly: the open task page shows each line as it arrives.
        streaming = platform.submit(
            collector.site_id,
            "dump",
            "read",
            "sw-s",
            {"lines": 40, "every": 1},
            "k-stream",
            features=["cancel", "output_stream"],
        )
        wait_for(lambda: platform.task(streaming).task.output_length > 0, timeout=60)
        page.goto(f"{base}/tasks/{streaming}")
        page.evaluate("window.__notReloaded = true")
        expect(page.locator("pre.output")).to_contain_text("line 2 of 40", timeout=15_000)
        expect(page.locator("pre.output")).to_contain_text("line 5 of 40", timeout=15_000)
        assert page.evaluate("window.__notReloaded") is True
        page.screenshot(path=shots / "task-running.png", full_page=True)
        check_accessible(page, "task")

        # Cancel it from the console, behind a confirmation.
        page.get_by_role("link", name="Cancel").click()
        expect(page.get_by_text("asked to stop")).to_be_visible()
        check_accessible(page, "confirm cancel")
        page.get_by_label("Reason").fill("wrong window")
        page.get_by_role("button", name="Cancel the task").click()
        expect(page.get_by_role("status").first).to_be_visible()
        assert platform.wait_state(streaming, {"cancelled"}, timeout=30).state
        page.reload()
        expect(page.locator(".badge").first).to_have_text("cancelled")
        download = page.get_by_role("link", name="Download the whole output")
        assert download.get_attribute("download") is not None
        got = page.request.get(f"{base}{download.get_attribute('href')}")  # with the page's session
        assert got.headers["content-disposition"] == f'attachment; filename="{streaming}.output"'
        assert got.text().startswith("line 1 of 40\nline 2 of 40\n")

        # Retry: a new task, the same operation, pointing back at the one it repeats.
        page.get_by_role("link", name="Retry").click()
        page.get_by_role("button", name="Retry the task").click()
        expect(page.get_by_role("status")).to_contain_text(f"A retry of {streaming}")
        retry_id = page.locator("h1").inner_text()
        assert retry_id != streaming
        again = platform.task(retry_id).task
        assert (again.operation, again.target_ref, again.labels["versus.retry_of"]) == (
            "dump",
            "sw-s",
            streaming,
        )
        events = cli_json(["audit", "list", "--subject", retry_id], cp.env)["events"]
        assert [e["action"] for e in events] == ["task.retry"], events
        platform.cancel(retry_id)
        page.goto(f"{base}/tasks?state=cancelled")
        expect(page.get_by_role("row").filter(has_text=streaming)).to_have_count(1)
        # The filtered list exports as the page's own links say: CSV and JSON, the same tasks.
        csv_href = page.get_by_role("link", name="CSV").get_attribute("href")
        exported = page.request.get(f"{base}{csv_href}")
        assert exported.headers["content-type"].startswith("text/csv")
        assert streaming in exported.text() and exported.text().startswith("task_id,state,why,")
        as_json = page.request.get(
            f"{base}{page.get_by_role('link', name='JSON').get_attribute('href')}"
        ).json()
        assert streaming in {t["task_id"] for t in as_json} and {t["state"] for t in as_json} == {"cancelled"}
        page.goto(f"{base}/tasks")
        page.screenshot(path=shots / "tasks.png", full_page=True)
        page.goto(f"{base}/")  # the fleet this module made, at a glance
        expect(page.get_by_role("heading", name="Fleet overview")).to_be_visible()
        page.screenshot(path=shots / "overview.png", full_page=True)
    finally:
        context.close()
        platform.close()
        collector.stop()
