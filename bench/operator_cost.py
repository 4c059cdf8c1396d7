"""The operator's cost per Run, alone: one instant control plane, one batch of N echo Runs, then M
foreign Pods and Leases (no agentrun label) the operator has no business with.

    PYTHONPATH=hack:tests .venv/bin/python bench/operator_cost.py --n 200 --foreign 200 --state /tmp/oc

Reported: API requests per Run by verb and resource (all clients, WATCH not counted), the operator's CPU
ms per Run over the batch (and the node agent's, which runs the workers in instant mode), its reconciles
per Run, the 1-minute load at the end (CPU figures move with it), and its CPU ms per foreign object (a
create and a delete each); with --footprint N, the operator restarted with N Runs existing
(bench/cost.py's footprint: RSS, start-up). With --profile FILE, py-spy samples the operator over the
batch (PYSPY names the binary if it is not on PATH).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import cost
import throughput
from harness import Bench, cpu_seconds, create_all, load1, log


def foreign_cost(bench: Bench, n: int) -> float:
    """CPU ms of the operator per foreign Pod + Lease created (each also deleted afterwards)."""
    ns = "foreign"
    bench.kube.core.create_namespace({"metadata": {"name": ns}})
    pid = bench.operator.process.pid  # type: ignore[union-attr]
    before = cpu_seconds(pid)
    pods = [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"f{i}", "labels": {"app": "other"}},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]},
        }
        for i in range(n)
    ]
    leases = [{"metadata": {"name": f"f{i}"}, "spec": {"holderIdentity": "someone"}} for i in range(n)]
    api = bench.api()
    try:
        asyncio.run(create_all(api, f"/api/v1/namespaces/{ns}/pods", pods))
        asyncio.run(create_all(api, f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases", leases))
    finally:
        api.close()
    bench.kube.core.delete_collection_namespaced_pod(ns, grace_period_seconds=0)
    bench.kube.coordination.delete_collection_namespaced_lease(ns)
    time.sleep(10)  # the operator's watches deliver what they deliver
    return (cpu_seconds(pid) - before) / n * 1000


@contextlib.contextmanager
def profiled(pid: int, out: Path | None) -> Iterator[None]:
    """With `out`, py-spy samples `pid` over the block (200 Hz, without pausing it; idle threads left
    out) and writes what it saw (by the suffix: .txt collapsed stacks, .json speedscope, else a flame
    graph SVG). py-spy from PYSPY or PATH; it needs ptrace rights (root here)."""
    if out is None:
        yield
        return
    spy = os.environ.get("PYSPY") or shutil.which("py-spy") or "py-spy"
    fmt = {".txt": "raw", ".json": "speedscope"}.get(out.suffix, "flamegraph")
    command = [spy, "record", "--pid", str(pid), "--rate", "200", "--format", fmt, "--output", str(out)]
    recorder = subprocess.Popen([*command, "--nonblocking"], stdout=subprocess.DEVNULL)
    try:
        yield
    finally:
        recorder.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
        recorder.wait(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--foreign", type=int, default=200)
    parser.add_argument("--footprint", type=int, default=0, help="then restart it with this many Runs")
    parser.add_argument("--state", type=Path, default=Path("/tmp/agentrun-operator-cost"))
    parser.add_argument("--profile", type=Path, help="py-spy the operator over the batch into this file")
    args = parser.parse_args()
    bench = Bench(args.state, instant=True)
    try:
        bench.start()
        ns = bench.namespace("cost")
        pid, node_pid = bench.operator.process.pid, bench.pid("node-agent")  # type: ignore[union-attr]
        cpu0, node_cpu0 = cpu_seconds(pid), cpu_seconds(node_pid)
        reconciles0 = cost.operator_metrics(bench.metrics_port).get("agentrun_reconciles_total", 0.0)
        with profiled(pid, args.profile):
            batch = throughput.batch(bench, "runs", ns, args.n, timeout=1200)
        cpu = (cpu_seconds(pid) - cpu0) / args.n * 1000
        node_cpu = (cpu_seconds(node_pid) - node_cpu0) / args.n * 1000
        reconciles = cost.operator_metrics(bench.metrics_port).get("agentrun_reconciles_total", 0.0)
        foreign = foreign_cost(bench, args.foreign) if args.foreign else None
        out = {
            "n": args.n,
            "load1": load1(),
            "requests_per_run": round(sum(batch.requests.values()) / args.n, 2),
            "operator_cpu_ms_per_run": round(cpu, 1),
            "node_agent_cpu_ms_per_run": round(node_cpu, 1),  # the kubelet's stand-in and the workers
            "reconciles_per_run": round((reconciles - reconciles0) / args.n, 2),
            "operator_cpu_ms_per_foreign_pod_and_lease": None if foreign is None else round(foreign, 2),
            "by_verb_resource": {
                f"{v} {r}": round(c / args.n, 2) for (v, r), c in batch.requests.most_common()
            },
        }
        if args.footprint > args.n:
            template = bench.kube.custom.get_namespaced_custom_object(
                "agentrun.dev", "v1alpha1", ns, "runs", "w0"
            )
            bench.operator.stop()
            cost.finished_runs(bench, bench.namespace("finished"), args.footprint - args.n, template)
            out["footprint"] = cost.footprint(bench, args.footprint)
        log(json.dumps(out, indent=1))
    finally:
        bench.stop()


if __name__ == "__main__":
    main()
