"""kube-apiserver CPU per request, for each write a successful Run makes and for a Job's own writes.

    PYTHONPATH=hack:tests:bench .venv/bin/python bench/request_cost.py --n 400

One instant control plane with the admission policies. One echo Run goes through the operator first; its
final Run status and Attempt are the templates. Then, with the operator stopped, each kind of request is
sent N times (16 in flight) as the admin, and kube-apiserver's CPU (from /proc) over those N requests,
less its idle rate, is divided by N. The Run's status is written in the three merge patches a Run gets
(the grant, the commit, the end); Jobs are created with `spec.managedBy` naming another controller, so
the Job controller leaves them alone, and their status is written as the Job controller writes it (three
PUTs). Each kind waits until kube-apiserver is idle (below 3 % of a core), so the previous section's
background work (e.g. the garbage collector finishing a batch) is not charged to it.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import throughput
from harness import Bench, JsonDict, cpu_seconds, load1, log

from agentrun.api import GROUP, VERSION
from agentrun.examples.manifests import agent_run
from agentrun.kubeapi import KubeApi


def run_status_patches(final: JsonDict) -> list[JsonDict]:
    """The grant, the commit and the end, as the operator and the SDK write them (a close model)."""
    conditions = final["conditions"]
    grant = {
        "phase": "Running",
        "attempts": 1,
        "currentAttempt": 1,
        "leaseEpoch": 1,
        "observedCancelEpoch": 0,
        "observedGeneration": 1,
        "message": "attempt 1 started",
        "conditions": conditions,
    }
    commit = {"result": final["result"], "committedBy": final["committedBy"]}
    end = {k: v for k, v in final.items() if k not in grant and k not in commit} | {
        "phase": "Succeeded",
        "conditions": conditions,
        "message": final["message"],
    }
    return [grant, commit, end]


Step = Callable[[KubeApi, int], Coroutine[Any, Any, Any]]


def job_statuses() -> list[tuple[str, JsonDict]]:
    """The Job controller's three status writes for a one-Pod Job: started, its Pod counted, complete."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    started = {"startTime": now, "active": 1, "ready": 0, "terminating": 0, "uncountedTerminatedPods": {}}
    pod = "00000000-0000-0000-0000-000000000000"
    counted = started | {"active": 0, "uncountedTerminatedPods": {"succeeded": [pod]}}
    reached = {"reason": "CompletionsReached", "message": "Reached expected number of succeeded pods"}
    complete = {k: v for k, v in started.items() if k != "active"} | {
        "succeeded": 1,
        "completionTime": now,
        "conditions": [
            {"type": kind, "status": "True", "lastProbeTime": now, "lastTransitionTime": now, **reached}
            for kind in ("SuccessCriteriaMet", "Complete")
        ],
    }
    return [("started", started), ("Pod counted", counted), ("complete", complete)]


async def each(api: KubeApi, n: int, step: Step, concurrency: int = 16) -> None:
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        async with gate:
            await step(api, i)

    await asyncio.gather(*(one(i) for i in range(n)))


def idle_rate(pid: int, below: float = 0.03, patience: float = 60) -> float:
    """kube-apiserver's background CPU (cores) over 2 s, once it is below `below` (or patience ran out)."""
    deadline = time.monotonic() + patience
    while True:
        cpu0, t0 = cpu_seconds(pid), time.monotonic()
        time.sleep(2)
        rate = (cpu_seconds(pid) - cpu0) / (time.monotonic() - t0)
        if rate < below or time.monotonic() > deadline:
            return rate


def measure(bench: Bench, name: str, n: int, step: Step) -> float:
    pid = bench.pid("kube-apiserver")
    idle = idle_rate(pid)
    api = bench.api()
    try:
        cpu0, began = cpu_seconds(pid), time.monotonic()
        asyncio.run(each(api, n, step))
        cpu, seconds = cpu_seconds(pid) - cpu0, time.monotonic() - began
    finally:
        api.close()
    per = (cpu - idle * seconds) / n * 1000
    log(f"{name}: {per:.2f} ms of kube-apiserver CPU per request (idle {idle * 100:.1f} %)")
    return per


def measure_all(bench: Bench, n: int) -> dict[str, float]:
    """Every request kind of the table, N times each; stops the operator (its templates come first)."""
    ns = bench.namespace("request-cost")
    throughput.batch(bench, "runs", ns, 1, timeout=120)
    run = bench.kube.custom.get_namespaced_custom_object(GROUP, VERSION, ns, "runs", "w0")
    attempt = bench.kube.custom.get_namespaced_custom_object(GROUP, VERSION, ns, "attempts", "w0-a1")
    bench.operator.stop()
    patches = run_status_patches(run["status"])

    def job(i: int) -> JsonDict:
        body = throughput.job(f"j{i}")
        body["spec"]["managedBy"] = "bench.agentrun.dev/nobody"  # the Job controller leaves it alone
        return body

    def attempt_body(i: int) -> JsonDict:
        body = {k: copy.deepcopy(attempt[k]) for k in ("apiVersion", "kind", "spec")}
        body["metadata"] = {"name": f"r{i}-a1", "labels": attempt["metadata"].get("labels", {})}
        body["spec"]["runName"] = f"r{i}"
        return body

    lease = {"spec": {"holderIdentity": "x", "leaseDurationSeconds": 60}}
    steps: list[tuple[str, Step]] = [
        (
            "POST runs",
            lambda a, i: a.create(KubeApi.custom_path("runs", ns), agent_run(f"r{i}", "echo", {"i": i})),
        ),
        *(
            (
                f"PATCH runs/status ({label})",
                lambda a, i, p=patch: a.merge_patch(
                    KubeApi.custom_path("runs", ns, f"r{i}", "status"), {"status": p}
                ),
            )
            for label, patch in zip(("grant", "commit", "end"), patches, strict=True)
        ),
        ("POST attempts", lambda a, i: a.create(KubeApi.custom_path("attempts", ns), attempt_body(i))),
        (
            "PATCH attempts/status",
            lambda a, i: a.merge_patch(
                KubeApi.custom_path("attempts", ns, f"r{i}-a1", "status"), {"status": attempt["status"]}
            ),
        ),
        (
            "POST leases",
            lambda a, i: a.create(KubeApi.lease_path(ns), lease | {"metadata": {"name": f"agentrun-r{i}"}}),
        ),
        ("POST jobs", lambda a, i: a.create(f"/apis/batch/v1/namespaces/{ns}/jobs", job(i))),
        *(
            (
                f"PUT jobs/status ({label})",
                lambda a, i, s=status: a.replace(
                    f"/apis/batch/v1/namespaces/{ns}/jobs/j{i}/status", job(i) | {"status": s}
                ),
            )
            for label, status in job_statuses()
        ),
    ]
    return {name: round(measure(bench, name, n, step), 2) for name, step in steps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--n", type=int, default=400)
    parser.add_argument("--state", type=Path, default=Path("/tmp/agentrun-request-cost"))
    args = parser.parse_args()
    bench = Bench(args.state, instant=True)
    try:
        bench.start()
        results = measure_all(bench, args.n)
        log(json.dumps({"n": args.n, "load1": load1(), "ms_per_request": results}, indent=1))
    finally:
        bench.stop()


if __name__ == "__main__":
    main()
