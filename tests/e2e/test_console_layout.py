"""The console's layout, checked by element geometry in Debian's Chromium, not by eye: every page at
390 px (a phone) and 1400 px, light and dark, with no serious or critical axe-core violation; no
page scrolls sideways on a phone, Sign out stays on screen, each filter's label sits above its own
field, ids and times do not wrap on a desk. And the small things a new operator hit: the error
page's way back, a failed probe shown as a problem, the token form's 1-hour default, a favicon.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.e2e.browser_support import check_accessible, launched_browser, screenshot_dir, sign_in
from tests.e2e.collector_harness import Collector, Platform
from tests.e2e.harness import ControlPlane

pytestmark = pytest.mark.timeout(240)
PAGES = [
    "/",
    "/collectors",
    "/tasks",
    "/queue",
    "/sites",
    "/releases",
    "/tools",
    "/integrations/vaults",
    "/audit",
]
PHONE, DESK = (390, 844), (1400, 900)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    yield from launched_browser()


def _box(page: Page, selector: str) -> dict[str, float]:
    box = page.locator(selector).first.bounding_box()
    assert box is not None, selector
    return {"x": box["x"], "y": box["y"], "width": box["width"], "height": box["height"]}


def _too_wide(page: Page) -> list[str]:
    """The elements (not inside a scrolling box) that reach past a phone's width: what to fix."""
    found: list[str] = page.evaluate(
        """(limit) => [...document.querySelectorAll("body *")]
            .filter(e => !e.closest(".scroll")
                && (e.getBoundingClientRect().right > limit || e.scrollWidth > e.clientWidth + 1))
            .map(e => e.tagName.toLowerCase() + (e.id ? "#" + e.id : "") + "." + e.className
                 + " " + Math.round(e.getBoundingClientRect().right)).slice(0, 8)""",
        PHONE[0],
    )
    return found


def _fits_a_phone(page: Page, path: str) -> None:
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= PHONE[0], (path, "scrolls sideways", width, _too_wide(page))
    signout = _box(page, ".signout button")
    assert signout["x"] >= 0 and signout["x"] + signout["width"] <= PHONE[0], (path, signout)
    labels: list[dict[str, Any]] = page.evaluate(
        """() => [...document.querySelectorAll("form.filters label[for]")].map(l => {
            const a = l.getBoundingClientRect();
            const b = document.getElementById(l.htmlFor).getBoundingClientRect();
            return {name: l.htmlFor, label: [a.left, a.bottom], field: [b.left, b.top]};
        })"""
    )
    for pair in labels:  # each label directly above its own field, never beside another's
        (label_x, label_bottom), (field_x, field_top) = pair["label"], pair["field"]
        assert abs(label_x - field_x) < 2 and label_bottom <= field_top + 2, (path, pair)


def _checked(page: Page, name: str, width: int, scheme: str) -> None:
    check_accessible(page, f"{name} at {width} px, {scheme}")
    if width == PHONE[0]:
        wide = page.evaluate("document.documentElement.scrollWidth")
        assert wide <= PHONE[0], (name, wide, _too_wide(page))


def _one_dispatch(cp: ControlPlane, tmp_path: Path) -> str:
    """A dispatch of a task a collector ran, for its page."""
    collector = Collector(cp, tmp_path / "runner", tmp_path / "runner.log")
    collector.enroll()
    collector.start()
    platform = Platform(cp)
    try:
        task_id = platform.submit(
            collector.site_id, "echo", "read", "sw-d", {}, f"layout-d-{collector.site_id}"
        )
        task = platform.wait_state(task_id, {"success"}, timeout=60)
        return str(next(h.dispatch_id for h in task.history if h.dispatch_id))
    finally:
        platform.close()
        collector.stop()


def test_every_page_fits_a_phone_and_a_desk_in_light_and_dark(
    shared_control_plane: ControlPlane, tmp_path: Path, browser: Browser
) -> None:
    cp = shared_control_plane
    site_id = cp.api.create_site("layout-site")["site"]["site_id"]
    # Enrolled, never started: listed (ids to measure) and unreachable (a probe that fails).
    collector_id = Collector(cp, tmp_path / "collector", tmp_path / "collector.log").enroll(site_id)
    platform = Platform(cp)
    try:  # a task waiting (no collector runs at the site): its page has the condition and a Cancel
        task_id = platform.submit(site_id, "echo", "read", "sw-l", {}, f"layout-{site_id}")
        settled = platform.submit(site_id, "echo", "read", "sw-l", {}, f"layout-settled-{site_id}")
        platform.cancel(settled)  # and a settled one, to retry
    finally:
        platform.close()
    token_id = cp.api.issue_token(site_id)["token"]["token_id"]
    dispatch_id = _one_dispatch(cp, tmp_path)
    details = [
        f"/collectors/{collector_id}", f"/sites/{site_id}",
        f"/tasks/{task_id}", f"/tasks/{task_id}/confirm/cancel",
        f"/collectors/{collector_id}/confirm/revoke", f"/bulk/confirm?action=drain&id={collector_id}",
        f"/tokens/{token_id}/confirm?site={site_id}", f"/tasks/{settled}/confirm/retry",
        "/releases/0.0.0-layout/confirm/yank", f"/queue/{dispatch_id}",
        "/queue/dsp-no-such",  # a confirmation each, a dispatch, an error
    ]  # fmt: skip
    base = f"https://localhost:{cp.env['VERSUS_CONSOLE_PORT']}"
    for scheme in ("light", "dark"):
        for width, height in (PHONE, DESK):
            context = browser.new_context(
                ignore_https_errors=True, viewport={"width": width, "height": height}, color_scheme=scheme,
                bypass_csp=True,
            )  # fmt: skip
            try:
                page = context.new_page()
                page.goto(f"{base}/signin")
                check_accessible(page, f"/signin at {width} px, {scheme}")
                sign_in(page, base, cp.admin_token)
                page.wait_for_load_state("load")  # the stylesheet applied, not only the HTML parsed
                background = page.evaluate("getComputedStyle(document.body).backgroundColor")
                assert (background == "rgb(255, 255, 255)") is (scheme == "light"), (scheme, background)
                for path in PAGES:
                    page.goto(f"{base}{path}")
                    check_accessible(page, f"{path} at {width} px, {scheme}")
                    if width == PHONE[0]:
                        _fits_a_phone(page, path)
                        if scheme == "dark" and path in ("/", "/tasks"):
                            name = f"{path.strip('/') or 'overview'}-phone-dark.png"
                            page.screenshot(path=screenshot_dir(tmp_path) / name, full_page=True)
                page.goto(f"{base}/collectors?site={site_id}")
                link = page.get_by_role("link", name=collector_id)
                expect(link).to_be_visible()
                if width == DESK[0]:  # an id on one line, not wrapped over several
                    assert page.evaluate("(a) => a.getClientRects().length", link.element_handle()) == 1
                    assert _box(page, f"a[href='/collectors/{collector_id}']")["height"] < 30
                for path in details:
                    page.goto(f"{base}{path}")
                    _checked(page, path, width, scheme)
                # The pages an action answers with: a bulk action's result, a token shown once.
                page.goto(f"{base}/bulk/confirm?action=undrain&id={collector_id}")
                page.get_by_role("button", name=re.compile("Undrain 1 collector")).click()
                expect(page.get_by_role("heading", name="Undrain: 1 of 1 done")).to_be_visible()
                _checked(page, "the bulk result", width, scheme)
                page.goto(f"{base}/sites/{site_id}")
                page.get_by_role("button", name="Issue token").click()
                expect(page.get_by_role("heading", name="Enrollment token issued")).to_be_visible()
                _checked(page, "an issued token", width, scheme)
            finally:
                context.close()


def test_the_small_things_a_new_operator_hit(
    shared_control_plane: ControlPlane, tmp_path: Path, browser: Browser
) -> None:
    cp = shared_control_plane
    site_id = cp.api.create_site("small-things")["site"]["site_id"]
    collector_id = Collector(cp, tmp_path / "collector", tmp_path / "collector.log").enroll(site_id)
    base = f"https://localhost:{cp.env['VERSUS_CONSOLE_PORT']}"
    context = browser.new_context(ignore_https_errors=True, bypass_csp=True)
    try:
        page = context.new_page()
        sign_in(page, base, cp.admin_token)
        # An unknown dispatch leads back to the dispatch queue, not to the collectors.
        page.goto(f"{base}/queue/dsp-no-such")
        expect(page.get_by_text("dispatch_not_found")).to_be_visible()
        assert page.get_by_role("link", name="Back to the dispatch queue").get_attribute("href") == "/queue"
        # A probe that cannot reach the collector is a problem, not a notice.
        page.goto(f"{base}/collectors/{collector_id}")
        page.get_by_role("button", name="Probe").click()
        alert = page.get_by_role("alert")
        expect(alert).to_contain_text("Probe: not reachable")
        assert "error" in (alert.get_attribute("class") or "")
        expect(page.locator("p.notice")).to_have_count(0)
        # The token form offers an hour, as the CLI and the docs do (24 h is the most it allows).
        page.goto(f"{base}/sites/{site_id}")
        assert page.locator("#ttl").input_value() == "1"
        # The browser's own request for an icon is answered.
        icon = page.request.get(f"{base}/favicon.ico")
        assert icon.status == 200 and icon.headers["content-type"].startswith("image/svg+xml")
        assert page.locator("link[rel=icon]").get_attribute("href") == "/static/favicon.svg"
    finally:
        context.close()


def test_the_overview_shows_what_needs_a_look_with_names_and_links(
    shared_control_plane: ControlPlane, tmp_path: Path, browser: Browser
) -> None:
    cp = shared_control_plane
    name = f"overview-{tmp_path.name[-6:]}"
    site_id = cp.api.create_site(name)["site"]["site_id"]
    platform = Platform(cp)
    context = browser.new_context(ignore_https_errors=True)
    try:
        # Two tasks for a site no collector serves: they wait, and the overview counts them.
        for key in ("ov-1", "ov-2"):
            platform.submit(site_id, "echo", "read", "sw-o", {}, f"{key}-{site_id}")
        page = context.new_page()
        sign_in(page, f"https://localhost:{cp.env['VERSUS_CONSOLE_PORT']}", cp.admin_token)
        row = page.get_by_role("row").filter(has=page.get_by_role("link", name=name, exact=True))
        expect(row).to_have_count(1, timeout=20_000)  # the router samples every 2 s here
        expect(row.get_by_role("link", name="2")).to_have_attribute(
            "href", f"/tasks?state=waiting&site={site_id}"
        )
        expect(page.get_by_role("img", name=re.compile("Tasks settled in the last hour"))).to_be_visible()
        expect(page.get_by_role("img", name=re.compile("Tasks settled in the last day"))).to_be_visible()
        row.get_by_role("link", name="2").click()
        expect(page.get_by_role("row").filter(has_text="no eligible collector")).to_have_count(2)
    finally:
        context.close()
        platform.close()
