"""Answer accepted -> agent continues, inside the hold (the same Attempt) vs the new-Attempt path.

Each Run of the scenario agent asks at step 2 with a PRIORITY schema; `hold` Runs hold the request for
120 s (answered at once: the same Attempt continues), `release` Runs hold it 1 s and are answered once
their first Attempt has ended (a new Attempt continues). A watch on each Run timestamps: the first event
with the answer in status.inputs (accepted) and the first after it whose latestCheckpoint moved past
the request's checkpoint (the agent continued and checkpointed step 2).

    PYTHONPATH=hack:tests .venv/bin/python bench/holds.py --runs 10
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from harness import Bench, log, percentile
from kubernetes import watch

from support.kube import wait_for
from support.runs import PRIORITY, attempts, create_run, get_run, patch_spec, scenario_run

GROUP, VERSION = "agentrun.dev", "v1alpha1"


def one(bench: Bench, ns: str, name: str, hold: int) -> float:
    ask = {"atStep": 2, "schema": PRIORITY, "holdSeconds": hold}
    create_run(bench.kube, ns, scenario_run(name, {"steps": 2, "ask": ask}))

    def ready() -> dict[str, Any] | None:
        run = get_run(bench.kube, ns, name)
        pending = run.get("status", {}).get("pendingRequest") or {}
        if run.get("status", {}).get("phase") != "InputRequired":
            return None
        if hold > 1:
            return run if pending.get("heldBy") else None
        first = attempts(bench.kube, ns, name)[0].get("status") or {}
        return run if first.get("phase") == "Interrupted" else None

    waiting = wait_for(ready, timeout=120, interval=0.05, what=f"{name} waiting")
    pending = waiting["status"]["pendingRequest"]
    times: dict[str, float] = {}
    stream = watch.Watch()

    def observe() -> None:
        for event in stream.stream(
            bench.kube.custom.list_namespaced_custom_object,
            GROUP,
            VERSION,
            ns,
            "runs",
            field_selector=f"metadata.name={name}",
            resource_version=waiting["metadata"]["resourceVersion"],
        ):
            status = event["object"].get("status", {})
            keys = [i["idempotencyKey"] for i in status.get("inputs") or []]
            if "accepted" not in times and "answer" in keys:
                times["accepted"] = time.monotonic()
            if "accepted" in times and status.get("latestCheckpoint") not in (None, pending["checkpointId"]):
                times["continued"] = time.monotonic()
                stream.stop()

    watcher = threading.Thread(target=observe, daemon=True)
    watcher.start()
    patch_spec(
        bench.kube,
        ns,
        name,
        {
            "resume": {
                **{k: pending[k] for k in ("requestId", "checkpointId")},
                "value": {"priority": "high"},
                "idempotencyKey": "answer",
            }
        },
    )
    watcher.join(120)
    return times["continued"] - times["accepted"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--report", default="bench/holds.json")
    args = parser.parse_args()
    bench = Bench(Path(tempfile.mkdtemp(prefix="bench-holds-")), instant=False).start()
    try:
        Path(args.report).write_text(json.dumps(measure(bench, args.runs), indent=2) + "\n")
    finally:
        bench.stop()


def measure(bench: Bench, runs: int) -> dict[str, Any]:
    """`runs` Runs answered inside their hold and as many after a release: summary and raw seconds."""
    ns = bench.namespace("holds")
    results: dict[str, list[float]] = {"hold": [], "release": []}
    for n in range(runs):
        results["hold"].append(one(bench, ns, f"hold-{n}", 120))
        results["release"].append(one(bench, ns, f"release-{n}", 1))
    summary = {
        path: {"p50_ms": percentile(v, 0.5) * 1000, "p99_ms": percentile(v, 0.99) * 1000, "n": len(v)}
        for path, v in results.items()
    }
    log(f"answer accepted -> agent continues: {json.dumps(summary)}")
    return {"summary": summary, "seconds": results}


if __name__ == "__main__":
    main()
