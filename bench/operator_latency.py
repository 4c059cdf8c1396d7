"""Measures the operator on an idle local control plane: Run applied -> attempt Pod created, and
Run applied -> Run Succeeded for the echo agent (a Run succeeds when its result commit is seen).

    PYTHONPATH=hack:tests .venv/bin/python bench/operator_latency.py [--runs 50]

Times are taken by this process from watch events (one clock), so they include watch delivery.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path

from kubernetes import watch

from agentrun.rbac import AGENT_ACCOUNT_PATCH, attempt_role
from devcluster import security
from devcluster.cluster import LocalCluster
from devcluster.operator import OperatorProcess
from support.agentrun import install_crds
from support.kube import Kube, wait_for

NS = "bench"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=50)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="agentrun-bench-") as state:
        cluster = LocalCluster(state_dir=Path(state))
        cluster.start()
        operator_kubeconfig = security.install(
            cluster.binary("kubectl"), cluster.kubeconfig, Path(state) / "operator.kubeconfig"
        )
        operator = OperatorProcess(
            operator_kubeconfig, Path(state) / "operator.log", env=security.OPERATOR_ENV
        )
        try:
            kube = Kube(cluster.kubeconfig, Path(cluster.binary("kubectl")))
            install_crds(kube)
            kube.core.create_namespace({"metadata": {"name": NS}})
            wait_for(lambda: kube.core.list_namespaced_service_account(NS).items, what="default SA")
            kube.core.patch_namespaced_service_account("default", NS, AGENT_ACCOUNT_PATCH)
            kube.rbac.create_namespaced_role(NS, attempt_role(NS))
            kube.rbac.create_namespaced_role_binding(
                NS,
                {
                    "metadata": {"name": "agentrun-attempt"},
                    "roleRef": {
                        "apiGroup": "rbac.authorization.k8s.io",
                        "kind": "Role",
                        "name": "agentrun-attempt",
                    },
                    "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": NS}],
                },
            )
            operator.start()
            operator.wait_ready()
            pod_created: dict[str, float] = {}
            run_done: dict[str, float] = {}

            def watch_pods() -> None:
                for event in watch.Watch().stream(kube.core.list_namespaced_pod, NS, timeout_seconds=600):
                    pod = event["object"]
                    run = (pod.metadata.labels or {}).get("agentrun.dev/run")
                    if run and event["type"] == "ADDED":
                        pod_created.setdefault(run, time.monotonic())

            def watch_runs() -> None:
                stream = watch.Watch().stream(
                    kube.custom.list_namespaced_custom_object,
                    "agentrun.dev",
                    "v1alpha1",
                    NS,
                    "runs",
                    timeout_seconds=600,
                )
                for event in stream:
                    run = event["object"]
                    if (run.get("status") or {}).get("phase") == "Succeeded":
                        run_done.setdefault(run["metadata"]["name"], time.monotonic())

            for target in (watch_pods, watch_runs):
                threading.Thread(target=target, daemon=True).start()
            time.sleep(1.0)
            applied: dict[str, float] = {}
            for i in range(args.runs):
                name = f"r{i}"
                body = {
                    "apiVersion": "agentrun.dev/v1alpha1",
                    "kind": "Run",
                    "metadata": {"name": name},
                    "spec": {"agent": {"image": "x", "command": ["python", "-m", "agentrun.examples.echo"]}},
                }
                kube.custom.create_namespaced_custom_object("agentrun.dev", "v1alpha1", NS, "runs", body)
                applied[name] = time.monotonic()
                time.sleep(0.5)  # one at a time: latency on an idle control plane, not throughput
            wait_for(lambda: len(run_done) == args.runs, timeout=300, what="all runs Succeeded")
            to_pod = [pod_created[n] - applied[n] for n in applied]
            to_done = [run_done[n] - applied[n] for n in applied]
            for label, values in (
                ("Run applied -> attempt Pod created", to_pod),
                ("Run applied -> Run Succeeded (agent start and commit included)", to_done),
            ):
                print(
                    f"{label}: n={len(values)} p50 {statistics.median(values) * 1000:.0f} ms, "
                    f"p99 {percentile(values, 0.99) * 1000:.0f} ms, max {max(values) * 1000:.0f} ms"
                )
        finally:
            operator.stop()
            cluster.stop()


if __name__ == "__main__":
    main()
