"""Measures the local control plane: time to healthy, and Pod bound → process started.

    PYTHONPATH=hack:tests .venv/bin/python bench/devcluster_startup.py [--pods 30]

Bind time is when a watch first shows the Pod with spec.nodeName; start time is the wall clock the Pod's
process reads as its first statement (same machine, same clock).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import threading
import time
from pathlib import Path

from kubernetes import watch

from devcluster.cluster import LocalCluster
from support.kube import Kube, wait_for


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pods", type=int, default=30)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="agentrun-bench-") as state:
        cluster = LocalCluster(state_dir=Path(state))
        began = time.monotonic()
        cluster.start()
        print(f"control plane healthy, node Ready: {time.monotonic() - began:.2f}s")
        try:
            kube = Kube(cluster.kubeconfig, Path(cluster.binary("kubectl")))
            wait_for(lambda: kube.core.list_namespaced_service_account("default").items, what="default SA")
            bound: dict[str, float] = {}
            stop = threading.Event()

            def observe() -> None:
                # ends with the cluster (the stream breaks); only bind times seen before then matter
                with contextlib.suppress(Exception):
                    watch_binds()

            def watch_binds() -> None:
                for event in watch.Watch().stream(
                    kube.core.list_namespaced_pod, "default", timeout_seconds=120
                ):
                    pod = event["object"]
                    if pod.spec.node_name and pod.metadata.name not in bound:
                        bound[pod.metadata.name] = time.time()
                    if stop.is_set():
                        return

            threading.Thread(target=observe, daemon=True).start()
            time.sleep(0.5)
            script = (
                "import os,time; open(os.environ['TERMINATION_MESSAGE_PATH'],'w').write(repr(time.time()))"
            )
            for i in range(args.pods):
                kube.core.create_namespaced_pod(
                    "default",
                    {
                        "metadata": {"name": f"p{i}"},
                        "spec": {
                            "restartPolicy": "Never",
                            "containers": [
                                {"name": "c", "image": "none", "command": ["python", "-c", script]}
                            ],
                        },
                    },
                )
                time.sleep(0.2)
            delays = []
            for i in range(args.pods):
                pod = kube.wait_pod_phase(f"p{i}", "default", ("Succeeded", "Failed"))
                started = float(pod["status"]["containerStatuses"][0]["state"]["terminated"]["message"])
                delays.append(started - bound[f"p{i}"])
            stop.set()
            delays.sort()
            print(
                f"pod bound -> process running (python interpreter start included), n={len(delays)}: "
                f"p50 {statistics.median(delays) * 1000:.0f} ms, "
                f"p95 {delays[int(len(delays) * 0.95) - 1] * 1000:.0f} ms, max {delays[-1] * 1000:.0f} ms"
            )
        except Exception:
            print((Path(state) / "logs" / "node-agent.log").read_text()[-3000:])
            print(kube.kubectl("get", "pods,events", "-o", "wide", namespace="default").stdout)
            print(kube.kubectl("get", "node", "-o", "yaml").stdout)
            raise
        finally:
            cluster.stop()


if __name__ == "__main__":
    main()
