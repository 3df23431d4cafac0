"""Envelopes altered on the way, or addressed to someone else, are refused by the collector and reported."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from common.envelope.sign import EnvelopeDraft, sign
from common.trust.keys import KeyPurpose
from common.trust.keystore import KeyStore
from tests.e2e.collector_harness import Collector, Platform
from tests.e2e.harness import ControlPlane
from tests.support.proxy import Rewrite, TamperingProxy

pytestmark = pytest.mark.timeout(180)


def _alter_target(envelope: bytes) -> bytes:
    obj = json.loads(envelope)
    obj["target_ref"] = "core-router-1"
    return json.dumps(obj).encode()


def _run_through(cp: ControlPlane, tmp_path: Path, rewrite: Rewrite) -> tuple[Collector, str]:
    """Run one echo task through the proxy; returns the collector and the reason the task ended."""
    collector = Collector(cp, tmp_path / "collector", tmp_path / "collector.log")
    collector.enroll()
    proxy = TamperingProxy(tmp_path / "proxy", cp.state_dir / "tls", cp.gateway_url, rewrite)
    collector.use_gateway(proxy.url)
    platform = Platform(cp)
    collector.start()
    try:
        # Its own idempotency key: the module's tests share a control plane (and the tenant).
        key = f"tamper-{tmp_path.name}"
        task_id = platform.submit(collector.site_id, "echo", "read", "dev-1", {"x": 1}, key)
        task = platform.wait_state(task_id, {"failed", "success"})
        assert proxy.rewritten >= 1
        return collector, task.history[-1].reason
    finally:
        collector.stop()
        platform.close()
        proxy.close()


def test_altered_envelope_is_refused_and_reported(shared_control_plane: ControlPlane, tmp_path: Path) -> None:
    cp = shared_control_plane
    collector, reason = _run_through(cp, tmp_path, _alter_target)
    assert reason == "envelope_refused:bad_signature"  # the platform sees why
    assert "envelope refused" in collector.log()
    # The proxy passes HTTPS but not WebSockets: the collector fell back to per-call HTTPS.
    assert "control socket unavailable; using per-call HTTPS" in collector.log()


def test_envelope_for_another_collector_is_refused_as_an_attack(
    shared_control_plane: ControlPlane, tmp_path: Path
) -> None:
    cp = shared_control_plane
    key = KeyStore(cp.state_dir, KeyPurpose.DISPATCH).load().current

    def readdress(envelope: bytes) -> bytes:
        obj = json.loads(envelope)
        now = int(time.time())
        draft = EnvelopeDraft(
            obj["task_id"],
            "col-someone-else",
            obj["provider"],
            obj["operation"],
            obj["op_class"],
            obj["target_ref"],
            obj["idempotency_key"],
            b'{"x":1}',
            now - 5,
            now + 60,
        )
        return sign(draft, key)

    collector, reason = _run_through(cp, tmp_path, readdress)
    assert reason == "envelope_refused:wrong_collector"
    assert "possible attack" in collector.log()
