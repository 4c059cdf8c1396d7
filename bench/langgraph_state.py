"""What a LangGraph superstep costs with AgentrunSaver and the state store, early and late in a thread.

    PYTHONPATH=hack:tests .venv/bin/python bench/langgraph_state.py            # its own control plane
    PYTHONPATH=hack:tests .venv/bin/python bench/langgraph_state.py --calls 52 --output-bytes 40000

A ReAct-style graph (tests/support/langgraph_react.py: a model node asks for one tool call at a time, the
tool answers with --output-bytes characters, `messages: Annotated[list, operator.add]`, and the same with
a DeltaChannel) runs through AgentrunSaver on the local control plane's API server and object store
(versitygw), outside an Attempt (no Run status write: that one is the same small patch per superstep
whatever the thread). Per superstep (superstep s = the pending writes made from checkpoint s-1, then
checkpoint s), from what was stored:
- etcd: the JSON size of the Checkpoint objects the superstep created, as the API server returns them
  (managed fields included): the State checkpoint and the Writes of its tasks;
- store: bytes the saver's puts created in the object store (its observer), against the superstep's new
  data (the serialized new messages);
- the time spent in the saver's put and put_writes.
Medians over supersteps 8-12 (early) and 98-102 (late). Nothing is asserted: the tests assert the
structure (tests/integration/test_langgraph_state_store.py); this measures it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Sequence
from typing import Any

from harness import scratch_cluster
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import ChannelVersions, CheckpointMetadata
from langgraph.checkpoint.base import Checkpoint as LangGraphCheckpoint

from agentrun.examples.manifests import agent_run
from agentrun.integrations.langgraph import AgentrunSaver
from agentrun.integrations.langgraph.serde import AllowListSerializer
from agentrun.kubeapi import KubeApi, load_configuration
from agentrun.statestore import BlobStore, StoreRequest
from devcluster.cluster import LocalCluster
from support.kube import Kube
from support.langgraph_react import build, task

GROUP, VERSION = "agentrun.dev", "v1alpha1"
NAMESPACE = "bench"
EARLY, LATE = range(8, 13), range(98, 103)
WIDE = range(8, 48)  # 5 supersteps are few on a shared machine: medians over 40 as well


class Requests(list[StoreRequest]):
    """The store's requests, as its observer reports them."""

    def __call__(self, request: StoreRequest) -> None:
        self.append(request)


class TimedApi(KubeApi):
    """KubeApi that adds up the seconds its creates took, by kind of Checkpoint (the saver's only writes
    outside an Attempt)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.create_seconds: dict[str, float] = {"State": 0.0, "Writes": 0.0}

    async def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        started = time.perf_counter()
        try:
            return await super().create(path, body)
        finally:
            kind = str(body.get("spec", {}).get("kind", "State"))
            self.create_seconds[kind] = self.create_seconds.get(kind, 0.0) + time.perf_counter() - started


class MeasuredSaver(AgentrunSaver):
    """AgentrunSaver that notes, at each checkpoint it saves, the store requests so far, the time its
    puts took and the new data its pending writes carried (the public async API, wrapped)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.requests = Requests()
        # per checkpoint, as running totals: store requests, seconds in aput + aput_writes, new data,
        # seconds in aput and in aput_writes apart, seconds in the creates of State and of Writes objects
        self.marks: list[dict[str, float]] = []
        self.totals: dict[str, float] = {"seconds": 0.0, "aput": 0.0, "aput_writes": 0.0}
        self.new_data = 0
        self.measure = AllowListSerializer()

    def _mark(self) -> dict[str, float]:
        creates = self.api.create_seconds if isinstance(self.api, TimedApi) else {}
        return {
            "requests": len(self.requests),
            "new_data": self.new_data,
            **self.totals,
            "create_state": creates.get("State", 0.0),
            "create_writes": creates.get("Writes", 0.0),
            "clock": time.perf_counter(),
        }

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: LangGraphCheckpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        started = time.perf_counter()
        stored = await super().aput(config, checkpoint, metadata, new_versions)
        took = time.perf_counter() - started
        self.totals["seconds"] += took
        self.totals["aput"] += took
        self.marks.append(self._mark())
        return stored

    async def aput_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = ""
    ) -> None:
        started = time.perf_counter()
        await super().aput_writes(config, writes, task_id, task_path)
        took = time.perf_counter() - started
        self.totals["seconds"] += took
        self.totals["aput_writes"] += took
        self.new_data += sum(len(self.measure.dumps_typed(v)[1]) for c, v in writes if c == "messages")


def size(obj: dict[str, Any]) -> int:
    return len(json.dumps(obj, separators=(",", ":")))


def run_thread(
    cluster: LocalCluster, kube: Kube, thread: str, *, calls: int, output_bytes: int, delta: bool
) -> list[dict[str, float]]:
    """Runs one thread; per superstep: etcd bytes (State and Writes objects), store bytes, new data,
    seconds in the saver's puts."""
    api = TimedApi(load_configuration(str(cluster.kubeconfig)))
    requests = Requests()
    store = BlobStore.from_url(cluster.state_store_url, env=cluster.state_store_env(), observer=requests)
    # A Run per thread: blobs are per Run, and two threads of one Run with the same messages share them.
    run = agent_run(thread, "echo", {}, checkpointRetention=1000)
    kube.custom.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, "runs", run)
    saver = MeasuredSaver(api, NAMESPACE, thread, state_store=store)
    saver.requests = requests
    config: RunnableConfig = {"configurable": {"thread_id": thread}, "recursion_limit": 2 * calls + 10}
    graph = build(calls, output_bytes, delta=delta).compile(checkpointer=saver)

    async def invoke() -> None:  # the async API, which MeasuredSaver wraps
        await graph.ainvoke(task(), config, durability="sync")  # as run_graph runs a graph
        await api.aclose()

    asyncio.run(invoke())

    items = kube.custom.list_namespaced_custom_object(GROUP, VERSION, NAMESPACE, "checkpoints")["items"]
    mine = [c for c in items if c["spec"]["thread"]["id"] == thread]
    states = {c["spec"]["sequence"]: c for c in mine if c["spec"]["kind"] == "State"}
    writes: dict[str, int] = {}
    for c in mine:
        if c["spec"]["kind"] == "Writes":
            writes[c["spec"]["parent"]] = writes.get(c["spec"]["parent"], 0) + size(c)
    per_step: list[dict[str, float]] = []
    before = dict.fromkeys(saver.marks[0], 0.0) | {"clock": saver.marks[0]["clock"]}
    for sequence in sorted(states):
        state = states[sequence]
        mark = saver.marks[sequence - 1]
        created = [
            r for r in saver.requests[int(before["requests"]) : int(mark["requests"])] if r.operation == "put"
        ]

        def moved(key: str, mark: dict[str, float] = mark, before: dict[str, float] = before) -> float:
            return round(mark[key] - before[key], 5)

        per_step.append(
            {
                "superstep": sequence,
                "state_object": size(state),
                "writes_objects": writes.get(state["spec"].get("parent", ""), 0),
                "store_bytes": sum(r.size for r in created if r.outcome == "created"),
                "store_puts": len(created),
                "new_data": moved("new_data"),
                "seconds": moved("seconds"),
                # where those seconds went: aput (the manifest, then the State's create) and aput_writes
                # (the values' puts, then the Writes' create), which LangGraph may run at the same time;
                # the creates' own seconds; the store's puts (added up: puts made at once overlap)
                "aput_seconds": moved("aput"),
                "aput_writes_seconds": moved("aput_writes"),
                "create_seconds": round(moved("create_state") + moved("create_writes"), 5),
                "create_state_seconds": moved("create_state"),
                "create_writes_seconds": moved("create_writes"),
                "put_seconds": round(sum(r.seconds for r in created), 5),
                # wall clock from the previous checkpoint saved to this one: the graph's own work (the
                # tool, the model node, LangGraph) and the saver's, overlaps counted once
                "wall_seconds": moved("clock"),
            }
        )
        before = mark
    return per_step


def summary(per_step: list[dict[str, float]]) -> dict[str, Any]:
    def medians(window: range) -> dict[str, float]:
        rows = [r for r in per_step if r["superstep"] in window]
        keys = (
            "state_object",
            "writes_objects",
            "store_bytes",
            "store_puts",
            "new_data",
            "seconds",
            "aput_seconds",
            "aput_writes_seconds",
            "create_seconds",
            "create_state_seconds",
            "create_writes_seconds",
            "put_seconds",
            "wall_seconds",
        )
        found = {k: statistics.median(r[k] for r in rows) for k in keys}
        found["store_bytes_sum"] = sum(r["store_bytes"] for r in rows)
        found["new_data_sum"] = sum(r["new_data"] for r in rows)
        return found

    early, late = medians(EARLY), medians(LATE)
    return {
        "early (supersteps 8-12)": early,
        "late (supersteps 98-102)": late,
        "supersteps 8-47": medians(WIDE),
        "State object late - early (bytes)": late["state_object"] - early["state_object"],
        "store bytes / new data, late window": round(
            late["store_bytes_sum"] / max(1, late["new_data_sum"]), 3
        ),
        "store bytes / new data, whole thread": round(
            sum(r["store_bytes"] for r in per_step) / max(1, sum(r["new_data"] for r in per_step)), 3
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=52)
    parser.add_argument("--output-bytes", type=int, default=40_000)
    parser.add_argument("--rows", action="store_true", help="print every superstep's figures too")
    args = parser.parse_args()
    with scratch_cluster("agentrun-lg-state-", NAMESPACE) as (cluster, kube):
        results = {
            name: run_thread(
                cluster, kube, name, calls=args.calls, output_bytes=args.output_bytes, delta=delta
            )
            for name, delta in (("list", False), ("delta", True))
        }
    print(json.dumps({name: summary(rows) for name, rows in results.items()}, indent=1))
    if args.rows:
        print(json.dumps(results))


if __name__ == "__main__":
    main()
