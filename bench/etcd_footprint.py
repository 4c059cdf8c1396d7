"""etcd after finished Runs (issue 27): etcd's `etcd_mvcc_db_total_size_in_use_in_bytes`, read after an
etcd compaction at the current revision and a defragmentation, as N echo Runs finish, in chunks, once with
`spec.ttlSecondsAfterFinished: 0` (each archived to the object store, verified, then deleted) and once
without (each kept, compacted: its Lease deleted, its index in the store, its managedFields cleared).

    PYTHONPATH=hack:tests:bench .venv/bin/python bench/etcd_footprint.py [--n 2000] [--chunk 500]
        [--scenarios ttl0,kept]          # bench/etcd_footprint.json, a Markdown table

One instant-mode control plane (bench/REPORT.md, intro) with its versitygw; the operator is told the store.
A chunk is created 16 at a time, then waited for from watch events (no polling requests): with TTL 0 until
every Run of it was deleted, without until every Run and its Attempt has Succeeded and carries no
managedFields (the last write of compaction). Then etcd is compacted and defragmented over its JSON
gateway (`/v3/kv/compaction`, `/v3/maintenance/defragment`) and the metric read from its `/metrics`. The
scenarios run one after the other on the same etcd, each in its own namespace. Per scenario: the
operator's CPU per Run (user + system, /proc) and the API requests per Run (the API server's own
counters, all clients, WATCH not counted: the creates, the operator, the in-process workers, the node
agent), over all its chunks. Events (an hour's TTL in etcd) are counted in the namespace at each point:
they are part of what etcd holds meanwhile; at the end of a scenario its Events are deleted and etcd
measured once more (`withoutEvents`): what the Runs themselves leave.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from harness import (
    Bench,
    JsonDict,
    Recorder,
    by_verb_resource,
    cpu_seconds,
    create_all,
    load1,
    log,
    request_delta,
    runs_path,
    wait_until,
)

from agentrun.api import GROUP, VERSION
from agentrun.examples.manifests import agent_run

HERE = Path(__file__).resolve().parent
METRIC = "etcd_mvcc_db_total_size_in_use_in_bytes"


def etcd_url(bench: Bench) -> str:
    etcd = next(c for c in bench.cluster.components if c.name == "etcd")
    return etcd.health_url.removesuffix("/health")


def etcd_post(url: str, path: str, body: JsonDict) -> JsonDict:
    request = urllib.request.Request(
        url + path, json.dumps(body).encode(), {"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=300) as response:
        answer: JsonDict = json.loads(response.read())
        return answer


def compact_and_defragment(url: str) -> int:
    """etcd compacted at its current revision (physically), then defragmented; returns the revision."""
    revision = etcd_post(url, "/v3/kv/range", {"key": base64.b64encode(b"/").decode(), "limit": 1})
    current = int(revision["header"]["revision"])
    try:
        etcd_post(url, "/v3/kv/compaction", {"revision": str(current), "physical": True})
    except urllib.error.HTTPError as exc:  # compacted already at that revision (the API server's own pass)
        if b"compacted" not in exc.read():
            raise
    etcd_post(url, "/v3/maintenance/defragment", {})
    return current


def etcd_metric(url: str, name: str) -> float | None:
    with urllib.request.urlopen(url + "/metrics", timeout=30) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
    return None


def _int(value: float | None) -> int | None:
    return None if value is None else int(value)


def etcd_point(bench: Bench, url: str, ns: str, runs: int) -> JsonDict:
    revision = compact_and_defragment(url)
    events = bench.kube.core.list_namespaced_event(ns, limit=1)
    left = bench.kube.custom.list_namespaced_custom_object(GROUP, VERSION, ns, "runs", limit=1)
    point = {
        "runs": runs,
        "dbInUseBytes": _int(etcd_metric(url, METRIC)),
        "dbSizeBytes": _int(etcd_metric(url, "etcd_mvcc_db_total_size_in_bytes")),
        "keys": _int(etcd_metric(url, "etcd_debugging_mvcc_keys_total")),
        "revision": revision,
        "runsLeft": len(left["items"]) + int(left["metadata"].get("remainingItemCount") or 0),
        "eventsLeft": len(events.items) + int(events.metadata.remaining_item_count or 0),
    }
    log(f"{ns}: {point}")
    return point


def _deleted(kind: str, obj: JsonDict) -> tuple[str, str] | None:
    return (obj["metadata"]["name"], "deleted") if kind == "DELETED" else None


def _at_rest(kind: str, obj: JsonDict) -> tuple[str, str]:
    """(name, "rest") once the object Succeeded and carries no managedFields; else (name, "moving")."""
    done = (obj.get("status") or {}).get("phase") == "Succeeded" and not obj["metadata"].get("managedFields")
    return obj["metadata"]["name"], "rest" if done else "moving"


def latest(recorder: Recorder) -> dict[str, str]:
    states: dict[str, str] = {}
    for _, (name, state) in recorder.snapshot():
        states[name] = state
    return states


def scenario(bench: Bench, name: str, n: int, chunk: int, timeout: float) -> JsonDict:
    ns = bench.namespace(f"etcd-{name}")
    url = etcd_url(bench)
    spec: dict[str, Any] = {"ttlSecondsAfterFinished": 0} if name == "ttl0" else {}
    if name == "ttl0":
        watches = [bench.recorder(runs_path(ns), _deleted)]
    else:
        attempts = f"/apis/{GROUP}/{VERSION}/namespaces/{ns}/attempts"
        watches = [bench.recorder(runs_path(ns), _at_rest), bench.recorder(attempts, _at_rest)]
    points = [etcd_point(bench, url, ns, 0)]
    pid = bench.operator.process.pid  # type: ignore[union-attr]
    cpu0, requests0, began = cpu_seconds(pid), bench.requests(), time.monotonic()
    busy = 0.0  # seconds from a chunk's first create to its last Run settled (etcd's passes left out)
    for start in range(0, n, chunk):
        names = [f"e{i}" for i in range(start, min(n, start + chunk))]
        bodies = [agent_run(r, "echo", {"item": r}, **spec) for r in names]
        chunk_began = time.monotonic()
        api = bench.api()
        try:
            asyncio.run(create_all(api, runs_path(ns), bodies))
        finally:
            api.close()

        def settled(names: list[str] = names) -> bool:
            wanted = "deleted" if name == "ttl0" else "rest"
            views = [latest(w) for w in watches]
            if name == "ttl0":
                return all(views[0].get(r) == wanted for r in names)
            return all(views[0].get(r) == wanted and views[1].get(f"{r}-a1") == wanted for r in names)

        wait_until(settled, timeout, f"{len(names)} Runs of {name} settled", interval=0.5)
        busy += time.monotonic() - chunk_began
        points.append(etcd_point(bench, url, ns, start + len(names)))
    cpu = cpu_seconds(pid) - cpu0
    requests = by_verb_resource(request_delta(bench.requests(), requests0))
    for w in watches:
        w.stop()
    # The Events of the scenario (an hour's TTL in etcd) deleted: what agentrun's own objects leave.
    bench.kube.core.delete_collection_namespaced_event(ns)
    without_events = etcd_point(bench, url, ns, n)
    top = sorted(requests.items(), key=lambda kv: -kv[1])[:12]
    return {
        "scenario": name,
        "n": n,
        "chunk": chunk,
        "seconds": round(time.monotonic() - began, 1),
        "busySeconds": round(busy, 1),
        "points": points,
        "withoutEvents": without_events,
        "operatorCpuMsPerRun": round(cpu / n * 1000, 1),
        "apiRequestsPerRun": round(sum(requests.values()) / n, 2),
        "apiRequestsPerRunByVerb": {f"{verb} {resource}": round(c / n, 2) for (verb, resource), c in top},
        "load1AtEnd": load1(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=2000, help="Runs per scenario")
    parser.add_argument("--chunk", type=int, default=500, help="Runs per point of the curve")
    parser.add_argument("--scenarios", default="ttl0,kept")
    parser.add_argument("--timeout", type=float, default=900, help="seconds a chunk may take")
    parser.add_argument("--out", type=Path, default=HERE / "etcd_footprint.json")
    args = parser.parse_args()

    bench = Bench(Path(tempfile.mkdtemp(prefix="agentrun-etcd-")), instant=True, store=True)
    results: list[JsonDict] = []
    try:
        bench.start()
        for name in args.scenarios.split(","):
            results.append(scenario(bench, name, args.n, args.chunk, args.timeout))
            args.out.write_text(json.dumps(results, indent=2) + "\n")
    finally:
        bench.stop()
    print(json.dumps(results, indent=2))
    print("\n| scenario | Runs | etcd in use (MiB) | keys | Runs left | Events left |")
    print("|---|---|---|---|---|---|")
    for result in results:
        for p in result["points"]:
            mib = (p["dbInUseBytes"] or 0) / 2**20
            print(
                f"| {result['scenario']} | {p['runs']} | {mib:.2f} | {p['keys']} | {p['runsLeft']} "
                f"| {p['eventsLeft']} |"
            )
    for result in results:
        p = result["withoutEvents"]
        mib = (p["dbInUseBytes"] or 0) / 2**20
        print(
            f"| {result['scenario']}, its Events deleted | {p['runs']} | {mib:.2f} "
            f"| {p['keys']} | {p['runsLeft']} | {p['eventsLeft']} |"
        )
    for result in results:
        print(
            f"\n{result['scenario']}: operator CPU {result['operatorCpuMsPerRun']} ms/Run, "
            f"API requests {result['apiRequestsPerRun']}/Run: {result['apiRequestsPerRunByVerb']}"
        )


if __name__ == "__main__":
    main()
