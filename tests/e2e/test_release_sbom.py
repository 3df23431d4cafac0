"""A collector release is built from the collector lock and carries an SBOM that says exactly what
is inside; the SBOM is published and signed with it, and shown by `versus-cp releases` (issue 26)."""

from __future__ import annotations

import json
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from cyclonedx.schema import SchemaVersion
from cyclonedx.validation.json import JsonStrictValidator
from packaging.markers import Marker
from packaging.utils import canonicalize_name, parse_wheel_filename
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import expect
from tuf.api.metadata import Metadata, Root, Targets

from common.config.state_dir import file_sha256
from tests.e2e.browser_support import check_accessible, launched_browser, screenshot_dir, sign_in
from tests.e2e.collector_harness import Collector, Platform, cli_json
from tests.e2e.harness import ControlPlane, control_plane_for, run_cli
from tests.e2e.upgrade_harness import ARCH, OS
from tools.collector_dist import LOCK, build_release
from tools.locks import parse_lock

pytestmark = pytest.mark.timeout(600)

VERSION = "0.1.7"


def _locked_here() -> dict[str, tuple[str, set[str]]]:
    """The collector lock's pins that apply to this platform: name -> (version, allowed hashes)."""
    return {
        p.name: (p.version, {h.removeprefix("sha256:") for h in p.hashes})
        for p in parse_lock(LOCK.read_text())
        if not p.marker or Marker(p.marker).evaluate()
    }


@pytest.fixture(scope="module")
def release_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """One control plane for this module's two tests (each publishes a version of its own): releases
    are fleet-wide, so not the shared one."""
    yield from control_plane_for(tmp_path_factory, "release-sbom")


def test_a_release_holds_the_lock_and_its_signed_sbom_says_so(
    release_plane: ControlPlane, tmp_path: Path
) -> None:
    _, pex, sbom_path = build_release(tmp_path / "dist", VERSION)
    locked = _locked_here()

    # The PEX file packs exactly the locked wheels (and the collector's own).
    with zipfile.ZipFile(pex) as archive:
        packed = json.loads(archive.read("PEX-INFO"))["distributions"]
    in_pex = {canonicalize_name(parse_wheel_filename(n)[0]): str(parse_wheel_filename(n)[1]) for n in packed}
    assert in_pex == {"versus-collector": VERSION, **{name: v for name, (v, _) in locked.items()}}

    # The SBOM is valid CycloneDX, describes this release, and lists exactly the locked packages,
    # each with the SHA-256 of a file the lock allows for that version.
    text = sbom_path.read_text()
    assert JsonStrictValidator(SchemaVersion.V1_6).validate_str(text) is None
    document = json.loads(text)
    root = document["metadata"]["component"]
    assert (root["name"], root["version"], root["type"]) == ("versus-collector", VERSION, "application")
    listed = {canonicalize_name(c["name"]): c for c in document["components"]}
    assert {n: c["version"] for n, c in listed.items()} == {n: v for n, (v, _) in locked.items()}
    for name, component in listed.items():
        assert component["purl"] == f"pkg:pypi/{name}@{component['version']}"
        [digest] = [h["content"] for h in component["hashes"] if h["alg"] == "SHA-256"]
        assert digest in locked[name][1], name
        assert component.get("licenses"), f"{name} has no licence in the SBOM"

    cp = release_plane
    # Published with the release: `publish` finds the SBOM beside the artifact.
    done = run_cli(
        ["releases", "publish", "--version", VERSION, "--channel", "stable", "--artifact", str(pex),
         "--os", OS, "--arch", ARCH, "--json"],
        cp.env, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    [shown] = cli_json(["releases", "show", VERSION], cp.env)["releases"]
    assert shown["sbom_sha256"] == file_sha256(sbom_path)
    assert (shown["sbom_spec_version"], int(shown["sbom_components"])) == ("1.6", len(locked))
    assert shown["sbom_target_name"] == pex.name.removesuffix(".pex") + ".cdx.json"
    assert shown["sbom"] == ""  # the document only when asked for
    human = run_cli(["releases", "show", VERSION], cp.env)
    assert f"CycloneDX 1.6, {len(locked)} components" in human.stdout, human.stdout
    fetched = tmp_path / "fetched.cdx.json"
    assert run_cli(["releases", "show", VERSION, "--sbom-out", str(fetched)], cp.env).returncode == 0
    assert fetched.read_bytes() == sbom_path.read_bytes()

    # Signed with it: the update repository's targets metadata, verified against its root (held
    # by the release keys), lists the SBOM, and the artifact's entry names the SBOM's hash.
    metadata = cp.state_dir / "updates" / "metadata"
    trusted: Metadata[Root] = Metadata.from_file(str(metadata / "1.root.json"))
    release_kids = {k["kid"] for k in cli_json(["keys", "list", "--set", "release"], cp.env)["release"]}
    assert set(trusted.signed.roles["targets"].keyids) == release_kids
    newest = max(metadata.glob("*.targets.json"), key=lambda p: int(p.name.split(".")[0]))
    targets: Metadata[Targets] = Metadata.from_file(str(newest))
    trusted.verify_delegate("targets", targets)
    sbom_target = targets.signed.targets[shown["sbom_target_name"]]
    assert sbom_target.hashes["sha256"] == shown["sbom_sha256"] and sbom_target.length == len(text.encode())
    artifact_custom = targets.signed.targets[shown["target_name"]].unrecognized_fields["custom"]
    assert artifact_custom["sbom"] == {"target": shown["sbom_target_name"], "sha256": shown["sbom_sha256"]}

    _downloaded_from_client_tools_it_enrolls_and_works(cp, pex, release_kids, tmp_path)

    # Yanked, the SBOM leaves the signed targets with the artifact; the record keeps it.
    assert run_cli(["releases", "yank", VERSION, "--reason", "test"], cp.env).returncode == 0
    newest = max(metadata.glob("*.targets.json"), key=lambda p: int(p.name.split(".")[0]))
    remaining: Metadata[Targets] = Metadata.from_file(str(newest))
    assert not {shown["sbom_target_name"], shown["target_name"]} & set(remaining.signed.targets)
    assert (
        cli_json(["releases", "show", VERSION], cp.env)["releases"][0]["sbom_sha256"] == shown["sbom_sha256"]
    )


def test_publishing_without_an_sbom_is_explicit(release_plane: ControlPlane, tmp_path: Path) -> None:
    artifact = tmp_path / "versus-collector-0.1.8-linux-x86_64.pex"
    artifact.write_bytes(b"#!/usr/bin/env python3\n" * 64)
    cp = release_plane
    base = ["releases", "publish", "--version", "0.1.8", "--channel", "stable", "--artifact", str(artifact),
            "--os", "linux", "--arch", "x86_64"]  # fmt: skip
    missing = run_cli(base, cp.env)
    assert missing.returncode != 0 and "sbom_missing" in missing.stderr, missing.stderr
    # An SBOM of another release is refused by the router before anything is signed.
    other = tmp_path / "other.cdx.json"
    other.write_text(json.dumps({
        "bomFormat": "CycloneDX", "specVersion": "1.6", "version": 1,
        "metadata": {"component": {"type": "application", "name": "versus-collector", "version": "0.0.1"}},
    }))  # fmt: skip
    refused = run_cli([*base, "--sbom", str(other)], cp.env)
    assert refused.returncode != 0 and "sbom_component_mismatch" in refused.stderr, refused.stderr
    listed = cli_json(["releases", "list", "--all"], cp.env).get("releases", [])
    assert "0.1.8" not in {r["version"] for r in listed}
    assert run_cli([*base, "--no-sbom"], cp.env).returncode == 0
    [shown] = cli_json(["releases", "show", "0.1.8"], cp.env)["releases"]
    assert (shown["sbom_sha256"], shown["sbom_target_name"]) == ("", "")
    assert "none (published without one)" in run_cli(["releases", "show", "0.1.8"], cp.env).stdout


def _fetched_again(url: str, cookies: list[Any]) -> str:
    jar = {c["name"]: c["value"] for c in cookies}
    try:
        with httpx.Client(verify=False, cookies=jar, timeout=60) as client:  # noqa: S501 - the test CA
            got = client.get(url)
        declared = got.headers.get("content-length")
        return f"HTTP {got.status_code}, {len(got.content)} bytes, content-length {declared}"
    except httpx.HTTPError as exc:
        return f"failed too: {exc!r}"


def _downloaded_from_client_tools_it_enrolls_and_works(
    cp: ControlPlane, pex: Path, release_kids: set[str], tmp_path: Path
) -> None:
    """The console's Client Tools offers the release for this platform as the latest, with the
    supervisor's values; the file a browser downloads is the published one, and it enrolls a
    collector that takes work (an install by hand, as on a host without the update repository)."""
    base = f"https://localhost:{cp.env['VERSUS_CONSOLE_PORT']}"
    downloaded = tmp_path / "downloaded" / pex.name
    for browser in launched_browser():
        context = browser.new_context(ignore_https_errors=True, accept_downloads=True, bypass_csp=True)
        try:
            page = context.new_page()
            sign_in(page, base, cp.admin_token)
            page.get_by_role("link", name="Client Tools").click()
            row = page.get_by_role("row").filter(has_text=f"{OS}/{ARCH}").filter(has_text=VERSION)
            expect(row).to_contain_text("latest")
            check_accessible(page, "client tools")
            page.screenshot(path=screenshot_dir(tmp_path) / "client-tools.png", full_page=True)
            assert page.locator("#manifest-url").inner_text().endswith("/api/collector/v1/updates/metadata/")
            assert page.locator("#update-pubkey").inner_text() in release_kids
            mark = cp.log_mark()
            with page.expect_download() as got:
                row.get_by_role("link", name=pex.name).click()
            try:
                got.value.save_as(downloaded)
            except PlaywrightError as exc:
                # Seen once in a loaded make test run ("canceled"): say whether the server sends
                # the whole file again, and what the services logged meanwhile.
                again = _fetched_again(got.value.url, context.cookies())
                raise AssertionError(
                    f"the browser's download failed: {exc} (failure: {got.value.failure()}); the same "
                    f"URL fetched again: {again}; logged since the click:\n{cp.log_since(mark)[-4000:]}"
                ) from exc
        finally:
            context.close()
    assert file_sha256(downloaded) == file_sha256(pex)
    collector = Collector(
        cp, tmp_path / "by-hand", tmp_path / "by-hand.log", command=("python3", str(downloaded))
    )
    collector.enroll()
    collector.start()
    platform = Platform(cp)
    try:
        task_id = platform.submit(collector.site_id, "echo", "read", "dev-t", {"by": "hand"}, "tools-1")
        assert platform.wait_state(task_id, {"success", "failed", "expired"}, timeout=120).error_code == ""
    finally:
        platform.close()
        collector.stop()
