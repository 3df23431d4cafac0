"""The console with a 10,000-collector fleet and 100,000 tasks: server time and browser load of the
Collectors page, the Tasks page and the fleet overview.

    python -m bench.console [--fleet 10000] [--tasks 100000] [--requests 30] [--loads 10] [--json FILE]

``--fleet`` collectors are inserted straight into PostgreSQL (as bench/idle.py does), a tenth
of them with a live session in Redis (a claim's heartbeat, as the router records it) so the
list shows a mix. The console runs under `versus-cp up` as in production (HTTPS, gRPC to the
router as the signed-in operator). Measured, against the 1 s budget issue 24 sets:

- **request**: the wall time of ``GET /collectors`` (50 rows, page 1), of a page deep in the
  fleet (``page=`` token of the 9,950th collector), and of the filters: ``session=active``
  (one collector in ten, judged on each row read), ``session=stale`` (none: every row is
  read, the worst case) and ``status=revoked`` (none, which the SQL alone answers) — from
  this process over loopback TLS, so it includes the TLS and HTTP work a browser waits for;
- **tasks**: ``--tasks`` tasks inserted straight into PostgreSQL over the last two days (most
  settled, some waiting, over 100 sites, each with a label): ``GET /tasks`` (page 1 of the last
  24 h, the default), a page deep in it, the waiting ones, one label, one site, any time;
- **overview**: ``GET /`` once the router has sampled the fleet (answered from its sample);
- **browser**: Debian's Chromium (headless, Playwright) loading each page, from navigation
  start to the load event (Navigation Timing ``loadEventEnd``), with the stylesheet and
  live-update script.

Budgets (issue 43): every page p95 under 500 ms server-side, every browser load under 1 s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import ssl
import statistics
import time
import urllib.parse
from typing import Any

import httpx

from bench.fleet import make_fleet
from bench.stack import Stack, pin_load_generator, running_stack, save_report

BUDGET_S = 1.0
SERVER_BUDGET_S = 0.5
# The tasks: most settled, some waiting (queued), a few cancelled, over the last two days.
_TASKS = """
INSERT INTO tasks (task_id, idempotency_key, request_sha256, provider, operation, op_class, target_ref,
                   site_id, tenant_id, params, deadline, requires_fips, labels, state, condition, created_at,
                   updated_at)
SELECT 'tsk-bench-' || lpad(n::text, 7, '0'), 'bench-' || n, '\\x00'::bytea, 'ssh', 'show', 'read',
       'dev-' || (n %% 5000), 'site-bench-' || (n %% 100), 'bench', '\\x7b7d'::bytea,
       now() + interval '1 day',
       false, jsonb_build_object('change', 'CHG-' || (n %% 1000)),
       CASE WHEN n %% 20 = 0 THEN 'queued' WHEN n %% 20 = 1 THEN 'failed' WHEN n %% 50 = 2 THEN 'cancelled'
            ELSE 'success' END,
       CASE WHEN n %% 20 = 0 THEN 'no_eligible_collector' END,
       now() - (n * interval '1.728 seconds'), now() - (n * interval '1.728 seconds') + interval '5 seconds'
FROM generate_series(1, %(count)s) AS n
"""
CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]


async def _live_sessions(stack: Stack, collector_ids: list[str]) -> None:
    """A heartbeat for these collectors, written as the router's claim path writes it."""
    import redis.asyncio as aioredis

    from router.core.live import Liveness

    client = aioredis.Redis.from_url(stack.redis.url)
    try:
        liveness = Liveness(client)
        now = time.time()
        for cid in collector_ids:
            await liveness.heartbeat(cid, f"s-{cid}", now, {"transport": "wss", "agent_version": "1.0.0"})
    finally:
        await client.aclose()


def _console_url(stack: Stack) -> str:
    return f"https://localhost:{stack.cp.env['VERSUS_CONSOLE_PORT']}"


def _sign_in(client: httpx.Client, stack: Stack) -> None:
    origin = {"Origin": _console_url(stack)}
    answer = client.post("/signin", data={"token": stack.cp.admin_token}, headers=origin)
    if answer.status_code != 303:
        raise RuntimeError(f"sign-in failed: {answer.status_code} {answer.text[:200]}")


def _timed(client: httpx.Client, path: str, params: dict[str, str], n: int) -> dict[str, Any]:
    times, rows = [], 0
    for _ in range(n):
        started = time.perf_counter()
        page = client.get(path, params=params)
        times.append(time.perf_counter() - started)
        if page.status_code != 200:
            raise RuntimeError(f"{path} {params}: {page.status_code}")
        rows = page.text.count('<td class="id"><a href="/')
    times.sort()
    p50, p95 = statistics.median(times), times[max(0, int(len(times) * 0.95) - 1)]
    return {
        "params": params, "rows": rows, "p50_ms": round(p50 * 1000, 1), "p95_ms": round(p95 * 1000, 1),
        "max_ms": round(times[-1] * 1000, 1), "budget_over_p95": round(SERVER_BUDGET_S / p95, 1),
    }  # fmt: skip


def _browser_loads(stack: Stack, loads: int) -> dict[str, Any]:
    from playwright.sync_api import sync_playwright

    base = _console_url(stack)
    out: dict[str, Any] = {}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        context = browser.new_context(ignore_https_errors=True)
        page = context.new_page()
        page.goto(f"{base}/signin")
        page.get_by_label("API token").fill(stack.cp.admin_token)
        page.get_by_role("button", name="Sign in").click()
        page.wait_for_url(f"{base}/")
        for path in ("/", "/collectors", "/tasks"):
            times = []
            for _ in range(loads):
                page.goto(f"{base}{path}", wait_until="load")
                load_end = page.evaluate("performance.getEntriesByType('navigation')[0].loadEventEnd")
                times.append(float(load_end) / 1000)
            times.sort()
            out[path] = {
                "loads": loads, "p50_ms": round(statistics.median(times) * 1000, 1),
                "max_ms": round(times[-1] * 1000, 1), "budget_over_max": round(BUDGET_S / times[-1], 1),
            }  # fmt: skip
        browser.close()
    return out


def _insert_tasks(database_url: str, count: int) -> None:
    import psycopg

    with psycopg.connect(database_url) as conn:
        conn.execute(_TASKS, {"count": count})
        conn.execute("ANALYZE tasks")


def _sampled(client: httpx.Client, timeout_s: float = 60) -> None:
    """Until the router has sampled the fleet (the overview answers from its sample)."""
    deadline = time.monotonic() + timeout_s
    while "has not sampled the fleet yet" in client.get("/").text:
        if time.monotonic() > deadline:
            raise RuntimeError("the router never sampled the fleet")
        time.sleep(1)


def run(fleet_size: int, task_count: int, requests: int, loads: int) -> dict[str, Any]:
    with running_stack() as stack:
        fleet = asyncio.run(
            make_fleet(stack.database_url, stack.gateway_url, stack.ssl_context(), fleet_size, "console")
        )
        ids = sorted(c.collector_id for c in fleet)
        asyncio.run(_live_sessions(stack, ids[::10]))
        _insert_tasks(stack.database_url, task_count)
        context = ssl.create_default_context(cafile=str(stack.cp.ca_file))
        with httpx.Client(base_url=_console_url(stack), verify=context, timeout=60) as client:
            _sign_in(client, stack)
            client.get("/collectors")  # warm: connections to the router, templates compiled
            client.get("/tasks")
            _sampled(client)
            deep = ids[-51] if len(ids) > 51 else ""
            # A page of tasks deep in the last day: the keyset token of the 20,000th newest.
            deep_task = ""
            for _ in range(40):
                found = re.search(
                    r'href="/tasks\?[^"]*page=([^"&]+)', client.get("/tasks", params={"page": deep_task}).text
                )
                deep_task = urllib.parse.unquote(found.group(1).replace("&amp;", "&")) if found else ""
            results = {
                "fleet": fleet_size,
                "tasks": task_count,
                "first_page": _timed(client, "/collectors", {}, requests),
                "deep_page": _timed(client, "/collectors", {"page": deep}, requests),
                "filter_session_active": _timed(client, "/collectors", {"session": "active"}, requests),
                "filter_status_revoked_none": _timed(client, "/collectors", {"status": "revoked"}, 5),
                # The worst case: no collector matches a filter judged on the views (Redis).
                "filter_session_stale_none": _timed(client, "/collectors", {"session": "stale"}, 5),
                "tasks_first_page": _timed(client, "/tasks", {}, requests),
                "tasks_deep_page": _timed(client, "/tasks", {"page": deep_task}, requests),
                "tasks_waiting": _timed(client, "/tasks", {"state": "waiting"}, requests),
                "tasks_label": _timed(client, "/tasks", {"label": "change=CHG-7", "since": "all"}, requests),
                "tasks_site": _timed(client, "/tasks", {"site": "site-bench-42"}, requests),
                "tasks_any_time": _timed(client, "/tasks", {"since": "all"}, requests),
                "overview": _timed(client, "/", {}, requests),
            }
        results["browser"] = _browser_loads(stack, loads)
        return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fleet", type=int, default=10_000)
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--loads", type=int, default=10)
    parser.add_argument("--json", default="bench/results/console.json")
    args = parser.parse_args()
    pinning = pin_load_generator()
    results = run(args.fleet, args.tasks, args.requests, args.loads)
    print(json.dumps(results, indent=2))
    save_report(args.json, pinning, args, results)


if __name__ == "__main__":
    main()
