"""Running the fleet from the console in Debian's Chromium: a bulk drain of a whole site and an
undrain of a selection, each behind one confirmation naming the count, audited one event per
collector; and a collector's page showing its recent work, linked to the task and its site."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, expect

from tests.e2e.browser_support import check_accessible, launched_browser, screenshot_dir, sign_in
from tests.e2e.collector_harness import Collector, Platform, cli_json
from tests.e2e.harness import ControlPlane, run_cli

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    yield from launched_browser()


def test_an_operator_drains_a_site_and_undrains_a_selection(
    shared_control_plane: ControlPlane, tmp_path: Path, browser: Browser
) -> None:
    cp = shared_control_plane
    name = f"bulk-{tmp_path.name[-6:]}"
    site_id = cp.api.create_site(name)["site"]["site_id"]
    ids = [Collector(cp, tmp_path / f"c{i}", tmp_path / f"c{i}.log").enroll(site_id) for i in range(3)]
    base = f"https://localhost:{cp.env['VERSUS_CONSOLE_PORT']}"
    context = browser.new_context(ignore_https_errors=True, bypass_csp=True)
    try:
        page = context.new_page()
        sign_in(page, base, cp.admin_token)
        page.goto(f"{base}/sites/{site_id}")
        page.get_by_role("link", name="Drain the site…", exact=True).click()
        expect(page.get_by_role("heading", name="Drain 3 collectors of this site?")).to_be_visible()
        assert not any(cp.api.collector(i).get("drained") for i in ids)  # nothing before the confirmation
        check_accessible(page, "bulk confirmation")
        page.screenshot(path=screenshot_dir(tmp_path) / "confirm-bulk.png", full_page=True)
        page.get_by_role("button", name=re.compile("Drain 3 collectors")).click()
        expect(page.get_by_role("heading", name="Drain: 3 of 3 done")).to_be_visible()
        assert all(cp.api.collector(i).get("drained") for i in ids)
        for collector_id in ids:
            events = cli_json(["audit", "list", "--subject", collector_id], cp.env)["events"]
            assert [e["action"] for e in events].count("collector.drain") == 1, events

        # A selection from the list: two of the three, undrained.
        page.goto(f"{base}/collectors?site={site_id}")
        expect(page.get_by_role("link", name=name).first).to_be_visible()  # the site by its name
        for collector_id in ids[:2]:
            page.get_by_label(f"Select {collector_id}").check()
        page.get_by_label("With the selected collectors").select_option("undrain")
        page.get_by_role("button", name="Review…").click()
        expect(page.get_by_role("heading", name="Undrain 2 collectors?")).to_be_visible()
        page.get_by_role("button", name=re.compile("Undrain 2 collectors")).click()
        expect(page.get_by_role("heading", name="Undrain: 2 of 2 done")).to_be_visible()
        assert [bool(cp.api.collector(i).get("drained")) for i in ids] == [False, False, True]

        # Revoking a selection says what cannot be undone (revoking one already revoked is no error).
        assert run_cli(["collectors", "revoke", ids[0], "--reason", "test"], cp.env).returncode == 0
        page.goto(f"{base}/collectors?site={site_id}")
        for collector_id in ids[:2]:
            page.get_by_label(f"Select {collector_id}").check()
        page.get_by_label("With the selected collectors").select_option("revoke")
        page.get_by_role("button", name="Review…").click()
        expect(page.get_by_text("There is no undo")).to_be_visible()
        page.get_by_label("Reason (kept in the audit log)").fill("decommissioned rack")
        page.get_by_role("button", name=re.compile("Revoke 2 collectors")).click()
        expect(page.get_by_role("heading", name="Revoke: 2 of 2 done")).to_be_visible()
        statuses = [cp.api.collector(i)["status"] for i in ids]
        assert statuses == ["COLLECTOR_STATUS_REVOKED", "COLLECTOR_STATUS_REVOKED", "COLLECTOR_STATUS_ACTIVE"]

        # A bulk action the services refuse for some: each refusal is listed with its code, beside
        # its collector, and the page says how many were done (none here: the site updates itself,
        # and a revoked collector takes no update).
        auto = run_cli(["sites", "update", site_id, "--update-policy", "auto"], cp.env)
        assert auto.returncode == 0, auto.stderr
        page.goto(f"{base}/bulk/confirm?action=apply_update&id={ids[0]}&id={ids[2]}")
        page.get_by_role("button", name=re.compile("Apply the update to 2 collectors")).click()
        expect(page.get_by_role("heading", name="Apply the update to: 0 of 2 done")).to_be_visible()
        refused = page.get_by_role("listitem")
        expect(refused.filter(has_text=ids[0])).to_contain_text("collector_not_active")
        expect(refused.filter(has_text=ids[2])).to_contain_text("update_policy_not_manual")
    finally:
        context.close()


def test_a_collectors_page_shows_its_recent_work_linked_to_tasks_and_its_site(
    shared_control_plane: ControlPlane, tmp_path: Path, browser: Browser
) -> None:
    cp = shared_control_plane
    collector = Collector(cp, tmp_path / "collector", tmp_path / "collector.log")
    collector_id = collector.enroll()
    collector.start()
    platform = Platform(cp)
    base = f"https://localhost:{cp.env['VERSUS_CONSOLE_PORT']}"
    context = browser.new_context(ignore_https_errors=True, bypass_csp=True)
    try:
        task_id = platform.submit(
            collector.site_id, "echo", "read", "sw-r", {"hello": 1}, f"recent-{collector_id}"
        )
        platform.wait_state(task_id, {"success"}, timeout=60)
        page = context.new_page()
        sign_in(page, base, cp.admin_token)
        page.goto(f"{base}/collectors/{collector_id}")
        work = page.get_by_role("region", name="Recent work")
        expect(work.get_by_role("link", name=task_id)).to_be_visible()
        check_accessible(page, "collector with work")
        page.screenshot(path=screenshot_dir(tmp_path) / "collector-work.png", full_page=True)
        work.get_by_role("link", name=task_id).click()
        expect(page.get_by_role("heading", name=task_id)).to_be_visible()
        expect(page.locator("pre.evidence").first).to_contain_text('"hello": 1')
    finally:
        context.close()
        platform.close()
        collector.stop()


def test_an_admin_adds_an_external_vault_and_switches_a_collector_to_it_from_the_list(
    shared_control_plane: ControlPlane, tmp_path: Path, browser: Browser
) -> None:
    cp = shared_control_plane
    collector_id = Collector(cp, tmp_path / "collector", tmp_path / "collector.log").enroll()
    base = f"https://localhost:{cp.env['VERSUS_CONSOLE_PORT']}"
    name = f"vault-{tmp_path.name[-6:]}"
    context = browser.new_context(ignore_https_errors=True, bypass_csp=True)
    try:
        page = context.new_page()
        sign_in(page, base, cp.admin_token)
        page.get_by_role("link", name="External Vaults").click()
        check_accessible(page, "external vaults")
        page.get_by_label("Name").fill(name)
        page.get_by_label("Address (https://…)").fill("https://vault.corp.example:8200")
        page.get_by_label("AppRole role id").fill("role-1234")
        page.get_by_role("button", name="Add integration").click()
        expect(page.get_by_role("status")).to_contain_text("created")
        page.screenshot(path=screenshot_dir(tmp_path) / "vaults.png", full_page=True)
        made = next(
            i for i in cli_json(["vault-integrations", "list"], cp.env)["integrations"] if i["name"] == name
        )
        expect(page.get_by_role("row").filter(has_text=name)).to_contain_text(made["integration_id"])

        # Mode C picks the integration from the list (no id to copy by hand).
        page.goto(f"{base}/collectors/{collector_id}")
        page.get_by_label("C — External Secret Manager").check()
        page.get_by_label("Integration (mode C)").select_option(
            label=f"{name} (https://vault.corp.example:8200)"
        )
        page.get_by_label("AppRole secret id or wrapping token (mode C, write-only)").fill("s.wrapped-token")
        page.get_by_role("button", name="Switch vault mode").click()
        expect(page.get_by_role("status")).to_contain_text("Vault mode changed")
        shown = cp.api.collector(collector_id)
        assert shown["vault_mode"] == "VAULT_MODE_EXTERNAL", shown
        assert made["integration_id"] in str(shown), shown
    finally:
        context.close()
