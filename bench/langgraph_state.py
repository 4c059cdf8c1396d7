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
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import ChannelVersions, CheckpointMetadata
from langgraph.checkpoint.base import Checkpoint as LangGraphCheckpoint

from agentrun.examples.manifests import agent_run
from agentrun.integrations.langgraph import AgentrunSaver
from agentrun.integrations.langgraph.serde import AllowListSerializer
from agentrun.kubeapi import KubeApi, load_configuration
from agentrun.statestore import BlobStore, StoreRequest
from devcluster.cluster import LocalCluster
from support.agentrun import install_crds
from support.kube import Kube
from support.langgraph_react import build, task

GROUP, VERSION = "agentrun.dev", "v1alpha1"
NAMESPACE = "bench"
EARLY, LATE = range(8, 13), range(98, 103)


class Requests(list[StoreRequest]):
    """The store's requests, as its observer reports them."""

    def __call__(self, request: StoreRequest) -> None:
        self.append(request)


class MeasuredSaver(AgentrunSaver):
    """AgentrunSaver that notes, at each checkpoint it saves, the store requests so far, the time its
    puts took and the new data its pending writes carried (the public async API, wrapped)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.requests = Requests()
        self.marks: list[tuple[int, float, int]] = []  # per checkpoint: (requests, seconds, new data)
        self.seconds = 0.0
        self.new_data = 0
        self.measure = AllowListSerializer()

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: LangGraphCheckpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        started = time.perf_counter()
        stored = await super().aput(config, checkpoint, metadata, new_versions)
        self.seconds += time.perf_counter() - started
        self.marks.append((len(self.requests), self.seconds, self.new_data))
        return stored

    async def aput_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = ""
    ) -> None:
        started = time.perf_counter()
        await super().aput_writes(config, writes, task_id, task_path)
        self.seconds += time.perf_counter() - started
        self.new_data += sum(len(self.measure.dumps_typed(v)[1]) for c, v in writes if c == "messages")


def size(obj: dict[str, Any]) -> int:
    return len(json.dumps(obj, separators=(",", ":")))


def run_thread(
    cluster: LocalCluster, kube: Kube, thread: str, *, calls: int, output_bytes: int, delta: bool
) -> list[dict[str, float]]:
    """Runs one thread; per superstep: etcd bytes (State and Writes objects), store bytes, new data,
    seconds in the saver's puts."""
    api = KubeApi(load_configuration(str(cluster.kubeconfig)))
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
    before = (0, 0.0, 0)
    for sequence in sorted(states):
        state = states[sequence]
        mark = saver.marks[sequence - 1]
        created = [r for r in saver.requests[before[0] : mark[0]] if r.operation == "put"]
        per_step.append(
            {
                "superstep": sequence,
                "state_object": size(state),
                "writes_objects": writes.get(state["spec"].get("parent", ""), 0),
                "store_bytes": sum(r.size for r in created if r.outcome == "created"),
                "store_puts": len(created),
                "new_data": mark[2] - before[2],
                "seconds": round(mark[1] - before[1], 4),
            }
        )
        before = mark
    return per_step


def summary(per_step: list[dict[str, float]]) -> dict[str, Any]:
    def medians(window: range) -> dict[str, float]:
        rows = [r for r in per_step if r["superstep"] in window]
        keys = ("state_object", "writes_objects", "store_bytes", "store_puts", "new_data", "seconds")
        found = {k: statistics.median(r[k] for r in rows) for k in keys}
        found["store_bytes_sum"] = sum(r["store_bytes"] for r in rows)
        found["new_data_sum"] = sum(r["new_data"] for r in rows)
        return found

    early, late = medians(EARLY), medians(LATE)
    return {
        "early (supersteps 8-12)": early,
        "late (supersteps 98-102)": late,
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
    with tempfile.TemporaryDirectory(prefix="agentrun-lg-state-") as tmp:
        cluster = LocalCluster(state_dir=Path(tmp) / "cluster")
        cluster.start()
        try:
            kube = Kube(cluster.kubeconfig, Path(cluster.binary("kubectl")))
            install_crds(kube)
            kube.core.create_namespace({"metadata": {"name": NAMESPACE}})
            results = {
                name: run_thread(
                    cluster, kube, name, calls=args.calls, output_bytes=args.output_bytes, delta=delta
                )
                for name, delta in (("list", False), ("delta", True))
            }
        finally:
            cluster.stop()
    print(json.dumps({name: summary(rows) for name, rows in results.items()}, indent=1))
    if args.rows:
        print(json.dumps(results))


if __name__ == "__main__":
    main()
