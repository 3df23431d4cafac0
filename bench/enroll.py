"""Enrollment burst: many collectors enrolling at once, beside the cryptographic floor.

    python -m bench.enroll [--collectors 1000] [--sites 10] [--runs 3] [--json FILE]

Ours: ``--collectors`` simulated collectors (bench/stack.py) post their CSR to
the real gateway at the same moment (one TLS connection each), spread over
``--sites`` sites with one limited-use token each (a rollout with a token per
site), and once more all on one token (``--sites 1``, the worst case: the token's
row lock serialises them); the gateway relays to the enrollment service, which
checks the token under a row lock, verifies the CSR and signs a 90-day certificate.
Reported: enrollments per second over the burst, p50/p99 of each collector's
wait, and CPU seconds per enrollment by process.

Floor, same run: the work no implementation can skip, done in one process
without I/O — parse and verify a P-256 CSR, then build and sign its
certificate with the CA key — as enrollments per second per core, times the
cores. The ratio says how close the service gets to the machine's crypto limit.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import statistics
import time
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from bench.measure import CpuMeter, percentile, profiling
from bench.stack import (
    Stack,
    enroll_many,
    issue_tokens,
    machine,
    pin_load_generator,
    running_stack,
    save_report,
)


def crypto_floor(seconds: float = 2.0) -> float:
    """CSR verify + certificate sign per second on one core (the enrollment's unavoidable crypto)."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "floor CA")])
    key = ec.generate_private_key(ec.SECP256R1())
    csr_pem = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "col-x")]))
        .sign(key, hashes.SHA256())
        .public_bytes(serialization.Encoding.PEM)
    )
    san = x509.SubjectAlternativeName([x509.UniformResourceIdentifier("spiffe://x/site/s/collector/c")])
    done = 0
    started = time.process_time()
    while time.process_time() - started < seconds:
        csr = x509.load_pem_x509_csr(csr_pem)
        assert csr.is_signature_valid
        now = dt.datetime.now(dt.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(csr.subject)
            .issuer_name(ca_name)
            .public_key(csr.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now)
            .not_valid_after(now + dt.timedelta(days=90))
            .add_extension(san, critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        cert.public_bytes(serialization.Encoding.PEM)
        done += 1
    return done / (time.process_time() - started)


async def burst(stack: Stack, count: int, sites: int, profile: str | None = None) -> dict[str, Any]:
    issued = issue_tokens(stack, count, sites)  # before the clock starts: sites and tokens are set up
    meter = CpuMeter(stack)
    before = meter.snapshot()
    started = time.perf_counter()
    async with profiling(meter, "enrollment", profile):
        _, collectors, durations = await enroll_many(stack, count, concurrency=count, issued=issued)
    elapsed = time.perf_counter() - started
    cpu = CpuMeter.delta(before, meter.snapshot())
    await asyncio.gather(*(c.close() for c in collectors))
    return {
        "sites": sites,
        "enrollments": len(durations),
        "seconds": elapsed,
        "per_second": len(durations) / elapsed,
        "p50_ms": percentile(durations, 0.5) * 1000,
        "p99_ms": percentile(durations, 0.99) * 1000,
        "cpu_ms_per_enrollment": {k: v / len(durations) * 1000 for k, v in cpu.items()},
    }


def main() -> None:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--collectors", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--sites", type=int, default=10, help="sites (one token each) the burst spreads over")
    parser.add_argument(
        "--profile-enrollment",
        metavar="SVG",
        help="flame graph of the enrollment service (py-spy), first burst (a .txt name: collapsed stacks)",
    )
    parser.add_argument("--json", dest="json_path", default="bench/results/enroll.json")
    args = parser.parse_args()
    floor_per_core = crypto_floor()
    pinning = pin_load_generator()
    cores = machine()["cpus"] or 1
    results = {}
    with running_stack() as stack:
        for sites in sorted({args.sites, 1}, reverse=True):
            runs = []
            for _ in range(args.runs):
                runs.append(asyncio.run(burst(stack, args.collectors, sites, args.profile_enrollment)))
                args.profile_enrollment = None  # one profile: the first run
                print(json.dumps(runs[-1]), flush=True)
            results[f"{sites}_sites"] = {
                "sites": sites,
                "per_second": statistics.median(r["per_second"] for r in runs),
                "p50_ms": statistics.median(r["p50_ms"] for r in runs),
                "p99_ms": statistics.median(r["p99_ms"] for r in runs),
                "floor_per_second": floor_per_core * cores,
                "cpu_ms_per_enrollment": runs[len(runs) // 2]["cpu_ms_per_enrollment"],
                "runs": runs,
            }
    save_report(args.json_path, pinning, args, results)
    print("| Collectors at once | Sites (a token each) | Enrollments/s | p50 | p99 | Crypto floor | Ratio |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for r in results.values():
        print(
            f"| {args.collectors} | {r['sites']} | {r['per_second']:.0f} | {r['p50_ms']:.0f} ms "
            f"| {r['p99_ms']:.0f} ms | {r['floor_per_second']:.0f}/s "
            f"| {r['per_second'] / r['floor_per_second']:.3f} |"
        )
    for r in results.values():
        cpu = r["cpu_ms_per_enrollment"]
        split = ", ".join(f"{k} {v:.1f}" for k, v in cpu.items())
        print(f"CPU ms per enrollment, {r['sites']} site(s): {split}")


if __name__ == "__main__":
    main()
