"""Envelope sign and verify throughput against raw Ed25519 on the same bytes.

    python -m bench.envelope [--rounds N] [--seconds S]

The *full* paths are what the control plane and a collector actually run:
signing = validate the draft, hash the params, build the canonical bytes,
Ed25519-sign, encode the wire JSON; verifying = decode and validate the wire
JSON, build the canonical bytes, look up the key, Ed25519-verify, check the
collector, the window, the params hash, the seen-set and the journal. The
baseline is `cryptography`'s Ed25519 sign / verify of the same canonical bytes,
measured in the same process, interleaved round by round so both see the same
machine state. Reported: median operations per second and the envelope's
overhead over the baseline (target: at most 15 %).

A second baseline, the *floor*, adds the work any implementation of the format
must do on top of the signature - SHA-256 of the params and their base64
encoding or decoding - so large-params results show what is format and what is
code.
"""

from __future__ import annotations

import argparse
import binascii
import hashlib
import json
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import cryptography

from common.envelope import wire
from common.envelope.sign import EnvelopeDraft, sign
from common.envelope.verify import VerifyContext, verify
from common.trust.keys import SigningKey

NOW = 1_767_225_600


class _Journal:
    def lookup(self, idempotency_key: str) -> None:
        return None


def _draft(params: bytes) -> EnvelopeDraft:
    # Field lengths typical of production ids (ULIDs, provider names, device paths).
    return EnvelopeDraft(
        task_id="tsk-01JDZQ8M3W6Y2N5B7K9X4P1R0T",
        collector_id="col-01JDZQ7V0GQF3T2C8H6Z5M9N4E",
        provider="ADCProvider/f5-big-ip",
        operation="pool.member.disable",
        op_class="mutate_reconcilable",
        target_ref="device:lb-prod-01/partition/Common/pool/web",
        idempotency_key="wf-7f3a9c:step-4",
        params=params,
        not_before=NOW - 30,
        expires_at=NOW + 270,
        lease_epoch=1_204,
    )


@dataclass
class Result:
    workload: str
    path: str
    envelope_ops: float
    raw_ops: float
    floor_ops: float

    @property
    def overhead(self) -> float:
        """Extra time per operation over raw Ed25519."""
        return self.raw_ops / self.envelope_ops - 1

    @property
    def over_floor(self) -> float:
        return self.floor_ops / self.envelope_ops - 1


def _per_op(fn: Callable[[], object], seconds: float) -> float:
    # Calibrate the batch size once, then time a batch.
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds / 10:
        fn()
        n += 1
    batch = max(n * 10, 50)
    start = time.perf_counter()
    for _ in range(batch):
        fn()
    return (time.perf_counter() - start) / batch


def _compare(candidates: list[Callable[[], object]], rounds: int, seconds: float) -> list[float]:
    """Median operations per second of each candidate, measured in interleaved rounds."""
    times: list[list[float]] = [[] for _ in candidates]
    order = list(range(len(candidates)))
    for _ in range(rounds):
        # Rotate the order so no candidate systematically runs with the warmest cache.
        order = order[1:] + order[:1]
        for index in order:
            times[index].append(_per_op(candidates[index], seconds))
    return [1 / statistics.median(t) for t in times]


def run(rounds: int, seconds: float) -> list[Result]:
    key = SigningKey.from_seed("dsp-20261129-5f2a9c1e", bytes(range(32)), NOW + 86_400)
    private, public = key.private_key(), key.private_key().public_key()
    ctx = VerifyContext(
        collector_id="col-01JDZQ7V0GQF3T2C8H6Z5M9N4E",
        now=NOW,
        trusted_keys={key.kid: key.public},
        seen=set(),
        journal=_Journal(),
    )
    typical = b'{"pool":"web","member":"10.20.30.40:443","reason":"maintenance","ticket":"CHG-1"}'
    workloads = {
        "typical (200 B params)": typical * 2 + b" " * 34,
        "large (64 KiB params)": bytes(range(256)) * 256,
    }
    results = []
    for name, params in workloads.items():
        draft = _draft(params)
        raw_envelope = sign(draft, key)
        decoded = wire.decode(raw_envelope)
        canonical, signature = decoded.canonical, decoded.signature
        params_b64 = binascii.b2a_base64(params, newline=False)
        verify(raw_envelope, ctx)  # sanity: the path under test accepts it

        def sign_floor(params: bytes = params, canonical: bytes = canonical) -> None:
            hashlib.sha256(params).digest()
            binascii.b2a_base64(params, newline=False)
            private.sign(canonical)

        def verify_floor(
            params_b64: bytes = params_b64, canonical: bytes = canonical, sig: bytes = signature
        ) -> None:
            hashlib.sha256(binascii.a2b_base64(params_b64)).digest()
            public.verify(sig, canonical)

        def sign_full(draft: EnvelopeDraft = draft) -> None:
            sign(draft, key)

        def sign_raw(canonical: bytes = canonical) -> None:
            private.sign(canonical)

        def verify_full(envelope: bytes = raw_envelope) -> None:
            verify(envelope, ctx)

        def verify_raw(canonical: bytes = canonical, sig: bytes = signature) -> None:
            public.verify(sig, canonical)

        results.append(Result(name, "sign", *_compare([sign_full, sign_raw, sign_floor], rounds, seconds)))
        results.append(
            Result(name, "verify", *_compare([verify_full, verify_raw, verify_floor], rounds, seconds))
        )
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--seconds", type=float, default=0.4, help="approximate time per timed batch")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    results = run(args.rounds, args.seconds)
    if args.json:
        rows = [r.__dict__ | {"overhead": r.overhead, "over_floor": r.over_floor} for r in results]
        print(json.dumps(rows, indent=2))
        return 0
    print(
        f"python {platform.python_version()}, cryptography {cryptography.__version__}, {platform.machine()}"
    )
    header = f"{'workload':24} {'path':7} {'envelope ops/s':>15} {'raw Ed25519':>12} {'floor':>9}"
    print(f"{header} {'vs raw':>8} {'vs floor':>9}")
    for r in results:
        print(
            f"{r.workload:24} {r.path:7} {r.envelope_ops:15,.0f} {r.raw_ops:12,.0f} {r.floor_ops:9,.0f} "
            f"{r.overhead:8.1%} {r.over_floor:9.1%}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
