"""What one create costs on the local control plane, by shape of object: the floor under a LangGraph
superstep's two Checkpoint creates (bench/langgraph_state.py says where a superstep's time goes).

    PYTHONPATH=hack:tests .venv/bin/python bench/checkpoint_create_cost.py --n 150

On its own control plane (CRDs installed, no admission policies, as bench/langgraph_state.py runs):
a State Checkpoint shaped as the saver writes it, the same without labels, without the owner
reference, a ConfigMap holding the same content (no custom-resource handling), two Checkpoints sent at
once, and a GET of the Run (the round trip alone). Per shape the median seconds of a request as the
client sees it, in `--rounds` rounds of `--n` requests; then the API server's own mean duration by
verb and resource (apiserver_request_duration_seconds), etcd's for creates, and the client's CPU per
request. Nothing is asserted: this measures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import time
from collections.abc import Callable
from typing import Any

from harness import scratch_cluster

from agentrun.examples.manifests import agent_run
from agentrun.kubeapi import KubeApi, load_configuration

NAMESPACE = "create-cost"
RUN = "r1"
JsonDict = dict[str, Any]


def state_body(i: int, uid: str, *, labels: bool = True, owner: bool = True) -> JsonDict:
    """A State Checkpoint as AgentrunSaver writes it with a state store (outside an Attempt)."""
    name = f"{RUN}-0123456789-1f0c{i:04d}-aaaa-6bbb-8ccc-0123456789ab"
    metadata: JsonDict = {"name": name, "namespace": NAMESPACE}
    if labels:
        metadata["labels"] = {
            "agentrun.dev/run": RUN,
            "agentrun.dev/checkpoint-kind": "State",
            "agentrun.dev/thread": "0123456789",
            "agentrun.dev/thread-ns": "abcdef0123",
        }
    if owner:
        metadata["ownerReferences"] = [
            {
                "apiVersion": "agentrun.dev/v1alpha1",
                "kind": "Run",
                "name": RUN,
                "uid": uid,
                "blockOwnerDeletion": True,
            }
        ]
    digest = "a" * 64
    spec = {
        "runName": RUN,
        "id": name,
        "sequence": i + 1,
        "attempt": f"{RUN}-a0",
        "leaseEpoch": 0,
        "step": "langgraph:loop:5",
        "kind": "State",
        "thread": {"id": RUN, "ns": ""},
        "state": {"checkpointId": f"1f0c-{i}", "parentCheckpointId": f"1f0c-{i - 1}"},
        "parent": name + "p",
        "stateRef": {
            "key": f"{NAMESPACE}/{uid}/sha256/{digest}",
            "sha256": digest,
            "size": 1234,
            "links": True,
        },
    }
    return {"apiVersion": "agentrun.dev/v1alpha1", "kind": "Checkpoint", "metadata": metadata, "spec": spec}


def configmap_body(i: int, uid: str) -> JsonDict:
    body = state_body(i, uid)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": body["metadata"],
        "data": {"spec": json.dumps(body["spec"])},
    }


async def server_means(api: KubeApi) -> dict[tuple[str, str], list[float]]:
    """Sums and counts of the API server's request durations (POST by resource, GET of runs) and etcd's
    creates."""
    text = (await api.read_text("/metrics")).decode()
    found: dict[tuple[str, str], list[float]] = {}
    for line in text.splitlines():
        family = line.split("{", 1)[0]
        if family in ("apiserver_request_duration_seconds_sum", "apiserver_request_duration_seconds_count"):
            verb = re.search(r'verb="([^"]*)"', line)
            resource = re.search(r'resource="([^"]*)"', line)
            if verb is None or resource is None:
                continue
            if verb[1] != "POST" and not (verb[1] == "GET" and resource[1] == "runs"):
                continue
            key = (verb[1], resource[1])
        elif family in ("etcd_request_duration_seconds_sum", "etcd_request_duration_seconds_count"):
            if 'operation="create"' not in line:
                continue
            key = ("etcd", "create")
        else:
            continue
        entry = found.setdefault(key, [0.0, 0.0])
        entry[0 if family.endswith("_sum") else 1] += float(line.rsplit(" ", 1)[1])
    return found


async def median_ms(api: KubeApi, path: str, bodies: list[JsonDict], at_once: int = 1) -> float:
    took = []
    for k in range(0, len(bodies), at_once):
        started = time.perf_counter()
        await asyncio.gather(*(api.create(path, b) for b in bodies[k : k + at_once]))
        took.append(time.perf_counter() - started)
    return round(statistics.median(took) * 1000, 2)


async def measure(api: KubeApi, uid: str, n: int, rounds: int) -> dict[str, Any]:
    checkpoints = api.custom_path("checkpoints", NAMESPACE)
    configmaps = api.core_path("configmaps", NAMESPACE)
    shapes: list[tuple[str, str, Callable[[int], JsonDict], int]] = [
        ("Checkpoint as the saver writes it", checkpoints, lambda i: state_body(i, uid), 1),
        ("Checkpoint without labels", checkpoints, lambda i: state_body(i, uid, labels=False), 1),
        ("Checkpoint without owner reference", checkpoints, lambda i: state_body(i, uid, owner=False), 1),
        ("ConfigMap of the same content", configmaps, lambda i: configmap_body(i, uid), 1),
        ("two Checkpoints at once (per pair)", checkpoints, lambda i: state_body(i, uid), 2),
    ]
    await median_ms(api, checkpoints, [state_body(90_000 + i, uid) for i in range(20)])  # warm up
    out: dict[str, Any] = {}
    before, cpu, sent = await server_means(api), time.process_time(), 0
    offset = 0
    for _ in range(rounds):
        for label, path, make, at_once in shapes:
            bodies = [make(offset + i) for i in range(n)]
            offset += n
            sent += n
            out.setdefault(label, []).append(await median_ms(api, path, bodies, at_once))
        took = []
        for _ in range(n):
            started = time.perf_counter()
            await api.get(api.custom_path("runs", NAMESPACE, RUN))
            took.append(time.perf_counter() - started)
        sent += n
        out.setdefault("GET of the Run", []).append(round(statistics.median(took) * 1000, 2))
    out["client CPU per request (ms)"] = round((time.process_time() - cpu) / sent * 1000, 3)
    after = await server_means(api)
    out["server side, mean ms"] = {
        f"{verb} {resource}": round((s - before.get((verb, resource), [0.0, 0.0])[0]) / count * 1000, 2)
        for (verb, resource), (s, c) in after.items()
        if (count := c - before.get((verb, resource), [0.0, 0.0])[1]) > 0
    }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=150, help="requests per shape and round")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with scratch_cluster("agentrun-create-cost-", NAMESPACE) as (cluster, kube):
        run = kube.custom.create_namespaced_custom_object(
            "agentrun.dev", "v1alpha1", NAMESPACE, "runs", agent_run(RUN, "echo", {})
        )
        api = KubeApi(load_configuration(str(cluster.kubeconfig)))

        async def go() -> dict[str, Any]:
            try:
                return await measure(api, run["metadata"]["uid"], args.n, args.rounds)
            finally:
                await api.aclose()

        print(json.dumps(asyncio.run(go()), indent=1))


if __name__ == "__main__":
    main()
