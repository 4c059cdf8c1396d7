"""A LangGraph Run forked from one of its checkpoints, on the real control plane and the real S3 server:
run_graph in the fork continues the graph from that checkpoint (the source's manifest shared by digest, not
copied), and a tool call the source confirmed before the checkpoint is inherited, never sent again; from a
compacted source (its checkpoint read from its index) and from an archived one alike."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from devcluster.cluster import LocalCluster
from devcluster.operator import OperatorProcess
from devcluster.security import STATE_STORE_SECRET
from integration.test_forks import checkpoints, indexed_checkpoints
from support.kube import Kube, wait_for
from support.runs import (
    GROUP,
    VERSION,
    attempts,
    create_run,
    get_run,
    patch_spec,
    support_agent_run,
    wait_phase,
)

pytestmark = pytest.mark.cluster

CALLS = 3
# Over the inline threshold: tool outputs, and so the messages, are blobs in the state store.
OUTPUT_BYTES = 20_000


def react_run(name: str, log: Path, cluster: LocalCluster, **spec: Any) -> dict[str, Any]:
    """The ReAct graph whose tool calls go through the ledger (support.langgraph_react, ledger), with the
    state store the operator gives attempt Pods, its sends logged to `log`."""
    scenario = {"calls": CALLS, "outputBytes": OUTPUT_BYTES, "ledger": True}
    body = support_agent_run(name, "langgraph_react", scenario)
    body["spec"]["agent"]["env"] += [
        {"name": "AGENTRUN_TOOL_LOG", "value": str(log)},
        {"name": "AGENTRUN_STATE_STORE_URL", "value": cluster.state_store_url},
        *(
            {"name": key, "valueFrom": {"secretKeyRef": {"name": STATE_STORE_SECRET, "key": key}}}
            for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
        ),
    ]
    body["spec"].update(spec)
    return body


def succeeded_and_indexed(
    kube: Kube, ns: str, name: str, operator: OperatorProcess, *, keep: frozenset[str] = frozenset()
) -> dict[str, Any]:
    """The Run Succeeded, its Checkpoint index written, and its superseded Checkpoints deleted (all but
    its latest and those in `keep`)."""
    run = wait_phase(kube, ns, name, {"Succeeded", "Failed", "NeedsReconciliation"})
    assert run["status"]["phase"] == "Succeeded", (run["status"], operator.log_tail())

    def compacted() -> dict[str, Any] | None:
        done = get_run(kube, ns, name)
        left = {c["spec"]["id"] for c in checkpoints(kube, ns, name)}
        return (
            done
            if done["status"].get("checkpointIndex") and left == {done["status"]["latestCheckpoint"], *keep}
            else None
        )

    found: dict[str, Any] = wait_for(compacted, timeout=120, what=f"{name} compacted")
    return found


def gone(kube: Kube, ns: str, name: str) -> bool:
    try:
        get_run(kube, ns, name)
    except ApiException as exc:
        if exc.status == 404:
            return True
        raise
    return False


def sends(log: Path) -> list[str]:
    """The tool sends as the tool logged them: "<attempt> send <call>"."""
    return [line for line in log.read_text().splitlines() if " send " in line]


def side_effects(kube: Kube, ns: str, run: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = kube.custom.list_namespaced_custom_object(
        GROUP, VERSION, ns, "sideeffects", label_selector=f"agentrun.dev/run={run}"
    )["items"]
    return sorted(items, key=lambda r: r["spec"].get("ledgerSequence") or 0)


def test_run_graph_on_a_fork_continues_from_the_checkpoint_and_never_resends_a_confirmed_tool_call(
    kube: Kube, local_cluster: LocalCluster, run_namespace: str, operator: OperatorProcess, tmp_path: Path
) -> None:
    ns = run_namespace
    log = tmp_path / "tools.log"
    create_run(kube, ns, react_run("source", log, local_cluster))
    source = succeeded_and_indexed(kube, ns, "source", operator)
    assert source["status"]["result"] == {"messages": 2 + 2 * CALLS, "last": f"read {CALLS} files"}
    assert sends(log) == [f"source-a1 send {call}" for call in range(CALLS)]

    # Every State checkpoint of the graph records the ledger as it stood: one more per tool call.
    states = [c for c in indexed_checkpoints(local_cluster, source) if c["spec"]["kind"] == "State"]
    marks = [c["spec"]["ledgerMark"] for c in states]
    assert marks == sorted(marks) and marks[0] == 0 and marks[-1] == CALLS, marks
    # the checkpoint right after the first tool call's result: that call confirmed before it
    middle = next(c for c in states if c["spec"]["ledgerMark"] == 1)

    fork_from = {"run": "source", "checkpointId": middle["spec"]["id"]}
    create_run(kube, ns, react_run("branch", log, local_cluster, forkFrom=fork_from))
    # compacted too, keeping the operator's copy (its first Attempt resumed from it)
    copy_id = f"branch-a0-s{middle['spec']['sequence']}"
    fork = succeeded_and_indexed(kube, ns, "branch", operator, keep=frozenset({copy_id}))

    # The graph went on from the checkpoint to the same end ...
    assert fork["status"]["result"] == source["status"]["result"]
    assert fork["status"]["fork"]["ledgerMark"] == 1 and fork["status"]["fork"]["inherited"] == 1
    # ... without the tool call confirmed before it: sent once, by the source. The calls after it are
    # the fork's own (opened after the mark): it made them itself, once each.
    assert sends(log) == [
        *(f"source-a1 send {call}" for call in range(CALLS)),
        *(f"branch-a1 send {call}" for call in range(1, CALLS)),
    ]
    [first_attempt] = attempts(kube, ns, "branch")

    inherited, *own = side_effects(kube, ns, "branch")
    assert inherited["status"]["state"] == "Confirmed"
    assert inherited["status"]["inheritedFrom"]["run"] == "source"
    assert inherited["status"]["inheritedFrom"]["uid"] == source["metadata"]["uid"]
    assert inherited["spec"]["idempotencyKey"].startswith("source.")
    assert inherited["spec"]["idempotencyKey"].endswith(".call-0")
    assert [s["attempt"] for s in inherited["status"]["sends"]] == ["source-a1"]
    assert [(r["status"]["state"], "inheritedFrom" in r["status"]) for r in own] == [("Confirmed", False)] * 2
    assert [r["spec"]["ledgerSequence"] for r in own] == [2, 3]
    assert [r["spec"]["idempotencyKey"].rsplit(".", 1)[1] for r in own] == ["call-1", "call-2"]

    # The fork's thread: the operator's copy, then the same LangGraph checkpoint on the fork's own thread
    # (the fork root), both naming the source's manifest (shared by digest, not copied), then the rest.
    chain = [c for c in indexed_checkpoints(local_cluster, fork) if c["spec"]["kind"] == "State"]
    copy, root, *rest = chain
    assert first_attempt["spec"]["resumeFrom"] == copy["spec"]["id"] == copy_id
    assert copy["spec"]["stateRef"] == root["spec"]["stateRef"] == middle["spec"]["stateRef"]
    assert f"/{source['metadata']['uid']}/sha256/" in root["spec"]["stateRef"]["key"]
    assert root["spec"]["thread"] == {"id": "branch", "ns": ""}
    assert (root["spec"]["parent"], root["spec"]["ledgerMark"]) == (copy["spec"]["id"], 1)
    assert rest and all(c["spec"]["thread"] == {"id": "branch", "ns": ""} for c in rest)
    assert rest[0]["spec"]["parent"] == root["spec"]["id"]
    assert rest[-1]["spec"]["ledgerMark"] == CALLS

    # The same from the source's archive, once the source expired and was deleted: the copy comes from
    # the archived checkpoint index, the fork reads the source's manifest and blobs where they are.
    patch_spec(kube, ns, "source", {"ttlSecondsAfterFinished": 0})
    wait_for(lambda: gone(kube, ns, "source"), timeout=120, what="the source archived and deleted")
    create_run(kube, ns, react_run("later", log, local_cluster, forkFrom=fork_from))
    later = wait_phase(kube, ns, "later", {"Succeeded", "Failed", "NeedsReconciliation"})
    assert later["status"]["phase"] == "Succeeded", (later["status"], operator.log_tail())
    assert later["status"]["result"] == source["status"]["result"]
    assert later["status"]["fork"]["archived"] is True and later["status"]["fork"]["inherited"] == 1
    assert sends(log)[2 * CALLS - 1 :] == [f"later-a1 send {call}" for call in range(1, CALLS)]
