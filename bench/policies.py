"""What the admission policies (agentrun.admission) cost the API server: the same work on instant control
planes with the policies installed (as a Helm install has them) and without, alternating.

    PYTHONPATH=hack:tests .venv/bin/python bench/policies.py [--runs 300] [--attempts 100] [--reps 2]

- a batch of echo Runs: kube-apiserver CPU per Run (ms) and requests per Run, from creation until the
  last Run Succeeded;
- lease renewals: attempts that run for an hour renew their Lease every `renewSeconds`; over a window of
  two renewal periods: kube-apiserver CPU per renewal and the API server's own latency of PATCH leases
  (apiserver_request_duration_seconds: p50 and p99 from the histogram's buckets), admission included.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import throughput
from harness import (
    Bench,
    by_verb_resource,
    cpu_seconds,
    create_all,
    log,
    request_delta,
    runs_path,
    wait_until,
)
from prometheus_client.parser import text_string_to_metric_families

from agentrun.examples.manifests import agent_run

HANG_INPUT = {"steps": 1, "stepSeconds": 3600}
RENEW_SECONDS = 2
LEASE = {"durationSeconds": 10, "renewSeconds": RENEW_SECONDS}
Buckets = dict[float, float]


def lease_patch_buckets(bench: Bench) -> Buckets:
    """Cumulative counts of apiserver_request_duration_seconds for PATCH leases, by upper bound."""
    response = bench.kube.api_client.call_api(
        "/metrics", "GET", auth_settings=["BearerToken"], _preload_content=False, _return_http_data_only=True
    )
    buckets: Buckets = {}
    for family in text_string_to_metric_families(response.data.decode()):
        if family.name != "apiserver_request_duration_seconds":
            continue
        for sample in family.samples:
            labels = sample.labels
            if (
                sample.name.endswith("_bucket")
                and labels.get("verb") == "PATCH"
                and labels.get("resource") == "leases"
            ):
                bound = float(labels["le"])
                buckets[bound] = buckets.get(bound, 0.0) + sample.value
    return buckets


def quantile(after: Buckets, before: Buckets, q: float) -> float:
    """The q-quantile (seconds) of the observations between two readings, interpolated in its bucket."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    total = counts[-1]
    if total <= 0:
        return float("nan")
    rank, lower, below = q * total, 0.0, 0.0
    for bound, count in zip(bounds, counts, strict=True):
        if count >= rank:
            if bound == float("inf"):
                return lower
            return lower + (bound - lower) * (rank - below) / max(count - below, 1e-9)
        lower, below = bound, count
    return lower


def runs_batch(bench: Bench, n: int) -> dict[str, Any]:
    apiserver = bench.pid("kube-apiserver")
    cpu0 = cpu_seconds(apiserver)
    batch = throughput.batch(bench, "runs", bench.namespace("policy-runs"), n, timeout=900)
    cpu_ms = (cpu_seconds(apiserver) - cpu0) * 1000
    return {
        "runs": n,
        "failed": batch.failed,
        "apiserver_cpu_ms_per_run": round(cpu_ms / n, 1),
        "requests_per_run": round(sum(batch.requests.values()) / n, 1),
        "runs_per_minute": round(batch.per_minute, 1),
    }


def renewals(bench: Bench, m: int) -> dict[str, Any]:
    ns = bench.namespace("policy-leases")
    api = bench.api(16)
    bodies = (agent_run(f"l{i}", "scenario", HANG_INPUT, lease=LEASE) for i in range(m))
    try:
        asyncio.run(create_all(api, runs_path(ns), bodies, concurrency=16))
    finally:
        api.close()

    def all_running() -> bool:
        pods = bench.kube.core.list_namespaced_pod(ns).items
        return len(pods) == m and all(p.status.phase == "Running" for p in pods)

    wait_until(all_running, 600, f"{m} attempts running", interval=1.0)
    time.sleep(2 * RENEW_SECONDS)  # every worker past its first renewal
    apiserver = bench.pid("kube-apiserver")
    window = 10 * RENEW_SECONDS
    before, requests0, cpu0 = lease_patch_buckets(bench), bench.requests(), cpu_seconds(apiserver)
    time.sleep(window)
    after, cpu = lease_patch_buckets(bench), cpu_seconds(apiserver) - cpu0
    patches = by_verb_resource(request_delta(bench.requests(), requests0))[("PATCH", "leases")]
    return {
        "attempts": m,
        "window_seconds": window,
        "renewals": patches,
        "apiserver_cpu_ms_per_renewal": round(cpu * 1000 / max(patches, 1), 2),
        "renewal_p50_ms": round(quantile(after, before, 0.5) * 1000, 2),
        "renewal_p99_ms": round(quantile(after, before, 0.99) * 1000, 2),
    }


def measure(state: Path, policies: bool, runs: int, attempts: int) -> dict[str, Any]:
    bench = Bench(state, instant=True, policies=policies)
    try:
        bench.start()
        return {"policies": policies, "batch": runs_batch(bench, runs), "leases": renewals(bench, attempts)}
    finally:
        bench.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--attempts", type=int, default=100)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "policies.json")
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="agentrun-policies-") as tmp:
        for rep in range(args.reps):
            for policies in (True, False) if rep % 2 == 0 else (False, True):
                began = time.monotonic()
                result = measure(Path(tmp) / f"{rep}-{policies}", policies, args.runs, args.attempts)
                result["seconds"] = round(time.monotonic() - began)
                log(f"policies={policies}: {result}")
                results.append(result)
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    for policies in (True, False):
        mine = [r for r in results if r["policies"] == policies]
        cpu = [r["batch"]["apiserver_cpu_ms_per_run"] for r in mine]
        p99 = [r["leases"]["renewal_p99_ms"] for r in mine]
        print(f"policies={policies}: apiserver CPU per Run {cpu} ms; lease renewal p99 {p99} ms")


if __name__ == "__main__":
    main()
