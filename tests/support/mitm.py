"""A real TLS-inspecting proxy for tests: mitmproxy in reverse mode, attacking as mitm_addon.py says.

mitmproxy pins its own dependencies, so it lives in its own virtual environment
(``.venv-mitm``, created by ``make mitm-deps``, which ``make test`` runs). The
collector trusts the proxy as a corporate one is trusted: its CA is the
collector's ``extra-ca.pem``, and the collector's gateway URL points at it.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from common.embedded.process import free_port
from tests.support.squid import kill_group

ROOT = Path(__file__).resolve().parents[2]
MITMDUMP = ROOT / ".venv-mitm" / "bin" / "mitmdump"
ADDON = Path(__file__).with_name("mitm_addon.py")


class InterceptingProxy:
    """``with InterceptingProxy(dir, gateway_port, gateway_ca) as mitm:`` — mitmdump on ``mitm.url``."""

    def __init__(self, root: Path, upstream_port: int, upstream_ca: Path):
        self.root = root
        self.port = free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        self.upstream_port = upstream_port
        self.upstream_ca = upstream_ca
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def ca_pem(self) -> bytes:
        return (self.root / "conf" / "mitmproxy-ca-cert.pem").read_bytes()

    def __enter__(self) -> InterceptingProxy:
        if not MITMDUMP.exists():
            raise RuntimeError(f"{MITMDUMP} is missing: run `make mitm-deps` (make test does)")
        self.root.mkdir(parents=True, exist_ok=True)
        self.arm("none")
        out = open(self.root / "mitmdump.log", "wb")
        self.proc = subprocess.Popen(
            [str(MITMDUMP), "--mode", f"reverse:https://127.0.0.1:{self.upstream_port}@127.0.0.1:{self.port}",
             "--set", f"confdir={self.root / 'conf'}",
             "--set", f"ssl_verify_upstream_trusted_ca={self.upstream_ca}",
             "--set", "flow_detail=0", "-s", str(ADDON)],
            env={**os.environ, "VERSUS_MITM_DIR": str(self.root)},
            stdout=out, stderr=out, start_new_session=True,
        )  # fmt: skip
        out.close()
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                if (self.root / "conf" / "mitmproxy-ca-cert.pem").exists():
                    return self
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"mitmdump did not start: {self.log()}")
            time.sleep(0.1)

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        kill_group(self.proc)

    def arm(self, attack: str) -> None:
        (self.root / "attack.json").write_text(json.dumps({"attack": attack}))

    def armed(self) -> str:
        return str(json.loads((self.root / "attack.json").read_text())["attack"])

    def results(self) -> list[dict[str, Any]]:
        path = self.root / "results.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def captured(self) -> bytes:
        """Every request and response body the proxy saw decrypted (mitm_addon.py)."""
        path = self.root / "capture.bin"
        return path.read_bytes() if path.exists() else b""

    def log(self) -> str:
        path = self.root / "mitmdump.log"
        return path.read_text(errors="replace") if path.exists() else ""
