"""Receivers of the audit export for tests: Debian's rsyslog listening for RFC 5425 syslog over TLS
and writing each message to a file, and an HTTPS webhook that checks each delivery's HMAC signature.
Both can be taken down and brought back, as a SIEM's intake is."""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import shutil
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psutil
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from common.embedded.process import free_port
from router.audit_export import events

RSYSLOGD = shutil.which("rsyslogd") or "/usr/sbin/rsyslogd"


@dataclass(frozen=True)
class TlsFiles:
    ca: Path
    cert: Path
    key: Path


def tls_files(directory: Path) -> TlsFiles:
    """A CA and a certificate it issued for 127.0.0.1 and localhost, as PEM files."""
    directory.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "receiver test CA")])
    ca = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(
            [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    files = TlsFiles(directory / "ca.pem", directory / "cert.pem", directory / "key.pem")
    files.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    files.cert.write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    files.key.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    files.key.chmod(0o600)
    return files


class Rsyslog:
    """rsyslogd in the foreground: imtcp with the gtls driver on ``port``, each message's raw text to
    ``received``."""

    def __init__(self, directory: Path, tls: TlsFiles, port: int):
        self.directory, self.port = directory, port
        self.received = directory / "received.log"
        (directory / "work").mkdir(parents=True, exist_ok=True)
        self.config = directory / "rsyslog.conf"
        self.config.write_text(
            f'global(workDirectory="{directory / "work"}" maxMessageSize="64k"\n'
            f'       defaultNetstreamDriverCAFile="{tls.ca}" defaultNetstreamDriverCertFile="{tls.cert}"\n'
            f'       defaultNetstreamDriverKeyFile="{tls.key}")\n'
            'module(load="imtcp" streamDriver.name="gtls" streamDriver.mode="1"\n'
            '       streamDriver.authMode="anon")\n'
            f'input(type="imtcp" address="127.0.0.1" port="{port}")\n'
            'template(name="raw" type="string" string="%rawmsg%\\n")\n'
            f'action(type="omfile" file="{self.received}" template="raw")\n'
        )
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with (self.directory / "rsyslogd.out").open("ab") as log:
            self.proc = subprocess.Popen(
                [RSYSLOGD, "-n", "-f", str(self.config), "-i", str(self.directory / "rsyslogd.pid")],
                stdout=log, stderr=log,
            )  # fmt: skip
        # rsyslogd itself must hold the listening socket: a connect alone could reach another
        # process that took the port (rsyslogd keeps running when it cannot bind).
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, (self.directory / "rsyslogd.out").read_text()
            if any(
                c.status == psutil.CONN_LISTEN and c.laddr.port == self.port
                for c in psutil.Process(self.proc.pid).net_connections("tcp")
            ):
                return
            time.sleep(0.1)
        said = (self.directory / "rsyslogd.out").read_text(errors="replace")
        raise AssertionError(f"rsyslogd did not listen on {self.port}:\n{said}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()  # rsyslogd writes what it holds, then exits
            self.proc.wait(timeout=20)
        self.proc = None

    def events(self) -> list[dict[str, Any]]:
        if not self.received.exists():
            return []
        out = []
        for line in self.received.read_text(errors="replace").splitlines():
            if "{" in line:
                out.append(json.loads(line[line.index("{") :]))
        return out


class Webhook:
    """An HTTPS receiver: each POST's signature checked with ``secret``; 503 while ``down``; a stored
    batch answered only after ``hold_s``."""

    def __init__(self, tls: TlsFiles, secret: bytes):
        self.secret, self.refused, self.down = secret, 0, False
        self.hold_s = 0.0  # keep each answer back this long after storing the batch (a slow intake)
        self.events: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                header = self.headers.get(events.SIGNATURE_HEADER, "")
                if outer.down:
                    self.send_response(503)
                elif not events.verify_signature(outer.secret, header, body, int(time.time())):
                    with outer.lock:
                        outer.refused += 1
                    self.send_response(401)
                else:
                    with outer.lock:
                        outer.events.extend(json.loads(body))
                    time.sleep(outer.hold_s)
                    self.send_response(204)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(tls.cert, tls.key)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.url = f"https://127.0.0.1:{self.server.server_address[1]}/audit"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@contextmanager
def receivers(directory: Path, secret: bytes) -> Iterator[tuple[Rsyslog, Webhook, TlsFiles]]:
    tls = tls_files(directory / "tls")
    syslog = Rsyslog(directory / "rsyslog", tls, free_port())
    webhook = Webhook(tls, secret)
    syslog.start()
    try:
        yield syslog, webhook, tls
    finally:
        syslog.stop()
        webhook.close()
