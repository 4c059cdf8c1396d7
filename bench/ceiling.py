"""Ceiling: how many simple writes per second the API server takes on this machine.

ConfigMaps (a few bytes of data) are created, then each is updated once (a merge patch), by `processes`
client processes with `threads` requests in flight each, on the same machine (the clients' CPU competes
with the API server's and etcd's, as the operator's does). Reported per phase: requests per second and the
CPU of the API server, etcd and the clients.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import time
from typing import Any

from harness import Bench, cpu_seconds, log

from agentrun.kubeapi import KubeApi, load_configuration


def _client(job: dict[str, Any], go: Any, report: Any) -> None:
    kubeconfig, ns, threads, phase = job["kubeconfig"], job["ns"], job["threads"], job["phase"]
    start, count = job["start"], job["count"]
    api = KubeApi(load_configuration(kubeconfig), threads=threads)
    path = api.core_path("configmaps", ns)

    async def one(i: int, gate: asyncio.Semaphore) -> None:
        async with gate:
            if phase == "create":
                await api.create(path, {"metadata": {"name": f"cm{i}"}, "data": {"k": "v"}})
            else:
                await api.merge_patch(f"{path}/cm{i}", {"data": {"k": "updated"}})

    async def run() -> None:
        gate = asyncio.Semaphore(threads)
        await asyncio.gather(*(one(i, gate) for i in range(start, start + count)))

    go.wait()
    cpu = time.process_time()
    try:
        asyncio.run(run())
    finally:
        api.close()
    report.put(time.process_time() - cpu)


def ceiling(bench: Bench, ns: str, n: int, processes: int = 2, threads: int = 16) -> dict[str, Any]:
    context = multiprocessing.get_context("spawn")
    share = n // processes
    pids = {"kube-apiserver": bench.pid("kube-apiserver"), "etcd": bench.pid("etcd")}
    result: dict[str, Any] = {"objects": share * processes, "processes": processes, "threads": threads}
    for phase in ("create", "update"):
        go, report = context.Event(), context.Queue()
        workers = [
            context.Process(
                target=_client,
                args=(
                    {
                        "kubeconfig": str(bench.cluster.kubeconfig),
                        "ns": ns,
                        "start": p * share,
                        "count": share,
                        "threads": threads,
                        "phase": phase,
                    },
                    go,
                    report,
                ),
            )
            for p in range(processes)
        ]
        for w in workers:
            w.start()
        time.sleep(3.0)  # the clients' interpreter start-up and imports are not part of the measure
        cpu0 = {k: cpu_seconds(pid) for k, pid in pids.items()}
        began = time.monotonic()
        go.set()
        client_cpu = sum(report.get(timeout=300) for _ in workers)
        elapsed = time.monotonic() - began
        for w in workers:
            w.join()
        cpu = {k: round((cpu_seconds(pid) - cpu0[k]) / elapsed * 100) for k, pid in pids.items()}
        cpu["clients"] = round(client_cpu / elapsed * 100)
        result[phase] = {
            "per_second": round(share * processes / elapsed),
            "seconds": round(elapsed, 2),
            "cpu_percent_of_one_core": cpu,
        }
        log(f"ceiling {phase}: {result[phase]}")
    return result
