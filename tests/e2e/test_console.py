"""The operator console against a real `versus-cp up` and a real collector, over HTTPS: sign-in
and its cookie, the Collectors page and a collector's detail, actions authorised by the services'
own RBAC, CSRF and cross-site refusals, sign-out. Pages are plain HTML forms, so reading and acting
work without JavaScript (this test's client runs none). Browser tests: test_console_browser.py.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import ssl
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.collector_harness import Collector, cli_json, wait_for
from tests.e2e.harness import ControlPlane, control_plane_for

pytestmark = pytest.mark.timeout(240)
COOKIE = "__Host-versus-console"


@pytest.fixture(scope="module")
def console_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """The module's control plane: its pages list the fleet, so only this module's collectors."""
    yield from control_plane_for(tmp_path_factory, "console-control-plane")


@pytest.fixture
def fleet(console_plane: ControlPlane, tmp_path: Path) -> Iterator[tuple[ControlPlane, str]]:
    """A live collector of its own, on the module's control plane."""
    yield from _fleet(console_plane, tmp_path)


@pytest.fixture
def fleet_alone(
    start_control_plane: Callable[..., ControlPlane], tmp_path: Path
) -> Iterator[tuple[ControlPlane, str]]:
    """A live collector on a control plane of its own (the test counts the whole fleet)."""
    yield from _fleet(start_control_plane(), tmp_path)


def _fleet(cp: ControlPlane, tmp_path: Path) -> Iterator[tuple[ControlPlane, str]]:
    collector = Collector(cp, tmp_path / "collector", tmp_path / "collector.log")
    collector_id = collector.enroll()
    collector.start()
    try:
        wait_for(lambda: cp.api.collector(collector_id).get(
            "session_state") == "SESSION_STATE_ACTIVE", timeout=60)  # fmt: skip
        yield cp, collector_id
    finally:
        collector.stop()


def _console(cp: ControlPlane) -> httpx.Client:
    port = cp.env["VERSUS_CONSOLE_PORT"]
    context = ssl.create_default_context(cafile=str(cp.ca_file))
    return httpx.Client(base_url=f"https://localhost:{port}", verify=context, timeout=15)


def _origin(cp: ControlPlane) -> dict[str, str]:
    return {"Origin": f"https://localhost:{cp.env['VERSUS_CONSOLE_PORT']}"}


def _sign_in(client: httpx.Client, cp: ControlPlane, token: str) -> str:
    """Sign in; the session's CSRF token (from the next page's forms)."""
    answer = client.post("/signin", data={"token": token}, headers=_origin(cp))
    assert answer.status_code == 303, answer.text
    page = client.get("/collectors")
    assert page.status_code == 200
    found = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert found is not None
    return found.group(1)


def test_an_operator_signs_in_finds_a_collector_and_drains_it(fleet: tuple[ControlPlane, str]) -> None:
    cp, collector_id = fleet
    shown = cp.api.collector(collector_id)
    with _console(cp) as client:
        assert client.get("/collectors").headers["location"] == "/signin"  # not signed in
        refused = client.post("/signin", data={"token": "vsk_not-a-token"}, headers=_origin(cp))
        assert refused.status_code == 401 and "not valid" in refused.text
        answer = client.post("/signin", data={"token": cp.admin_token}, headers=_origin(cp))
        cookie = answer.headers["set-cookie"]
        assert cookie.startswith(COOKIE + "=")
        for flag in ("HttpOnly", "Secure", "SameSite=strict", "Path=/"):
            assert flag.lower() in cookie.lower(), cookie
        assert cp.admin_token not in cookie  # the cookie is an opaque session reference
        page = client.get("/collectors", params={"q": shown["hostname"]})
        assert page.status_code == 200 and collector_id in page.text
        csp = page.headers["content-security-policy"]
        assert (
            "default-src 'none'" in csp and "frame-ancestors 'none'" in csp and "'unsafe-inline'" not in csp
        )
        assert client.get("/collectors", params={"q": "no-such-host"}).text.count("/collectors/col") == 0
        # The filters: each narrows the list the services answer (the form sends them all).
        version, driver = shown["update"]["running_version"], shown["drivers"][0]["provider"]
        for params, listed in (
            ({"status": "active", "session": "active", "version": version, "driver": driver}, True),
            ({"session": "dead"}, False),
            ({"status": "revoked"}, False),
            ({"version": "0.0.0-nope"}, False),
            ({"driver": "no-such-driver"}, False),
        ):
            page = client.get("/collectors", params={"q": "", "site": "", **params})
            assert page.status_code == 200 and (f"/collectors/{collector_id}" in page.text) is listed, params

        detail = client.get(f"/collectors/{collector_id}")
        for card in ("Identity", "Live Session", "Driver Capabilities", "Agent Version", "Credential Vault"):
            assert f">{card}<" in detail.text
        csrf = re.search(r'name="csrf" value="([^"]+)"', detail.text)
        assert csrf is not None
        confirm = client.get(f"/collectors/{collector_id}/confirm/drain")
        assert "No new work will be routed" in confirm.text

        # A forged cross-site POST (the browser sends the session cookie, not the CSRF token,
        # and says where it came from) changes nothing.
        evil = {"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"}
        forged = client.post(f"/collectors/{collector_id}/drain", data={"csrf": "guess"}, headers=evil)
        assert forged.status_code == 403 and "cross_site_request" in forged.text
        no_token = client.post(f"/collectors/{collector_id}/drain", data={}, headers=_origin(cp))
        assert no_token.status_code == 403 and "csrf_invalid" in no_token.text
        assert not cp.api.collector(collector_id).get("drained")

        drained = client.post(
            f"/collectors/{collector_id}/drain", data={"csrf": csrf.group(1)}, headers=_origin(cp)
        )
        assert drained.status_code == 303
        assert "Drained:" in client.get(drained.headers["location"]).text
        assert cp.api.collector(collector_id)["drained"] is True
        probe = client.post(
            f"/collectors/{collector_id}/probe", data={"csrf": csrf.group(1)}, headers=_origin(cp)
        )
        assert probe.status_code == 200 and "Probe: reachable" in probe.text

        # The audit log names the operator behind the console's call.
        events = cli_json(["audit", "list", "--subject", collector_id], cp.env)["events"]
        assert any(e["action"] == "collector.drain" and "admin" in e["actor"] for e in events), events
        later = (dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)).isoformat()
        assert (
            cli_json(["audit", "list", "--subject", collector_id, "--since", later], cp.env).get("events", [])
            == []
        )
        assert (
            cli_json(["audit", "list", "--subject", collector_id, "--until", later], cp.env)["events"]
            == events
        )
        audit = client.get("/audit", params={"subject": collector_id, "action": "collector.drain"})
        assert audit.status_code == 200 and "collector.drain" in audit.text
        assert "bootstrap-admin" in audit.text
        assert f'<a href="/collectors/{collector_id}">{collector_id}</a>' in audit.text  # the subject, linked
        today = dt.datetime.now(dt.UTC).date()
        for day, listed in ((today, True), (today + dt.timedelta(days=1), False)):
            ranged = client.get(
                "/audit", params={"subject": collector_id, "start": str(day), "end": str(day)}
            )
            assert ranged.status_code == 200 and ("collector.drain" in ranged.text) is listed, day
        exported = client.get("/audit", params={"subject": collector_id, "format": "csv"})
        assert exported.headers["content-disposition"].startswith('attachment; filename="audit-')
        assert exported.text.startswith("at,actor,action,subject_type,subject_id,details")
        assert "collector.drain" in exported.text
        backwards = client.get(
            "/audit", params={"start": str(today), "end": str(today - dt.timedelta(days=2))}
        )
        assert backwards.status_code == 400 and "time_range_invalid" in backwards.text

        # Bad input on the newer pages: a clear code, a way back, nothing changed.
        for path, params, status, code in (
            ("/bulk/confirm", {"action": "drain"}, 400, "selection_empty"),
            ("/bulk/confirm", {"action": "explode", "id": collector_id}, 400, "action_invalid"),
            ("/tasks", {"state": "sideways"}, 400, "state_invalid"),
            ("/tasks", {"format": "xml"}, 400, "format_invalid"),
            ("/tasks", {"start": "2026-12-09", "end": "2026-12-01"}, 400, "time_range_invalid"),
            ("/tasks/tsk-no-such", {}, 404, "task_not_found"),
        ):
            answer = client.get(path, params=params)
            assert (answer.status_code, code in answer.text) == (status, True), (path, answer.text[:300])
        assert "Back to the tasks" in client.get("/tasks/tsk-no-such").text
        unconfirmed = client.post(
            "/tokens/tok-none/revoke", data={"csrf": csrf.group(1), "site_id": "s"}, headers=_origin(cp)
        )
        assert unconfirmed.status_code == 400 and "confirmation_required" in unconfirmed.text
        assert cp.api.collector(collector_id)["drained"] is True  # still as the drain above left it
        out = client.post("/signout", data={"csrf": csrf.group(1)}, headers=_origin(cp))
        assert out.status_code == 303
        client.cookies.set(COOKIE, cookie.split(";", 1)[0].split("=", 1)[1])
        assert client.get("/collectors").headers["location"] == "/signin"  # the session is gone


def test_a_viewer_sees_no_action_and_the_services_refuse_one_anyway(fleet: tuple[ControlPlane, str]) -> None:
    cp, collector_id = fleet
    viewer = cp.mint_token("viewer", "e2e-viewer")
    with _console(cp) as client:
        csrf = _sign_in(client, cp, viewer)
        detail = client.get(f"/collectors/{collector_id}").text
        assert "Probe" in detail  # viewers may probe
        for action in ("confirm/drain", "confirm/revoke"):
            assert f"/{action}" not in detail
        # Posting anyway: the router's RBAC refuses it, whatever the console showed.
        refused = client.post(f"/collectors/{collector_id}/drain", data={"csrf": csrf}, headers=_origin(cp))
        assert refused.status_code == 403 and "permission_denied" in refused.text
    assert not cp.api.collector(collector_id).get("drained")
    platform = cp.mint_token("platform", "e2e-platform")
    with _console(cp) as client:
        answer = client.post("/signin", data={"token": platform}, headers=_origin(cp))
        assert answer.status_code == 403 and "operator" in answer.text


def test_an_operator_approves_denies_and_switches_a_vault_mode(
    fleet: tuple[ControlPlane, str], tmp_path: Path
) -> None:
    cp, collector_id = fleet
    site_id = cp.api.create_site("site-approvals")["site"]["site_id"]
    waiting = []
    for name in ("one", "two"):
        issued = cp.api.issue_token(site_id, manual_approval=True)
        waiting.append(Collector(cp, tmp_path / name, tmp_path / f"{name}.log").enroll(site_id, issued))
    approved, denied = waiting

    def status(cid: str) -> str:
        return str(cp.api.collector(cid)["status"])

    with _console(cp) as client:
        csrf = _sign_in(client, cp, cp.admin_token)
        listed = client.get("/collectors", params={"status": "pending"}).text
        assert f"/collectors/{approved}" in listed and f"/collectors/{collector_id}" not in listed
        detail = client.get(f"/collectors/{approved}").text
        assert f"/collectors/{approved}/confirm/approve" in detail and "confirm/drain" not in detail
        confirm = client.get(f"/collectors/{denied}/confirm/deny").text
        assert "cannot be approved later" in confirm  # the consequence, named before the commit
        for cid, action in ((approved, "approve"), (denied, "deny")):
            done = client.post(
                f"/collectors/{cid}/{action}", data={"csrf": csrf, "reason": "not ours"}, headers=_origin(cp)
            )
            assert done.status_code == 303, done.text
        assert (status(approved), status(denied)) == ("COLLECTOR_STATUS_ACTIVE", "COLLECTOR_STATUS_DENIED")
        again = client.post(f"/collectors/{denied}/approve", data={"csrf": csrf}, headers=_origin(cp))
        assert again.status_code == 412  # FAILED_PRECONDITION from the service, by the one table
        assert status(denied) == "COLLECTOR_STATUS_DENIED"

        assert 'value="local" checked' in client.get(f"/collectors/{collector_id}").text
        switched = client.post(
            f"/collectors/{collector_id}/vault",
            data={"csrf": csrf, "mode": "cloud_relayed"},
            headers=_origin(cp),
        )
        assert switched.status_code == 303, switched.text
        shown = cp.api.collector(collector_id)
        assert shown["vault_mode"] == "VAULT_MODE_CLOUD_RELAYED"
        bad = client.post(
            f"/collectors/{collector_id}/vault", data={"csrf": csrf, "mode": "nope"}, headers=_origin(cp)
        )
        assert bad.status_code == 400 and "vault_mode_invalid" in bad.text
        forged = client.post(f"/collectors/{collector_id}/vault", data={"csrf": "x", "mode": "local"},
                             headers=_origin(cp))  # fmt: skip
        assert forged.status_code == 403
        assert cp.api.collector(collector_id)["vault_mode"] == ("VAULT_MODE_CLOUD_RELAYED")


def test_a_live_page_hears_of_a_change_and_only_a_signed_in_one(fleet: tuple[ControlPlane, str]) -> None:
    cp, collector_id = fleet
    with _console(cp) as client:
        assert client.get("/live", params={"path": "/collectors"}).status_code == 401
        _sign_in(client, cp, cp.admin_token)
        not_live = client.get("/live", params={"path": "/audit"})
        assert not_live.status_code == 404 and "not_live" in not_live.text
        with client.stream("GET", "/live", params={"path": f"/collectors/{collector_id}"}) as events:
            assert events.headers["content-type"].startswith("text/event-stream")
            lines = events.iter_lines()
            assert next(lines) == "retry: 3000"
            cli_json(["collectors", "drain", collector_id], cp.env)  # another operator, elsewhere
            seen = []
            for line in lines:  # the next event: a keepalive comes only after 15 s without one
                seen.append(line)
                if line.startswith("event:"):
                    break
            assert seen[-1] == "event: changed", seen
            signed_out = client.post("/signout", data={"csrf": _csrf(client)}, headers=_origin(cp))
            assert signed_out.status_code == 303
            ended = [line for line in lines if line.startswith("event:")]  # the stream then closes
            assert ended == ["event: signedout"]


def _csrf(client: httpx.Client) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', client.get("/collectors").text)
    assert found is not None
    return found.group(1)


def test_an_admin_publishes_and_yanks_a_release_and_sees_who_is_behind(
    fleet_alone: tuple[ControlPlane, str], tmp_path: Path
) -> None:
    cp, _ = fleet_alone
    idle = Collector(cp, tmp_path / "idle", tmp_path / "idle.log").enroll()  # enrolled, never started
    artifact = b"#!/usr/bin/env python3\n# not a real collector: the router signs any bytes it is sent\n" * 50
    with _console(cp) as client:
        csrf = _sign_in(client, cp, cp.admin_token)
        form = {"csrf": csrf, "version": "9.9.1", "channel": "stable", "os": "linux", "arch": "x86_64"}
        upload = {"artifact": ("collector.pex", artifact, "application/octet-stream")}
        forged = client.post(
            "/releases/publish", data={**form, "csrf": "x"}, files=upload, headers=_origin(cp)
        )
        assert forged.status_code == 403 and "csrf_invalid" in forged.text
        missing = client.post(
            "/releases/publish", data=form, headers=_origin(cp), files={"x": ("", b"", "a/b")}
        )
        assert missing.status_code == 400 and "artifact_missing" in missing.text
        bad = client.post(
            "/releases/publish", data={**form, "version": "not a version"}, files=upload, headers=_origin(cp)
        )
        # The router's own check, shown with its code (the services' log says why if not).
        assert bad.status_code == 400, (
            bad.text
            + "\n"
            + "\n".join(line for line in cp.log().splitlines() if "console" in line or "Traceback" in line)
        )
        assert cli_json(["releases", "list"], cp.env)["releases"] == []
        # Without an SBOM only when asked to; an SBOM of another version is the router's refusal.
        unsigned = client.post("/releases/publish", data=form, files=upload, headers=_origin(cp))
        assert unsigned.status_code == 400 and "sbom_missing" in unsigned.text
        sbom: dict[str, Any] = {
            "bomFormat": "CycloneDX", "specVersion": "1.6", "version": 1,
            "metadata": {"component": {"type": "application", "name": "versus-collector",
                                       "version": "9.9.0"}},
            "components": [{"type": "library", "name": "tuf", "version": "7.0.1",
                            "purl": "pkg:pypi/tuf@7.0.1"}],
        }  # fmt: skip
        with_sbom = {**upload, "sbom": ("sbom.cdx.json", json.dumps(sbom).encode(), "application/json")}
        other = client.post("/releases/publish", data=form, files=with_sbom, headers=_origin(cp))
        assert other.status_code == 400 and "sbom_component_mismatch" in other.text
        sbom["metadata"]["component"]["version"] = "9.9.1"
        with_sbom["sbom"] = ("sbom.cdx.json", json.dumps(sbom).encode(), "application/json")

        published = client.post("/releases/publish", data=form, files=with_sbom, headers=_origin(cp))
        assert published.status_code == 303, published.text
        [release] = cli_json(["releases", "list"], cp.env)["releases"]
        assert (release["version"], release["length"]) == ("9.9.1", str(len(artifact)))
        page = client.get("/releases").text
        assert "9.9.1" in page and "/releases/9.9.1/confirm/yank" in page
        assert "<td>CycloneDX 1.6, 1 component</td>" in page
        # Both collectors run an older version: they are behind, and listed as such.
        assert re.search(r"<strong>2</strong> active collectors behind", page), page
        behind = client.get("/collectors", params={"outdated": "1"}).text
        assert behind.count('<td class="id"><a href="/collectors/') == 2

        # Its site's policy is manual: the operator applies the update, then thinks better of it.
        assert f"/collectors/{idle}/confirm/apply_update" in client.get(f"/collectors/{idle}").text
        applied = client.post(f"/collectors/{idle}/apply_update", data={"csrf": csrf}, headers=_origin(cp))
        assert applied.status_code == 303, applied.text
        shown = cp.api.collector(idle)["update"]
        assert shown["approved_version"] == "9.9.1"
        detail = client.get(f"/collectors/{idle}").text
        assert f"/collectors/{idle}/confirm/cancel_update" in detail and "confirm/apply_update" not in detail
        cancelled = client.post(f"/collectors/{idle}/cancel_update", data={"csrf": csrf}, headers=_origin(cp))
        assert cancelled.status_code == 303, cancelled.text
        assert cp.api.collector(idle)["update"]["approved_version"] == ""

        yanked = client.post(
            "/releases/9.9.1/yank", data={"csrf": csrf, "reason": "bad build"}, headers=_origin(cp)
        )
        assert yanked.status_code == 303, yanked.text
        [release] = cli_json(["releases", "list", "--all"], cp.env)["releases"]
        assert release["yanked"] is True and release["yank_reason"] == "bad build"
        assert "yanked" in client.get("/releases").text
