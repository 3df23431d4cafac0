"""The Collector CA and the gateway CA, versioned so they rotate with overlap (docs/day2.md).

Layout under the state directory::

    <state>/ca/trust.json              the trust bundle's version; per kind the CAs and the active one
    <state>/ca/<kind>/<ca_id>.pem      a CA certificate (kind: ``collector`` or ``gateway``)
    <state>/ca/<kind>/<ca_id>.key      its private key, mode 0600
    <state>/ca/<kind>/<ca_id>.cross.pem  the CA certified by the CA that was active when it was added

The *active* Collector CA issues collector certificates; the active gateway CA
issues the gateway's server certificate. Every change (a CA added, made active
or retired) is a new version of the bundle: collectors that hold an older one
receive the new one in their next claim answer, signed with a dispatch key they
pin (router/trust/collector_docs.py), and the enrollment service hands the newest to
new collectors. A rotation is three steps an operator takes when ``versus-cp ca
status`` shows it is safe: ``rotate`` (the new CA is trusted beside the old),
``activate`` (it issues), ``retire`` (the old one is dropped).

The cross certificate lets a collector that pins an older gateway CA (the
``--ca-pin`` of an enroll command printed before the rotation) trust its
successor: common/trust/pki.py ``successors``.

Writes happen under an exclusive lock, private keys and certificates first and
``trust.json`` last (atomically), so a crash leaves a usable store. The first
load adopts the CAs of earlier releases (``collector-ca/`` and ``tls/gateway-ca.*``).
"""

from __future__ import annotations

import datetime as dt
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from common.config.state_dir import locked, write_private, write_public
from common.errors import ConfigError, FailedPrecondition
from common.trust import pki

FORMAT = "versus-trust/1"
CA_LIFETIME = dt.timedelta(days=3650)
Kind = Literal["collector", "gateway"]
KINDS: tuple[Kind, ...] = ("collector", "gateway")
NAMES: dict[Kind, str] = {"collector": "Versus Collector CA", "gateway": "Versus Gateway TLS CA"}
# Where releases before versioned CAs kept them: (certificate, key) under the state directory.
LEGACY: dict[Kind, tuple[str, str]] = {
    "collector": ("collector-ca/ca.pem", "collector-ca/ca.key"),
    "gateway": ("tls/gateway-ca.pem", "tls/gateway-ca.key"),
}


@dataclass(frozen=True, slots=True)
class CaEntry:
    ca_id: str
    cert: x509.Certificate
    # The bundle version that first carried this CA: a collector holding it trusts the CA.
    added_in: int
    cross: x509.Certificate | None = None


@dataclass(frozen=True, slots=True)
class Trust:
    """One version of the trust bundle."""

    version: int
    active: dict[Kind, str]
    cas: dict[Kind, tuple[CaEntry, ...]]

    def entry(self, kind: Kind, ca_id: str) -> CaEntry | None:
        return next((e for e in self.cas[kind] if e.ca_id == ca_id), None)

    def active_entry(self, kind: Kind) -> CaEntry:
        entry = self.entry(kind, self.active[kind])
        assert entry is not None  # the store never writes an active id without its CA
        return entry

    def pems(self, kind: Kind) -> list[str]:
        return [pki.cert_pem(e.cert).decode("ascii") for e in self.cas[kind]]

    def cross_pems(self, kind: Kind) -> list[str]:
        return [pki.cert_pem(e.cross).decode("ascii") for e in self.cas[kind] if e.cross is not None]

    def bundle_pem(self) -> str:
        """Every CA a collector trusts: the Collector CAs and the gateway CAs."""
        return "".join(self.pems("collector") + self.pems("gateway"))


class CaStore:
    """Create, rotate, activate and retire the CAs in ``<state>/ca``."""

    def __init__(self, state_dir: Path):
        self.state_dir = state_dir
        self.directory = state_dir / "ca"
        self.index = self.directory / "trust.json"

    def exists(self) -> bool:
        return self.index.exists()

    def mtime_ns(self) -> int:
        try:
            return self.index.stat().st_mtime_ns
        except FileNotFoundError:
            return 0

    def load(self) -> Trust:
        try:
            meta = json.loads(self.index.read_text())
            if meta.get("format") != FORMAT:
                raise ValueError("not a versus trust store")
            cas: dict[Kind, tuple[CaEntry, ...]] = {}
            active: dict[Kind, str] = {}
            for kind in KINDS:
                entries = []
                for item in meta[kind]["cas"]:
                    ca_id = str(item["id"])
                    cert = x509.load_pem_x509_certificate(self._path(kind, ca_id, "pem").read_bytes())
                    if pki.ca_id(cert) != ca_id:
                        raise ValueError(f"{kind} CA {ca_id} does not match its certificate")
                    cross_path = self._path(kind, ca_id, "cross.pem")
                    cross = (
                        x509.load_pem_x509_certificate(cross_path.read_bytes())
                        if cross_path.exists()
                        else None
                    )
                    entries.append(CaEntry(ca_id, cert, int(item["added_in"]), cross))
                cas[kind] = tuple(entries)
                active[kind] = str(meta[kind]["active"])
                if not any(e.ca_id == active[kind] for e in entries):
                    raise ValueError(f"the active {kind} CA {active[kind]} is not in the store")
            return Trust(int(meta["version"]), active, cas)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"cannot load the CAs from {self.directory}: {exc}") from None

    def load_or_create(self, now: dt.datetime | None = None) -> Trust:
        """The store, created on first use (adopting the CAs of earlier releases)."""
        if self.exists():
            return self.load()
        with locked(self.directory):
            if self.exists():
                return self.load()
            at = now or dt.datetime.now(dt.UTC)
            meta: dict[str, Any] = {"format": FORMAT, "version": 1}
            adopted: list[Path] = []
            for kind in KINDS:
                cert, key = self._adopt(kind) or pki.self_signed_ca(NAMES[kind], CA_LIFETIME, at)
                ca_id = pki.ca_id(cert)
                self._write_ca(kind, ca_id, cert, key, None)
                meta[kind] = {"active": ca_id, "cas": [{"id": ca_id, "added_in": 1}]}
                adopted += [self.state_dir / p for p in LEGACY[kind]]
            self._save(meta)
            # The store holds them now; a second copy of a CA key is one more thing to protect.
            for path in adopted:
                path.unlink(missing_ok=True)
            return self.load()

    def private_key(self, kind: Kind, ca_id: str) -> ec.EllipticCurvePrivateKey:
        try:
            key = serialization.load_pem_private_key(self._path(kind, ca_id, "key").read_bytes(), None)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot load the key of {kind} CA {ca_id}: {exc}") from None
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise ConfigError(f"the key of {kind} CA {ca_id} is not an EC key")
        return key

    def rotate(self, kind: Kind, now: dt.datetime | None = None) -> Trust:
        """Add a new CA of ``kind`` beside the others (not active yet), cross-certified by the
        active one; a new version of the bundle."""
        at = now or dt.datetime.now(dt.UTC)
        self.load_or_create(at)
        with locked(self.directory):
            trust, meta = self.load(), self._meta()
            key = ec.generate_private_key(ec.SECP256R1())
            ca_id = pki.key_ca_id(key.public_key())
            cert, _ = pki.self_signed_ca(f"{NAMES[kind]} {ca_id}", CA_LIFETIME, at, key)
            current = trust.active_entry(kind)
            cross = pki.cross_sign(cert, current.cert, self.private_key(kind, current.ca_id))
            self._write_ca(kind, ca_id, cert, key, cross)
            meta["version"] = trust.version + 1
            meta[kind]["cas"].append({"id": ca_id, "added_in": meta["version"]})
            self._save(meta)
        return self.load()

    def activate(self, kind: Kind, ca_id: str) -> Trust:
        """Make ``ca_id`` the CA that issues (collector certificates, or the gateway's)."""
        with locked(self.directory):
            trust, meta = self.load(), self._meta()
            if trust.entry(kind, ca_id) is None:
                raise FailedPrecondition(f"{ca_id} is not a {kind} CA", code="ca_not_found")
            if trust.active[kind] == ca_id:
                return trust
            meta["version"] = trust.version + 1
            meta[kind]["active"] = ca_id
            self._save(meta)
        return self.load()

    def retire(self, kind: Kind, ca_id: str) -> Trust:
        """Drop ``ca_id`` from the bundle and delete its key; refused for the active CA."""
        with locked(self.directory):
            trust, meta = self.load(), self._meta()
            if trust.entry(kind, ca_id) is None:
                raise FailedPrecondition(f"{ca_id} is not a {kind} CA", code="ca_not_found")
            if trust.active[kind] == ca_id:
                raise FailedPrecondition(
                    f"{ca_id} is the active {kind} CA: activate its successor first", code="ca_is_active"
                )
            meta["version"] = trust.version + 1
            meta[kind]["cas"] = [c for c in meta[kind]["cas"] if c["id"] != ca_id]
            self._save(meta)
            for suffix in ("key", "pem", "cross.pem"):
                self._path(kind, ca_id, suffix).unlink(missing_ok=True)
        return self.load()

    # --- files -------------------------------------------------------------------------------------
    def _path(self, kind: Kind, ca_id: str, suffix: str) -> Path:
        return self.directory / kind / f"{ca_id}.{suffix}"

    def _adopt(self, kind: Kind) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None:
        cert_path, key_path = (self.state_dir / p for p in LEGACY[kind])
        if not (cert_path.exists() and key_path.exists()):
            return None
        try:
            cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
            key = serialization.load_pem_private_key(key_path.read_bytes(), None)
        except ValueError as exc:
            raise ConfigError(f"cannot adopt the {kind} CA in {cert_path}: {exc}") from None
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise ConfigError(f"the {kind} CA key in {key_path} is not an EC key")
        return cert, key

    def _write_ca(
        self,
        kind: Kind,
        ca_id: str,
        cert: x509.Certificate,
        key: ec.EllipticCurvePrivateKey,
        cross: x509.Certificate | None,
    ) -> None:
        (self.directory / kind).mkdir(parents=True, exist_ok=True, mode=0o700)
        write_private(self._path(kind, ca_id, "key"), pki.private_pem(key))
        write_public(self._path(kind, ca_id, "pem"), pki.cert_pem(cert))
        if cross is not None:
            write_public(self._path(kind, ca_id, "cross.pem"), pki.cert_pem(cross))

    def _meta(self) -> dict[str, Any]:
        meta: dict[str, Any] = json.loads(self.index.read_text())
        return meta

    def _save(self, meta: dict[str, Any]) -> None:
        write_public(self.index, (json.dumps(meta, indent=2) + "\n").encode())


class ReloadingTrust:
    """The store's newest version, re-read when ``trust.json`` changes (checked at most every
    ``check_interval_s``), so a rotation reaches running services without a restart."""

    def __init__(self, store: CaStore, check_interval_s: float = 1.0):
        self.store = store
        self.check_interval_s = check_interval_s
        self._trust = store.load_or_create()
        self._mtime = store.mtime_ns()
        self._checked = time.monotonic()

    def get(self) -> Trust:
        now = time.monotonic()
        if now - self._checked >= self.check_interval_s:
            self._checked = now
            mtime = self.store.mtime_ns()
            if mtime != self._mtime:
                self._trust, self._mtime = self.store.load(), mtime
        return self._trust
