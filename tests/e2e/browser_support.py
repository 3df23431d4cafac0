"""What the console's browser tests share: Debian's Chromium (never Playwright's own download),
a browser context, the axe-core check, screenshots, signing in, and a hostile other site."""

from __future__ import annotations

import http.server
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from playwright.sync_api import Browser, BrowserContext, Page, expect, sync_playwright

CHROMIUM = "/usr/bin/chromium"
# What the machine's closed network needs (see ../.library/env): no background connections.
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]  # fmt: skip


def launched_browser() -> Iterator[Browser]:
    """Debian's Chromium, headless, for one module's tests."""
    if shutil.which(CHROMIUM) is None:
        raise RuntimeError("Chromium missing: run `make system-deps` (make test does)")
    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        yield launched
        launched.close()


AXE = Path(__file__).resolve().parents[2] / "tools" / "axe" / "node_modules" / "axe-core" / "axe.min.js"


def console_context(browser: Browser, **options: Any) -> BrowserContext:
    """A browser context for the console. The axe-core engine is injected as a script the
    console's CSP would (rightly) refuse, so contexts that run it bypass the CSP; the first test
    keeps it and fails on any CSP violation the pages themselves cause."""
    return browser.new_context(ignore_https_errors=True, viewport={"width": 1280, "height": 900}, **options)


def check_accessible(page: Page, name: str) -> None:
    """axe-core finds no serious or critical violation on the page (WCAG 2 A/AA rules and best practices)."""
    if not AXE.exists():
        raise RuntimeError("axe-core missing: run `make axe-deps` (make test does)")
    page.add_script_tag(path=str(AXE))
    result = page.evaluate("async () => await axe.run(document, {resultTypes: ['violations']})")
    bad = [
        (v["id"], v["impact"], [n["target"] for n in v["nodes"]][:3])
        for v in result["violations"]
        if v["impact"] in ("serious", "critical")
    ]
    assert bad == [], (name, bad)


def screenshot_dir(tmp_path: Path) -> Path:
    where = Path(os.environ.get("VERSUS_CONSOLE_SCREENSHOTS", tmp_path / "screenshots"))
    where.mkdir(parents=True, exist_ok=True)
    return where


def sign_in(page: Page, base: str, token: str) -> None:
    page.goto(f"{base}/signin")
    page.get_by_label("API token").fill(token)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("heading", name="Fleet overview")).to_be_visible()


class OtherSite:
    """A page on another origin (plain HTTP on its own port) whose form posts to the console as
    soon as it loads: what a malicious site would make a signed-in operator's browser do."""

    def __init__(self, action: str):
        page = (
            "<!doctype html><title>Win a prize</title>"
            f'<form id="f" method="post" action="{action}"><input name="csrf" value="guess"></form>'
            "<script>document.getElementById('f').submit()</script>"
        ).encode()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("content-type", "text/html")
                self.send_header("content-length", str(len(page)))
                self.end_headers()
                self.wfile.write(page)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
