"""`make bench`: every agentrun benchmark on local control planes, written to bench/REPORT.md.

    PYTHONPATH=hack:tests .venv/bin/python bench/run_all.py [--n 1000] [--quick]

One control plane with the node agent in instant mode (hack/devcluster/nodeagent/instant.py) carries the
throughput comparison with the Job controller, the latencies that need no real process, the cost figures
and the API server's ceiling; a second one, with a process per Pod, the latencies that need a real worker
process (a kill, a freeze). The figures go to bench/REPORT.md (with bench/findings.md appended) and, raw,
to bench/results.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ceiling
import cost
import holds
import latency
import processes
import report
import request_cost
import sdk_cost
import throughput
from harness import Bench, cpu_seconds, load1, log, machine, versions

HERE = Path(__file__).resolve().parent
BEGAN = time.monotonic()


class LoadSampler(threading.Thread):
    """The machine's 1-min load every 5 s: other engineers share it, and the report says how much."""

    def __init__(self) -> None:
        super().__init__(daemon=True, name="load sampler")
        self.samples: list[tuple[float, float]] = []

    def run(self) -> None:
        while True:
            self.samples.append((time.monotonic() - BEGAN, load1()))
            time.sleep(5)


@contextlib.contextmanager
def section(results: dict[str, Any], name: str) -> Iterator[None]:
    """Records when a section ran (seconds since the start), for the load table of the report."""
    start = time.monotonic() - BEGAN
    try:
        yield
    finally:
        results.setdefault("sections", []).append([name, start, time.monotonic() - BEGAN])


def component_pids(bench: Bench) -> dict[str, int]:
    pids = {c.name: c.pid for c in bench.cluster.components}
    pids["operator"] = bench.operator.process.pid  # type: ignore[union-attr]
    return pids


def instant_suite(args: argparse.Namespace, state: Path, results: dict[str, Any]) -> None:
    bench = Bench(state / "instant", instant=True)
    began = time.monotonic()
    try:
        bench.start()
        log(f"instant control plane and operator ready in {time.monotonic() - began:.1f}s")
        runs_existing = 0

        batches: list[dict[str, Any]] = []
        for rep in range(args.reps):
            order = ("runs", "jobs") if rep % 2 == 0 else ("jobs", "runs")
            for kind in order:
                ns = bench.namespace(f"tp-{kind}-{rep}")
                pids = component_pids(bench)
                cpu0 = {k: cpu_seconds(p) for k, p in pids.items()}
                load = load1()
                with section(results, f"throughput: {kind}"):
                    batch = throughput.batch(bench, kind, ns, args.n, timeout=1200)
                cpu = {k: round((cpu_seconds(p) - cpu0[k]) / args.n * 1000, 1) for k, p in pids.items()}
                batches.append(
                    batch.summary()
                    | {
                        "rep": rep,
                        "load1_at_start": load,
                        "cpu_ms_per_item": cpu,
                        "requests_by_kind": {f"{v} {r}": n for (v, r), n in batch.requests.most_common()},
                    }
                )
                if kind == "runs":
                    runs_existing += args.n
        results["throughput"] = batches
        template = bench.kube.custom.get_namespaced_custom_object(
            "agentrun.dev", "v1alpha1", "tp-runs-0", "runs", "w0"
        )

        with section(results, f"footprint: {runs_existing} Runs"):
            results["footprint"] = [cost.footprint(bench, runs_existing)]

        with section(results, "latency: lifecycle"):
            results["lifecycle"] = latency.lifecycle(
                bench, bench.namespace("latency"), args.latency_runs, args.latency_rate
            )
        runs_existing += 2 * args.latency_runs
        with section(results, "latency: cancel"):
            results["cancel"] = latency.cancel(bench, bench.namespace("cancel"), args.latency_runs, 10.0)
        runs_existing += args.latency_runs

        ceilings = []
        for rep in range(3):
            ns = f"ceiling-{rep}"
            bench.kube.core.create_namespace({"metadata": {"name": ns}})
            with section(results, f"ceiling {rep}"):
                ceilings.append(ceiling.ceiling(bench, ns, args.ceiling_objects))
        results["ceiling"] = ceilings

        bulk = max(0, args.many - runs_existing)
        bench.operator.stop()
        log(f"creating {bulk} finished Runs (operator stopped)")
        seconds = cost.finished_runs(bench, bench.namespace("finished"), bulk, template)
        runs_existing += bulk
        results["bulk"] = {"runs": bulk, "seconds": round(seconds, 1)}
        with section(results, f"footprint: {runs_existing} Runs"):
            results["footprint"].append(cost.footprint(bench, runs_existing))

        with section(results, "lease load"):
            results["lease_load"] = cost.lease_load(bench, bench.namespace("leases"), args.lease_attempts)
        results["instant_logs"] = str(state / "instant")
    finally:
        bench.stop()


UNTHROTTLED = ["--kube-api-qps=200", "--kube-api-burst=300"]


def unthrottled_jobs_suite(args: argparse.Namespace, state: Path, results: dict[str, Any]) -> None:
    """The Jobs batch again, on a control plane whose kube-controller-manager may send 200 requests/s
    (its default client rate limit is 20/s, burst 30)."""
    bench = Bench(state / "unthrottled", instant=True, controller_manager_flags=UNTHROTTLED)
    try:
        bench.start()
        pids = component_pids(bench)
        cpu0 = {k: cpu_seconds(p) for k, p in pids.items()}
        load = load1()
        with section(results, "throughput: jobs, unthrottled"):
            batch = throughput.batch(bench, "jobs", bench.namespace("tp-jobs"), args.n, timeout=1200)
        cpu = {k: round((cpu_seconds(p) - cpu0[k]) / args.n * 1000, 1) for k, p in pids.items()}
        results["jobs_unthrottled"] = batch.summary() | {
            "flags": " ".join(UNTHROTTLED),
            "load1_at_start": load,
            "cpu_ms_per_item": cpu,
        }
        with section(results, "kube-apiserver CPU per request"):
            n = args.request_cost_n
            results["request_cost"] = {"n": n, "ms_per_request": request_cost.measure_all(bench, n)}
    finally:
        bench.stop()


def process_suite(args: argparse.Namespace, state: Path, results: dict[str, Any]) -> None:
    bench = Bench(state / "processes", instant=False)
    try:
        bench.start()
        with section(results, "real processes"):
            results["process_echo"] = processes.echo(bench, bench.namespace("echo"), args.process_runs)
            results["replacement"] = processes.replacement(
                bench, bench.namespace("replace"), args.process_workers
            )
        with section(results, "hold window"):
            results["holds"] = holds.measure(bench, args.hold_runs)
        with section(results, "SDK requests"):
            results["sdk_requests"] = sdk_cost.measure(bench, state / "processes")
    finally:
        bench.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--n", type=int, default=1000, help="work items per throughput batch (1000)")
    parser.add_argument(
        "--reps", type=int, default=1, help="throughput repetitions (1; ~8 min each at n=1000)"
    )
    parser.add_argument("--latency-runs", type=int, default=200, help="samples per latency (200)")
    parser.add_argument("--latency-rate", type=float, default=5.0, help="Runs created per second (5)")
    parser.add_argument("--many", type=int, default=10000, help="Runs existing for the second footprint")
    parser.add_argument("--lease-attempts", type=int, default=300, help="running attempts for the lease load")
    parser.add_argument("--ceiling-objects", type=int, default=3000)
    parser.add_argument("--request-cost-n", type=int, default=400, help="requests of each kind (400)")
    parser.add_argument("--process-runs", type=int, default=15)
    parser.add_argument("--process-workers", type=int, default=8, help="killed and as many frozen")
    parser.add_argument("--hold-runs", type=int, default=20, help="Runs answered in their hold, and after")
    parser.add_argument("--quick", action="store_true", help="small counts everywhere (a smoke test)")
    parser.add_argument("--out", type=Path, default=HERE / "REPORT.md")
    args = parser.parse_args()
    if args.quick:
        args.n, args.latency_runs, args.many, args.lease_attempts = 100, 40, 1000, 50
        args.ceiling_objects, args.process_runs, args.process_workers, args.hold_runs = 1000, 4, 2, 4
        args.request_cost_n = 100
    results: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": machine(),
        "versions": versions(),
        "load1_at_start": load1(),
        "args": {k: str(v) for k, v in vars(args).items()},
    }
    log(f"load {results['load1_at_start']}; machine {results['machine']}")
    began = time.monotonic()
    sampler = LoadSampler()
    sampler.start()
    with tempfile.TemporaryDirectory(prefix="agentrun-bench-") as tmp:
        state = Path(tmp)
        instant_suite(args, state, results)
        unthrottled_jobs_suite(args, state, results)
        process_suite(args, state, results)
    results["load1_at_end"] = load1()
    results["load_samples"] = sampler.samples
    results["total_seconds"] = round(time.monotonic() - began)
    (HERE / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    args.out.write_text(report.render(results, (HERE / "findings.md").read_text()))
    log(f"done in {results['total_seconds']}s: {args.out}")


if __name__ == "__main__":
    main()
