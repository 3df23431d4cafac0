"""`versus-collector enroll` and `versus-collector status`.

Enrollment: generate a P-256 key locally, send a CSR (CN = the collector's
self-chosen id) with the one-time token, and store the trust bootstrap. With
``--ca-pin`` the gateway's internal CA is fetched first and accepted only if
its SPKI hash equals the pin, so the collector trusts the gateway before it has
the CA bundle; without it, the system trust store is used (a gateway behind a
publicly trusted certificate).

A retry after a lost response reuses the id and key of the earlier attempt, so
the control plane returns the same identity without spending another token use.
"""

from __future__ import annotations

import hmac
import platform
import secrets
import socket
import ssl
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from collector import __version__
from collector.client import ssl_context
from collector.credentials import read_sealed, write_sealed
from collector.renewal import csr_pem
from collector.state import StatePaths, load_key, read_json, save_key, write_json
from collector.trust import TrustStore
from common.config.state_dir import write_public
from common.trust import collector_jwt, pki
from common.trust.pki import spki_pin

TIMEOUT_S = 30.0


class EnrollError(Exception):
    """A failure to report as one line: ``code: message``."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code


@dataclass(frozen=True, slots=True)
class EnrollOptions:
    url: str
    token: str
    state_dir: Path
    ca_pin: str | None = None
    collector_id: str | None = None
    force: bool = False


def _ssl_context(url: str, ca_pin: str | None) -> ssl.SSLContext:
    if not url.startswith("https://"):
        raise EnrollError("insecure_url", "the gateway URL must be https://")
    if ca_pin is None:
        return ssl.create_default_context()
    # Fetch the CA without verification, then trust it only if it matches the pin.
    unverified = ssl.create_default_context()
    unverified.check_hostname = False
    unverified.verify_mode = ssl.CERT_NONE
    try:
        reply = httpx.get(f"{url}/api/collector/v1/trust", verify=unverified, timeout=TIMEOUT_S)
    except httpx.HTTPError as exc:
        raise EnrollError("gateway_unreachable", f"cannot reach {url}: {exc}") from None
    if reply.status_code != 200:
        raise EnrollError("no_internal_ca", "the gateway offers no internal CA to check against --ca-pin")
    body = reply.json()
    try:
        offered = x509.load_pem_x509_certificates(str(body.get("gateway_ca_pem", "")).encode())
        cross_pem = str(body.get("cross_pem", "")).encode()
        cross = x509.load_pem_x509_certificates(cross_pem) if cross_pem.strip() else []
    except ValueError:
        raise EnrollError("bad_trust_response", "the gateway's CA is not a certificate") from None
    pinned = [c for c in offered if hmac.compare_digest(spki_pin(c), ca_pin)]
    if not pinned:
        raise EnrollError("ca_pin_mismatch", "the gateway's CA does not match --ca-pin; refusing to continue")
    # During a gateway CA rotation the pinned CA may be the old one: its successor is trusted only
    # through a cross certificate the pinned CA signed (common/trust/pki.py successors).
    trusted = pki.successors(pinned, offered, cross)
    return ssl.create_default_context(cadata="".join(pki.cert_pem(c).decode("ascii") for c in trusted))


def _attempt(paths: StatePaths, requested_id: str | None) -> tuple[str, ec.EllipticCurvePrivateKey]:
    """The id and key of an unfinished earlier attempt, or new ones (saved before any request)."""
    if paths.attempt.exists() and paths.key.exists():
        saved = read_json(paths.attempt)
        if requested_id in (None, saved["collector_id"]):
            return str(saved["collector_id"]), load_key(paths.key)
    collector_id = requested_id or f"col-{secrets.token_hex(10)}"
    key = ec.generate_private_key(ec.SECP256R1())
    # Enrolling again with a new key: the sealed credentials move to it (vault mode A), opened with
    # the old key before it is replaced and sealed with the new one right after.
    carried = read_sealed(paths.root, load_key(paths.key)) if paths.key.exists() else {}
    save_key(paths.key, key)
    if carried:
        write_sealed(paths.root, key, carried)
    write_json(paths.attempt, {"collector_id": collector_id})
    return collector_id, key


def _error(reply: httpx.Response) -> EnrollError:
    try:
        error = reply.json()["error"]
        return EnrollError(str(error["code"]), str(error["message"]))
    except (ValueError, KeyError, TypeError):
        return EnrollError(f"http_{reply.status_code}", reply.text[:200])


def enroll(options: EnrollOptions) -> dict[str, Any]:
    """Run enrollment; returns the stored identity."""
    paths = StatePaths(options.state_dir)
    options.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    if paths.identity.exists() and not options.force:
        raise EnrollError("already_enrolled", f"{paths.identity} exists; use --force to enroll again")
    url = options.url.rstrip("/")
    context = _ssl_context(url, options.ca_pin)
    collector_id, key = _attempt(paths, options.collector_id)
    body = {
        "token": options.token,
        "csr_pem": csr_pem(key, collector_id),
        "collector": {
            "hostname": socket.gethostname(),
            "os": platform.system().lower(),
            "arch": platform.machine(),
            "version": __version__,
            "fips_requested": False,
        },
    }
    try:
        reply = httpx.post(f"{url}/api/collector/v1/enroll", json=body, verify=context, timeout=TIMEOUT_S)
    except httpx.HTTPError as exc:
        raise EnrollError("gateway_unreachable", f"cannot reach {url}: {exc}") from None
    if reply.status_code != 200:
        raise _error(reply)
    result = reply.json()
    identity = {
        "collector_id": result["collector_id"],
        "site_id": result["site_id"],
        "status": result["status"],
        "gateway_url": url,
        "gateway": result["gateway"],
        "auth": result["auth"],
    }
    write_public(paths.cert, result["cert_chain_pem"].encode())
    versions = result.get("key_versions") or {}
    # Later bundles arrive in-band, signed (collector/trust.py).
    TrustStore.write_enrolled(
        paths, int(versions.get("trust", 1)), result["ca_bundle_pem"], result["cert_chain_pem"]
    )
    write_json(
        paths.keys,
        {
            "dispatch": result["dispatch_keys"],
            "release": result["release_keys"],
            # Later versions arrive in-band, each signed by the one before (collector/key_sets.py).
            "versions": {
                "dispatch": int(versions.get("dispatch", 1)),
                "release": int(versions.get("release", 1)),
            },
        },
    )
    write_json(paths.policy, result["policy"])
    write_json(paths.identity, identity)
    paths.attempt.unlink(missing_ok=True)
    return identity


def status(state_dir: Path) -> dict[str, Any]:
    """Ask the gateway for this collector's enrollment status (authenticated with its key)."""
    paths = StatePaths(state_dir)
    if not paths.identity.exists():
        raise EnrollError("not_enrolled", f"no identity in {state_dir}; run versus-collector enroll first")
    identity = read_json(paths.identity)
    path = "/api/collector/v1/enrollment"
    token = collector_jwt.mint(
        load_key(paths.key), identity["collector_id"], int(time.time()), method="GET", path=path
    )
    context = ssl_context(paths)
    try:
        reply = httpx.get(
            identity["gateway_url"] + path,
            headers={"Authorization": f"Bearer {token}"},
            verify=context,
            timeout=TIMEOUT_S,
        )
    except httpx.HTTPError as exc:
        raise EnrollError("gateway_unreachable", str(exc)) from None
    if reply.status_code != 200:
        raise _error(reply)
    result: dict[str, Any] = reply.json()
    if result["status"] != identity["status"]:
        identity["status"] = result["status"]
        write_json(paths.identity, identity)
    return result
