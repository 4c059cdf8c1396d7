"""AgentrunSaver against the real API server: LangGraph's own conformance suite (async and sync, values
inline and in the local control plane's object store), a planted payload that names a class outside the
allow-list, and a delta channel whose ancestor is gone."""

from __future__ import annotations

import asyncio
import base64
import os
from collections.abc import AsyncGenerator, AsyncIterator, Iterator, Sequence
from typing import Any

import ormsgpack
import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import ChannelVersions, CheckpointMetadata, CheckpointTuple
from langgraph.checkpoint.base import Checkpoint as LangGraphCheckpoint
from langgraph.checkpoint.base.id import uuid6
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.report import CapabilityReport
from langgraph.checkpoint.conformance.test_utils import (
    generate_checkpoint,
    generate_config,
    generate_metadata,
)

from agentrun.examples.manifests import agent_run
from agentrun.integrations.langgraph import AgentrunSaver, UnsafeCheckpoint
from agentrun.kubeapi import KubeApi, load_configuration
from agentrun.statestore import BlobStore
from agentrun.worker.errors import StateUnverifiable
from devcluster.cluster import LocalCluster
from support.kube import Kube
from support.langgraph_growing import build
from support.runs import GROUP, VERSION, create_run

pytestmark = pytest.mark.cluster


class SyncDrivenSaver(AgentrunSaver):
    """The conformance suite calls the async API only: this saver answers it with the sync one, each
    call on a thread of its own (as a sync graph calls it), so the suite checks the sync code path."""

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await asyncio.to_thread(self.get_tuple, config)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        found = await asyncio.to_thread(
            lambda: list(self.list(config, filter=filter, before=before, limit=limit))
        )
        for item in found:
            yield item

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: LangGraphCheckpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return await asyncio.to_thread(self.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = ""
    ) -> None:
        await asyncio.to_thread(self.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        await asyncio.to_thread(self.delete_thread, thread_id)


@pytest.fixture
def api(kube: Kube) -> Iterator[KubeApi]:
    client = KubeApi(load_configuration(str(kube.kubeconfig)))
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def saver_run(kube: Kube, agentrun_crds: None, namespace: str) -> str:
    """A Run to own the checkpoints (it keeps them all: the suite writes more than the default 20)."""
    create_run(kube, namespace, agent_run("threads", "echo", {"message": "hi"}, checkpointRetention=1000))
    return "threads"


@pytest.fixture
def state_store(local_cluster: LocalCluster) -> BlobStore:
    """The local control plane's object store (versitygw), with its credentials."""
    return BlobStore.from_url(local_cluster.state_store_url, env=local_cluster.state_store_env())


def conformance(
    saver_class: type[AgentrunSaver], api: KubeApi, namespace: str, run: str, store: BlobStore | None
) -> CapabilityReport:
    where = "values in the state store" if store else "values inline"

    @checkpointer_test(name=f"{saver_class.__name__} (agentrun Checkpoints on a real API server, {where})")
    async def factory() -> AsyncGenerator[AgentrunSaver, None]:
        saver = saver_class(api, namespace, run, state_store=store)
        try:
            yield saver
        finally:
            saver.close()

    return asyncio.run(validate(factory))


@pytest.mark.parametrize("in_store", [True, False], ids=["store", "inline"])
@pytest.mark.parametrize("saver_class", [AgentrunSaver, SyncDrivenSaver], ids=["async", "sync"])
def test_langgraph_conformance_suite_passes_every_base_capability(
    saver_class: type[AgentrunSaver],
    in_store: bool,
    *,
    api: KubeApi,
    namespace: str,
    saver_run: str,
    state_store: BlobStore,
    capsys: pytest.CaptureFixture[str],
) -> None:
    report = conformance(saver_class, api, namespace, saver_run, state_store if in_store else None)
    with capsys.disabled():
        print(f"\nLangGraph conformance ({saver_class.__name__}): level {report.conformance_level()}")
        report.print_report()
    failures = [f for result in report.results.values() for f in result.failures]
    assert report.passed_all_base(), failures
    assert report.conformance_level() == "FULL"
    base = ("put", "put_writes", "get_tuple", "list", "delete_thread")
    assert sum(report.results[c].tests_passed for c in base) >= 58  # the whole base suite ran


def test_a_planted_payload_naming_a_class_outside_the_allow_list_is_refused_not_loaded(
    kube: Kube, api: KubeApi, namespace: str, saver_run: str
) -> None:
    saver = AgentrunSaver(api, namespace, saver_run)
    config = generate_config("planted")
    stored = saver.put(config, generate_checkpoint(channel_values={"x": 1}), generate_metadata(), {"x": 1})
    assert saver.get_tuple(stored) is not None
    name = saver.state_name("planted", "", stored["configurable"]["checkpoint_id"])
    checkpoint = kube.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "checkpoints", name)

    # What LangGraph's msgpack encoder writes for an object: (module, name, args), then called on load.
    # Here it names os.system: loaded, it would run a shell command that leaves a file behind.
    marker = f"/tmp/agentrun-planted-{namespace}"
    evil = ormsgpack.Ext(1, ormsgpack.packb(("os", "system", [f"touch {marker}"])))
    payload = ormsgpack.packb(
        {"v": 1, "id": stored["configurable"]["checkpoint_id"], "channel_values": {"x": evil}}
    )
    planted = {
        **checkpoint["spec"],
        "id": f"{name}-x",
        "state": {
            **checkpoint["spec"]["state"],
            "checkpoint": ["msgpack", base64.b64encode(payload).decode()],
        },
    }
    # As someone with create rights in the namespace would: a new object, the same thread, a later id.
    later = str(uuid6(clock_seq=-1))
    planted["state"]["checkpointId"] = later
    planted["id"] = saver.state_name("planted", "", later)
    metadata = {k: checkpoint["metadata"][k] for k in ("labels", "ownerReferences")}
    kube.custom.create_namespaced_custom_object(
        GROUP,
        VERSION,
        namespace,
        "checkpoints",
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "Checkpoint",
            "metadata": {"name": planted["id"], **metadata},
            "spec": planted,
        },
    )

    with pytest.raises(UnsafeCheckpoint, match=r"os\.system"):
        saver.get_tuple(generate_config("planted"))  # the newest of the thread: the planted one
    with pytest.raises(UnsafeCheckpoint, match=r"os\.system"):
        list(saver.list(generate_config("planted")))
    assert not os.path.exists(marker)
    saver.close()


def test_a_delta_channel_with_an_ancestor_deleted_is_state_unverifiable_not_shorter(
    kube: Kube, api: KubeApi, namespace: str, saver_run: str
) -> None:
    saver = AgentrunSaver(api, namespace, saver_run)
    config: RunnableConfig = {"configurable": {"thread_id": "growing"}, "recursion_limit": 100}
    graph = build(calls=6, kill_at=None, snapshots=False).compile(checkpointer=saver)
    graph.invoke({"messages": ["task"]}, config)
    whole = graph.get_state(config).values["messages"]
    assert len(whole) == 2 + 2 * 6  # rebuilt by the saver's own walk, from the first checkpoint on
    chain = sorted(
        (
            c
            for c in kube.custom.list_namespaced_custom_object(
                GROUP, VERSION, namespace, "checkpoints", label_selector=f"agentrun.dev/run={saver_run}"
            )["items"]
            if c["spec"].get("thread", {}).get("id") == "growing" and c["spec"]["kind"] == "State"
        ),
        key=lambda c: c["spec"]["sequence"],
    )
    first, latest = chain[0]["metadata"]["name"], chain[-1]["spec"]
    assert latest["deltaBase"] == first
    assert latest["state"]["deltaSeeds"] == {"messages": {"checkpoint": first, "sequence": 1}}

    gone = chain[3]["metadata"]["name"]
    kube.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, "checkpoints", gone)
    with pytest.raises(StateUnverifiable, match=f"its ancestor {gone} is missing"):
        graph.get_state(config)
    with pytest.raises(StateUnverifiable, match=f"its ancestor {gone} is missing"):
        asyncio.run(graph.aget_state(config))
    saver.close()
