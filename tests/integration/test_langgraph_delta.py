"""A LangGraph agent whose message list is a DeltaChannel, run by the operator on the real API server with
more checkpoints than the Run keeps, killed mid-way and resumed: no message is lost, no tool runs twice,
and retention still prunes what no kept checkpoint is rebuilt from."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from agentrun.integrations.langgraph import AgentrunSaver
from agentrun.kubeapi import KubeApi, load_configuration
from agentrun.statestore import BlobStore
from devcluster.cluster import LocalCluster
from devcluster.operator import OperatorProcess
from support.kube import Kube, wait_for
from support.langgraph_growing import build, output
from support.runs import FAST_RETRY, GROUP, VERSION, attempts, create_run, support_agent_run, wait_phase

pytestmark = pytest.mark.cluster

CALLS, KILL_AT = 30, 15


def states(kube: Kube, ns: str, run: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = kube.custom.list_namespaced_custom_object(
        GROUP,
        VERSION,
        ns,
        "checkpoints",
        label_selector=f"agentrun.dev/run={run},agentrun.dev/checkpoint-kind=State",
    )["items"]
    return sorted(items, key=lambda c: c["spec"]["sequence"])


def rebuilt(kube: Kube, store: BlobStore, ns: str, run: str, snapshots: bool) -> list[str]:
    """The messages of the Run's last checkpoint, as LangGraph rebuilds them through the saver (sync),
    reading the manifests the attempt Pods wrote to the state store."""
    api = KubeApi(load_configuration(str(kube.kubeconfig)))
    saver = AgentrunSaver(api, ns, run, state_store=store)
    try:
        graph = build(CALLS, None, snapshots).compile(checkpointer=saver)
        messages: list[str] = graph.get_state({"configurable": {"thread_id": run}}).values["messages"]
        return messages
    finally:
        saver.close()
        api.close()


@pytest.mark.parametrize("snapshots", [False, True], ids=["no-snapshot", "snapshot-every-10"])
def test_a_growing_delta_channel_killed_and_resumed_keeps_every_message(
    kube: Kube,
    run_namespace: str,
    operator: OperatorProcess,
    tmp_path: Path,
    snapshots: bool,
    *,
    local_cluster: LocalCluster,
) -> None:
    ns, name, log = run_namespace, "grow", tmp_path / "tools.log"
    body = support_agent_run(
        name, "langgraph_growing", {"calls": CALLS, "killAt": KILL_AT, "snapshots": snapshots}
    )
    body["spec"]["agent"]["env"].append({"name": "AGENTRUN_TOOL_LOG", "value": str(log)})
    body["spec"]["retry"] = FAST_RETRY  # checkpointRetention: the default, 20
    create_run(kube, ns, body)

    run = wait_phase(kube, ns, name, {"Succeeded", "Failed", "NeedsReconciliation"}, timeout=180)
    assert run["status"]["phase"] == "Succeeded", (run["status"], operator.log_tail())
    assert [a["status"]["phase"] for a in attempts(kube, ns, name)] == ["Failed", "Succeeded"]

    # Attempt 2 went on from the checkpoint after output 14, with outputs 0..14 in its state: it ran
    # call 15 (the one killed as it started) and the rest, and no tool twice.
    lines = [line.split() for line in log.read_text().splitlines()]
    ended = Counter(int(call) for _, event, call in lines if event == "end")
    assert ended == Counter(range(CALLS))
    assert [int(c) for a, e, c in lines if a.endswith("-a2") and e == "start"] == list(range(KILL_AT, CALLS))

    expected = ["task", *(m for call in range(CALLS) for m in (f"call {call}", output(call))), "done"]
    assert run["status"]["result"] == {"messages": expected}  # the committed result: the whole list

    if snapshots:
        # The newest 20 are rebuilt from the snapshots after the 40th update: older checkpoints go
        # (waited for: the operator prunes after the Run's last change), and the state stays whole.
        wait_for(lambda: states(kube, ns, name)[0]["spec"]["sequence"] > 20, timeout=120, what="pruning")
    else:
        # No snapshot yet: every checkpoint replays all writes since the first, so none was pruned.
        kept = states(kube, ns, name)
        assert [c["spec"]["sequence"] for c in kept] == list(range(1, len(kept) + 1))
        assert len(kept) == 2 * CALLS + 3 > 20
        assert "deltaBase" not in kept[0]["spec"]  # the first: its state is whole
        assert {c["spec"].get("deltaBase") for c in kept[1:]} == {kept[0]["metadata"]["name"]}
    store = BlobStore.from_url(local_cluster.state_store_url, env=local_cluster.state_store_env())
    assert rebuilt(kube, store, ns, name, snapshots) == expected
