"""Throughput: N one-step work items as agentrun Runs (echo agent) and as Kubernetes Jobs (backoffLimit 0),
on the same control plane and the same node agent in instant mode.

A batch is created as fast as a 16-way concurrent client can (its creation time is reported too); the rate
is N over the time from the first create request to the last completion seen: a Run Succeeded, a Job with
condition Complete. API requests are the API server's own counters over the batch (all clients: the
operator or kube-controller-manager, the scheduler, the node agent, and for Runs the in-process workers).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from harness import Bench, JsonDict, by_verb_resource, create_all, log, request_delta, runs_path, wait_until

from agentrun.examples.manifests import agent_run

TERMINAL_RUN = ("Succeeded", "Failed", "Cancelled", "NeedsReconciliation")


@dataclass
class Batch:
    kind: str  # "runs" | "jobs"
    n: int
    create_seconds: float
    total_seconds: float
    failed: int
    requests: Counter[tuple[str, str]]

    @property
    def per_minute(self) -> float:
        return self.n / self.total_seconds * 60

    def summary(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "n": self.n,
            "create_seconds": round(self.create_seconds, 2),
            "total_seconds": round(self.total_seconds, 2),
            "per_minute": round(self.per_minute, 1),
            "failed": self.failed,
            "requests": sum(self.requests.values()),
        }


def _run_phase(kind: str, obj: JsonDict) -> tuple[str, str] | None:
    phase = (obj.get("status") or {}).get("phase")
    return (obj["metadata"]["name"], phase) if phase in TERMINAL_RUN else None


def _job_state(kind: str, obj: JsonDict) -> tuple[str, str] | None:
    for condition in (obj.get("status") or {}).get("conditions") or []:
        if condition.get("type") in ("Complete", "Failed") and condition.get("status") == "True":
            return obj["metadata"]["name"], str(condition["type"])
    return None


def job(name: str) -> JsonDict:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "enableServiceLinks": False,
                    "containers": [{"name": "work", "image": "none", "command": ["true"]}],
                }
            },
        },
    }


def batch(bench: Bench, kind: str, ns: str, n: int, timeout: float) -> Batch:
    if kind == "runs":
        path, extract = runs_path(ns), _run_phase
        bodies = [agent_run(f"w{i}", "echo", {"item": i}) for i in range(n)]
        ok = "Succeeded"
    else:
        path, extract = f"/apis/batch/v1/namespaces/{ns}/jobs", _job_state
        bodies = [job(f"w{i}") for i in range(n)]
        ok = "Complete"
    recorder = bench.recorder(path, extract)
    before = bench.requests()
    api = bench.api()
    began = time.monotonic()
    try:
        asyncio.run(create_all(api, path, bodies))
    finally:
        api.close()
    created = time.monotonic()
    log(f"{kind}: {n} created in {created - began:.1f}s")

    def finished() -> dict[str, tuple[float, str]]:
        out: dict[str, tuple[float, str]] = {}
        for t, (name, state) in recorder.snapshot():
            out.setdefault(name, (t, state))
        return out

    def progress() -> bool:
        return len(finished()) >= n

    last_report = [time.monotonic()]

    def probe() -> bool:
        if time.monotonic() - last_report[0] > 15:
            last_report[0] = time.monotonic()
            log(f"{kind}: {len(finished())}/{n} done")
        return progress()

    wait_until(probe, timeout, f"{n} {kind} finished", interval=0.5)
    recorder.stop()
    done = finished()
    end = max(t for t, _ in done.values())
    time.sleep(3)  # the trailing writes of the last items (e.g. the Attempt's final status, Events)
    requests = by_verb_resource(request_delta(bench.requests(), before))
    failed = sum(1 for _, state in done.values() if state != ok)
    result = Batch(kind, n, created - began, end - began, failed, requests)
    log(f"{kind}: {result.summary()}")
    return result
