"""AgentrunSaver with the state store, on the real API server and the local control plane's object store
(versitygw): a ReAct-style thread whose tool returns 40 KB per call costs each superstep its change (the
Checkpoint objects do not grow with the thread, the store gets the new messages once); a delta channel
is rebuilt from the store when its ancestors' Checkpoint objects are gone; a blob deleted behind the
saver is StateUnverifiable; a thread saved inline continues in the store, whole."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import obstore
import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.errors import GraphRecursionError

from agentrun.examples.manifests import agent_run
from agentrun.integrations.langgraph import AgentrunSaver
from agentrun.integrations.langgraph.serde import AllowListSerializer
from agentrun.kubeapi import KubeApi, load_configuration
from agentrun.statestore import BlobStore, StoreRequest
from agentrun.worker.errors import StateUnverifiable
from devcluster.cluster import LocalCluster
from support.kube import Kube
from support.langgraph_react import build, output, task
from support.runs import GROUP, VERSION, create_run

pytestmark = pytest.mark.cluster

CALLS, OUTPUT = 40, 40_000


class Written(list[StoreRequest]):
    """The store's requests, as its observer reports them."""

    def __call__(self, request: StoreRequest) -> None:
        self.append(request)

    def created(self) -> int:
        return sum(r.size for r in self if r.operation == "put" and r.outcome == "created")


@pytest.fixture
def api(kube: Kube) -> Iterator[KubeApi]:
    client = KubeApi(load_configuration(str(kube.kubeconfig)))
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def run(kube: Kube, agentrun_crds: None, namespace: str) -> str:
    create_run(kube, namespace, agent_run("threads", "echo", {"message": "hi"}, checkpointRetention=1000))
    return "threads"


def store_of(local_cluster: LocalCluster, written: Written | None = None) -> BlobStore:
    env = local_cluster.state_store_env()
    return BlobStore.from_url(local_cluster.state_store_url, env=env, observer=written)


def checkpoints(kube: Kube, ns: str, thread: str, kind: str) -> list[dict[str, Any]]:
    items = kube.custom.list_namespaced_custom_object(
        GROUP, VERSION, ns, "checkpoints", label_selector=f"agentrun.dev/checkpoint-kind={kind}"
    )["items"]
    found = [c for c in items if c["spec"]["thread"]["id"] == thread]
    return sorted(found, key=lambda c: (c["spec"]["sequence"], c["metadata"]["name"]))


def size(obj: dict[str, Any]) -> int:
    return len(json.dumps(obj, separators=(",", ":")))


def test_a_superstep_costs_its_change_not_the_history(
    kube: Kube, api: KubeApi, namespace: str, run: str, local_cluster: LocalCluster
) -> None:
    written = Written()
    saver = AgentrunSaver(api, namespace, run, state_store=store_of(local_cluster, written))
    config: RunnableConfig = {"configurable": {"thread_id": "react"}, "recursion_limit": 2 * CALLS + 10}
    graph = build(CALLS, OUTPUT).compile(checkpointer=saver)
    graph.invoke(task(), config)
    messages = graph.get_state(config).values["messages"]
    saver.close()
    assert [m.content for m in messages if m.type == "tool"] == [output(c, OUTPUT) for c in range(CALLS)]

    states = checkpoints(kube, namespace, "react", "State")
    assert len(states) == 2 * CALLS + 3
    for state in states:  # pointers only: the manifest holds the values
        assert set(state["spec"]["state"]) <= {"checkpointId", "parentCheckpointId", "deltaSeeds"}
        assert state["spec"]["stateRef"]["links"] is True
    early = max(size(s) for s in states[8:13])
    late = max(size(s) for s in states[-5:])
    assert late <= early + 64  # digits of a sequence or a resourceVersion, never the history
    assert max(size(w) for w in checkpoints(kube, namespace, "react", "Writes")) <= 4096

    # The store got each message once (a tool output is its pending write's blob and the list's
    # segment), plus a manifest per superstep and a list document now and then.
    serde = AllowListSerializer()
    new_data = sum(len(serde.dumps_typed([m])[1]) for m in messages)
    assert written.created() <= 1.5 * new_data


def test_a_delta_channel_is_rebuilt_from_the_store_when_ancestors_objects_are_gone(
    kube: Kube, api: KubeApi, namespace: str, run: str, local_cluster: LocalCluster
) -> None:
    saver = AgentrunSaver(api, namespace, run, state_store=store_of(local_cluster))
    config: RunnableConfig = {"configurable": {"thread_id": "delta"}, "recursion_limit": 100}
    graph = build(6, 2000, delta=True).compile(checkpointer=saver)
    graph.invoke(task(), config)
    whole = graph.get_state(config).values["messages"]
    assert len(whole) == 1 + 2 * 6 + 1
    saver.close()

    states = checkpoints(kube, namespace, "delta", "State")
    first = states[0]["metadata"]["name"]
    assert states[-1]["spec"]["deltaBase"] == first
    for gone in [*states[:-1], *checkpoints(kube, namespace, "delta", "Writes")]:
        name = gone["metadata"]["name"]
        kube.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, "checkpoints", name)
    # A new saver (nothing cached) walks the manifests in the store, not the Checkpoint objects.
    fresh = AgentrunSaver(api, namespace, run, state_store=store_of(local_cluster))
    try:
        graph = build(6, 2000, delta=True).compile(checkpointer=fresh)
        assert graph.get_state(config).values["messages"] == whole
    finally:
        fresh.close()


def test_a_blob_deleted_behind_the_saver_is_state_unverifiable(
    api: KubeApi, namespace: str, run: str, local_cluster: LocalCluster
) -> None:
    store = store_of(local_cluster)
    saver = AgentrunSaver(api, namespace, run, state_store=store)
    config: RunnableConfig = {"configurable": {"thread_id": "gone"}, "recursion_limit": 100}
    build(3, OUTPUT).compile(checkpointer=saver).invoke(task(), config)
    saver.close()
    server = local_cluster.object_store
    assert server is not None
    env = local_cluster.state_store_env()
    hostile = obstore.store.S3Store(  # the namespace's credentials, not following the rules
        store.bucket_for(store.location.key(namespace)),  # the namespace's bucket
        config={
            "endpoint": server.endpoint,
            "region": "us-east-1",
            "access_key_id": env["AWS_ACCESS_KEY_ID"],
            "secret_access_key": env["AWS_SECRET_ACCESS_KEY"],
        },
        client_options={"allow_http": True},
    )
    listed = [m for batch in obstore.list(hostile, store.location.key(namespace)) for m in batch]
    outputs = sorted(str(m["path"]) for m in listed if int(m["size"]) > OUTPUT)
    assert len(outputs) == 3  # one blob per tool output: its pending write's and the list's
    obstore.delete(hostile, outputs[0])
    fresh = AgentrunSaver(api, namespace, run, state_store=store_of(local_cluster))
    try:
        with pytest.raises(StateUnverifiable, match=outputs[0]):
            build(3, OUTPUT).compile(checkpointer=fresh).get_state(config)
    finally:
        fresh.close()


@pytest.mark.parametrize("delta", [False, True], ids=["list", "delta"])
def test_a_thread_saved_inline_continues_in_the_store_whole(
    api: KubeApi, namespace: str, run: str, local_cluster: LocalCluster, delta: bool
) -> None:
    thread = f"skew-{delta}"
    inline = AgentrunSaver(api, namespace, run)
    with pytest.raises(GraphRecursionError):  # stopped mid-way, its checkpoints saved inline
        build(6, 3000, delta=delta).compile(checkpointer=inline).invoke(
            task(), {"configurable": {"thread_id": thread}, "recursion_limit": 7}
        )
    inline.close()
    saver = AgentrunSaver(api, namespace, run, state_store=store_of(local_cluster))
    config: RunnableConfig = {"configurable": {"thread_id": thread}, "recursion_limit": 100}
    graph = build(6, 3000, delta=delta).compile(checkpointer=saver)
    graph.invoke(None, config)
    messages = graph.get_state(config).values["messages"]
    saver.close()
    assert [m.content for m in messages if m.type == "tool"] == [output(c, 3000) for c in range(6)]
    assert messages[-1].content == "read 6 files"
    # A reader without the store refuses the checkpoints in it: never a state without their values.
    storeless = AgentrunSaver(api, namespace, run)
    try:
        with pytest.raises(StateUnverifiable, match="none configured"):
            storeless.get_tuple({"configurable": {"thread_id": thread}})
    finally:
        storeless.close()
