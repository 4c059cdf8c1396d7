"""Cost: the operator's footprint with many Runs existing, finished Runs created in bulk, and the load of
lease renewals while many attempts run.

- footprint: the operator is restarted (as after a deployment) with N Runs existing. kopf lists every Run
  and the operator reconciles each; reported: the time and CPU until it has settled (as many reconciles
  as Runs, its work queue empty, no reconcile for 3 s: its own metrics), the requests it made, its RSS
  then, and its idle CPU over the next 20 s.
- bulk: finished Runs are made cheaply while the operator is stopped: a Run is created, then its status
  subresource is written with the status of a real Succeeded echo Run (phase Succeeded, its result,
  committedBy naming the Run's own `-a1`, the condition set and side-effect counts), so the operator
  finds nothing to do for it. They have no Attempt, Pod or Lease: the operator's caches hold those only
  for the Runs that really ran.
- lease load: M Runs whose agent works for an hour (the default lease, spec.lease), all running; then the
  API server's request counters (every client's) and the CPU of each component over a window of 2
  renewal periods. What the control plane asks by itself (leader elections, endpoints, node heartbeats)
  is measured over a window as long before the Runs are created, and taken off: the rest is what M idle
  running attempts cost. The API server counts a watch when it ends, so the SDK's Run watch (one request
  per RUN_WATCH_TIMEOUT_SECONDS per attempt, longer than the window) is added by arithmetic, not
  counted.
"""

from __future__ import annotations

import asyncio
import copy
import time
import urllib.request
from collections import Counter
from typing import Any

from harness import (
    Bench,
    JsonDict,
    by_verb_resource,
    cpu_seconds,
    create_all,
    first_times,
    log,
    request_delta,
    rss_mib,
    runs_path,
    wait_until,
)
from latency import HANG, ONE_ATTEMPT, _pod_event
from prometheus_client.parser import text_string_to_metric_families

from agentrun.api.run import LeaseSpec
from agentrun.examples.manifests import agent_run
from agentrun.worker.session import RUN_WATCH_TIMEOUT_SECONDS

AGENTRUN_KINDS = ("runs", "attempts", "checkpoints", "sideeffects")


def operator_metrics(port: int) -> dict[str, float]:
    """The operator's own Prometheus metrics, summed over labels."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    sums: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            sums[sample.name] = sums.get(sample.name, 0.0) + sample.value
    return sums


def _settled(bench: Bench, runs_existing: int, limit: float = 600) -> float:
    """Waits until the restarted operator has reconciled every Run once, its work queue is empty and no
    reconcile happened for 3 s; returns when the last reconcile was seen."""
    deadline = time.monotonic() + limit
    last_count, last_change = -1.0, time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.5)
        try:
            metrics = operator_metrics(bench.metrics_port)
        except OSError:
            continue  # not serving yet
        count = metrics.get("agentrun_reconciles_total", 0.0)
        if count != last_count:
            last_count, last_change = count, time.monotonic()
            continue
        idle = metrics.get("agentrun_work_queue_depth", 0.0) == 0
        if count >= runs_existing and idle and time.monotonic() - last_change >= 3.0:
            return last_change
    raise TimeoutError(f"the operator did not settle ({last_count:.0f} reconciles)")


def footprint(bench: Bench, runs_existing: int) -> dict[str, Any]:
    before = bench.requests()
    began = time.monotonic()
    bench.restart_operator()
    pid = bench.operator.process.pid  # type: ignore[union-attr]
    calm = _settled(bench, runs_existing)
    startup_cpu = cpu_seconds(pid)
    requests = by_verb_resource(request_delta(bench.requests(), before))
    rss = rss_mib(pid)
    idle_began = cpu_seconds(pid)
    time.sleep(20)
    idle = (cpu_seconds(pid) - idle_began) / 20
    result = {
        "runs_existing": runs_existing,
        "startup_seconds": round(calm - began, 1),
        "startup_cpu_seconds": round(startup_cpu, 1),
        "rss_mib": round(rss, 1),
        "rss_mib_after_idle": round(rss_mib(pid), 1),
        "idle_cpu_percent": round(idle * 100, 2),
        # the operator's own kinds only: other clients (e.g. a controller's backlog of Events) are noise
        "startup_requests": {
            f"{v} {r}": n for (v, r), n in requests.most_common() if r.split("/")[0] in AGENTRUN_KINDS
        },
    }
    log(f"footprint: {result}")
    return result


def finished_runs(bench: Bench, ns: str, count: int, template: JsonDict, concurrency: int = 32) -> float:
    """Creates `count` finished Runs (see the module's doc); returns the seconds it took."""
    api = bench.api(concurrency)
    status_template = copy.deepcopy(template["status"])

    async def one(i: int, gate: asyncio.Semaphore) -> None:
        name = f"done{i}"
        async with gate:
            await api.create(runs_path(ns), agent_run(name, "echo", {"i": i}))
            status = copy.deepcopy(status_template)
            status["committedBy"]["attempt"] = f"{name}-a1"
            status["currentAttempt"] = 1
            status.pop("observedGeneration", None)
            await api.merge_patch(api.custom_path("runs", ns, name, "status"), {"status": status})

    async def all_of_them() -> None:
        gate = asyncio.Semaphore(concurrency)
        await asyncio.gather(*(one(i, gate) for i in range(count)))

    began = time.monotonic()
    try:
        asyncio.run(all_of_them())
    finally:
        api.close()
    return time.monotonic() - began


def _request_rate(bench: Bench, window: float) -> tuple[Counter[tuple[str, str]], float]:
    """Requests by (verb, resource) made over the next `window` seconds, and their total per second."""
    before = bench.requests()
    time.sleep(window)
    requests = by_verb_resource(request_delta(bench.requests(), before))
    return requests, sum(requests.values()) / window


def lease_load(bench: Bench, ns: str, m: int) -> dict[str, Any]:
    lease = LeaseSpec()
    renew_seconds = lease.renew_seconds
    window = 2 * renew_seconds
    _, baseline = _request_rate(bench, window)  # the control plane's own, no attempt running
    pods = bench.recorder(f"/api/v1/namespaces/{ns}/pods", _pod_event)
    api = bench.api(16)
    names = [f"l{i}" for i in range(m)]
    bodies = (agent_run(name, "scenario", HANG, retry=ONE_ATTEMPT) for name in names)

    began = time.monotonic()
    try:
        asyncio.run(create_all(api, runs_path(ns), bodies, concurrency=16))
    finally:
        api.close()

    def running() -> set[str]:
        return set(first_times(pods.snapshot(), lambda e: e[0] if e[2] == "running" else None))

    wait_until(lambda: set(names) <= running(), 900, f"{m} attempts running", interval=1.0)
    pods.stop()
    log(f"lease load: {m} attempts running after {time.monotonic() - began:.0f}s")
    time.sleep(renew_seconds + 2)  # every worker in its renewal cycle
    pids = {
        "kube-apiserver": bench.pid("kube-apiserver"),
        "etcd": bench.pid("etcd"),
        "node agent (the workers)": bench.pid("node-agent"),
        "operator": bench.operator.process.pid,  # type: ignore[union-attr]
    }
    cpu0 = {k: cpu_seconds(p) for k, p in pids.items()}
    requests, rate = _request_rate(bench, window)
    cpu = {k: round((cpu_seconds(p) - cpu0[k]) / window * 100, 1) for k, p in pids.items()}
    per_1000 = 1000 / m
    attempts_rate = max(rate - baseline, 0.0)
    watches = 1000 / RUN_WATCH_TIMEOUT_SECONDS
    result = {
        "attempts": m,
        "duration_seconds": lease.duration_seconds,
        "renew_seconds": renew_seconds,
        "window_seconds": window,
        "lease_patches_per_s": round(requests[("PATCH", "leases")] / window, 2),
        "requests_per_s": round(rate, 2),
        "baseline_requests_per_s": round(baseline, 2),
        "per_1000_attempts": {
            "renewals_per_s": round(requests[("PATCH", "leases")] / window * per_1000, 1),
            "requests_per_s": round(attempts_rate * per_1000, 1),
            "run_watches_per_s": round(watches, 1),
            "with_run_watches_per_s": round(attempts_rate * per_1000 + watches, 1),
        },
        "requests_by_kind_per_s": {f"{v} {r}": round(n / window, 2) for (v, r), n in requests.most_common(8)},
        "cpu_percent_of_one_core": cpu,
        "operator_rss_mib": round(rss_mib(pids["operator"]), 1),
        "apiserver_rss_mib": round(rss_mib(pids["kube-apiserver"]), 1),
        "node_agent_rss_mib": round(rss_mib(pids["node agent (the workers)"]), 1),
    }
    log(f"lease load: {result}")
    return result
