"""LangGraph agents run by the operator on the real API server: interrupts, answers, a crash."""

from __future__ import annotations

import itertools
import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
from pydantic_core import to_jsonable_python

from agentrun.examples.manifests import agent_run
from agentrun.integrations.langgraph import AgentrunSaver
from agentrun.kubeapi import KubeApi, load_configuration
from agentrun.statestore import BlobStore
from devcluster.cluster import LocalCluster
from devcluster.operator import OperatorProcess
from devcluster.tickets import TicketServiceProcess
from support.kube import Kube, wait_for
from support.runs import (
    FAST_RETRY,
    GROUP,
    VERSION,
    attempts,
    create_run,
    get_run,
    patch_spec,
    resume,
    support_agent_run,
    wait_phase,
)

pytestmark = pytest.mark.cluster


def control(kube: Kube, ns: str, name: str, key: str) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        found = [
            c
            for c in get_run(kube, ns, name).get("status", {}).get("controls") or []
            if c["idempotencyKey"] == key
        ]
        return found[0] if found else None

    return wait_for(probe, timeout=120, interval=0.2, what=f"the outcome of {key}")


def test_two_interrupts_pending_at_once_are_answered_with_one_resume(
    kube: Kube, run_namespace: str, operator: OperatorProcess
) -> None:
    ns = run_namespace
    create_run(kube, ns, support_agent_run("two", "langgraph_questions", {}))
    waiting = wait_phase(kube, ns, "two", {"InputRequired", "Failed"})
    pending = waiting["status"]["pendingRequest"]
    schema = pending["acceptedSchema"]
    questions = json.loads(pending["prompt"])  # {interrupt id: its value}
    assert sorted(questions.values()) == ["color?", "size?"]
    assert sorted(schema["required"]) == sorted(questions) == sorted(schema["properties"])
    by_question = {value: interrupt_id for interrupt_id, value in questions.items()}
    answer = {by_question["color?"]: {"color": "blue"}, by_question["size?"]: {"size": 3}}

    resume(kube, ns, "two", pending, {by_question["color?"]: {"color": "blue"}}, key="half")  # one is missing
    assert control(kube, ns, "two", "half")["outcome"] == "Rejected"
    resume(kube, ns, "two", pending, answer, key="both")
    run = wait_phase(kube, ns, "two", {"Succeeded", "Failed"})
    assert run["status"]["phase"] == "Succeeded", operator.log_tail()
    assert run["status"]["result"] == {"color": "blue", "size": 3}
    assert len(attempts(kube, ns, "two")) == 2  # asked once, answered once


def test_a_graph_interrupt_held_by_its_attempt_is_answered_without_a_new_attempt(
    kube: Kube, run_namespace: str, operator: OperatorProcess
) -> None:
    ns = run_namespace
    create_run(kube, ns, support_agent_run("held", "langgraph_questions", {"holdSeconds": 300}))
    # Answered once the operator has recorded the wait (InputRequired): before that the Run is Running and
    # an answer is refused as NotWaiting.
    waiting = wait_for(
        lambda: (
            (r := get_run(kube, ns, "held")).get("status", {}).get("phase") == "InputRequired"
            and r["status"].get("pendingRequest", {}).get("heldBy")
            and r
        ),
        timeout=120,
        what="the graph's request held by its Attempt, the Run InputRequired",
    )
    pending = waiting["status"]["pendingRequest"]
    assert pending["heldBy"] == "held-a1"
    by_question = {value: interrupt_id for interrupt_id, value in json.loads(pending["prompt"]).items()}
    answer = {by_question["color?"]: {"color": "red"}, by_question["size?"]: {"size": 5}}
    resume(kube, ns, "held", pending, answer, key="in-hold")
    run = wait_phase(kube, ns, "held", {"Succeeded", "Failed"})
    assert run["status"]["phase"] == "Succeeded", operator.log_tail()
    assert run["status"]["result"] == {"color": "red", "size": 5}
    assert [a["metadata"]["name"] for a in attempts(kube, ns, "held")] == ["held-a1"]  # the same Attempt


def node_runs(log: Path) -> list[tuple[int, str, str]]:
    """(attempt number, start|end, node) for every line of the agent's node log."""
    lines = [line.split() for line in log.read_text().splitlines()]
    return [(int(attempt.rsplit("-a", 1)[1]), event, node) for attempt, event, node in lines]


def test_langgraph_agent_interrupted_answered_killed_after_its_ticket_and_resumed(
    kube: Kube,
    run_namespace: str,
    operator: OperatorProcess,
    tickets: TicketServiceProcess,
    tmp_path: Path,
    *,
    local_cluster: LocalCluster,
) -> None:
    ns, name, log = run_namespace, "lg", tmp_path / "nodes.log"
    spec = {"title": "Printer on fire", "body": "third floor", "holdAfterTicket": [2]}
    env = {**tickets.env(), "AGENTRUN_NODE_LOG": str(log)}
    create_run(kube, ns, agent_run(name, "langgraph_agent", spec, env=env, retry=FAST_RETRY))

    pending = wait_phase(kube, ns, name, {"InputRequired", "Failed"})["status"]["pendingRequest"]
    assert pending["acceptedSchema"]["properties"]["priority"]["enum"] == ["low", "normal", "high"]
    assert "Printer on fire" in pending["prompt"]
    resume(kube, ns, name, pending, {"priority": "urgent"}, key="wrong")  # refused by the schema
    assert (control(kube, ns, name, "wrong")["outcome"], get_run(kube, ns, name)["status"]["phase"]) == (
        "Rejected",
        "InputRequired",
    )
    resume(kube, ns, name, pending, {"priority": "high"}, key="answer")

    # Attempt 2 answers, runs the model, opens the ticket through the ledger and holds: kill it there.
    def confirmed() -> bool:
        effects = kube.custom.list_namespaced_custom_object(
            GROUP, VERSION, ns, "sideeffects", label_selector=f"agentrun.dev/run={name}"
        )["items"]
        return any((e.get("status") or {}).get("state") == "Confirmed" for e in effects)

    wait_for(confirmed, timeout=120, interval=0.2, what="the ticket confirmed in the ledger")
    status = kube.core.read_namespaced_pod(f"{name}-a2", ns).status
    os.killpg(int(status.container_statuses[0].container_id.removeprefix("process://")), signal.SIGKILL)

    run = wait_phase(kube, ns, name, {"Succeeded", "Failed", "NeedsReconciliation"}, timeout=120)
    assert run["status"]["phase"] == "Succeeded", operator.log_tail()
    [ticket] = tickets.creations()  # one ticket, though the tool ran again after the kill
    assert [a["status"]["phase"] for a in attempts(kube, ns, name)][1:] == ["Failed", "Succeeded"]

    runs = node_runs(log)
    finished = [(n, node) for n, event, node in runs if event == "end"]
    # Every node that finished ran to its end once; the ones checkpointed before the kill (triage, the
    # model's tool call) never ran again in Attempt 3, which started again at the tools node.
    assert finished == [(2, "triage"), (2, "agent"), (3, "tools"), (3, "agent")]
    assert [(n, node) for n, event, node in runs if event == "start" and n == 3] == [
        (3, "tools"),
        (3, "agent"),
    ]
    assert (2, "start", "tools") in runs  # the one killed with its ticket confirmed

    # The committed result is the graph's final state, as its last checkpoint holds it.
    api = KubeApi(load_configuration(str(kube.kubeconfig)))
    # the attempt Pods wrote the checkpoints' values to the state store: read them from there
    store = BlobStore.from_url(local_cluster.state_store_url, env=local_cluster.state_store_env())
    saver = AgentrunSaver(api, ns, name, state_store=store)
    try:
        latest = saver.get_tuple({"configurable": {"thread_id": name, "checkpoint_ns": ""}})
    finally:
        saver.close()
        api.close()
    assert latest is not None
    result = run["status"]["result"]
    values = latest.checkpoint["channel_values"]
    state = {k: values[k] for k in ("title", "body", "priority", "messages")}
    assert result == to_jsonable_python(state, exclude_none=True)
    assert result["priority"] == "high"
    assert result["messages"][-1]["content"] == f"Opened {ticket['ticketId']}."


def step_log(log: Path) -> list[tuple[int, str, int]]:
    """(attempt number, node, the worker's API requests when the node started)."""
    return [
        (int(a.rsplit("-a", 1)[1]), node, int(n))
        for a, node, n in (line.split() for line in log.read_text().splitlines())
    ]


def test_api_requests_per_superstep_with_sync_durability(
    kube: Kube, run_namespace: str, operator: OperatorProcess, tmp_path: Path
) -> None:
    ns, log = run_namespace, tmp_path / "steps.log"
    body = support_agent_run("steps", "langgraph_steps", {"steps": 6})
    body["spec"]["agent"]["env"].append({"name": "AGENTRUN_STEP_LOG", "value": str(log)})
    create_run(kube, ns, body)
    run = wait_phase(kube, ns, "steps", {"Succeeded", "Failed"})
    assert run["status"]["phase"] == "Succeeded", operator.log_tail()
    assert run["status"]["result"] == {"done": [f"s{i}" for i in range(1, 7)]}
    counts = [n for _, _, n in step_log(log)]
    per_superstep = [b - a for a, b in itertools.pairwise(counts)]
    print(f"\nAPI requests per LangGraph superstep (sync durability, one task): {per_superstep}")
    # the task's pending writes (1 create), the checkpoint (1 create), the Run's latestCheckpoint
    # (1 fenced patch on the Run last written; 2 more when something else changed the Run meanwhile)
    assert min(per_superstep) == 3
    assert sum(per_superstep) <= 3 * len(per_superstep) + 4


def test_a_pause_is_honoured_between_supersteps_and_resume_continues(
    kube: Kube, run_namespace: str, operator: OperatorProcess, tmp_path: Path
) -> None:
    ns, log, go = run_namespace, tmp_path / "steps.log", tmp_path / "go"
    body = support_agent_run("pausing", "langgraph_steps", {"steps": 4, "waitAt": 2})
    body["spec"]["agent"]["env"] += [
        {"name": "AGENTRUN_STEP_LOG", "value": str(log)},
        {"name": "AGENTRUN_GO", "value": str(go)},
    ]
    create_run(kube, ns, body)
    wait_for(lambda: log.exists() and "s2" in log.read_text(), timeout=120, what="step s2 running")
    patch_spec(kube, ns, "pausing", {"pause": {"requestId": "upgrade-1", "reason": "database upgrade"}})
    wait_for(lambda: get_run(kube, ns, "pausing")["spec"].get("pause"), timeout=120, what="the pause stored")
    go.touch()  # s2 ends now: its checkpoint is the boundary where the Run pauses
    paused = wait_phase(kube, ns, "pausing", {"Paused", "Succeeded", "Failed"})
    assert paused["status"]["phase"] == "Paused", operator.log_tail()
    pending = paused["status"]["pendingRequest"]
    assert (pending["requestId"], pending["reason"]) == ("upgrade-1", "paused")
    assert pending["checkpointId"] == paused["status"]["latestCheckpoint"]
    assert [node for _, node, _ in step_log(log)] == ["s1", "s2"]

    resume(kube, ns, "pausing", pending, {}, key="carry-on")
    run = wait_phase(kube, ns, "pausing", {"Succeeded", "Failed"})
    assert run["status"]["phase"] == "Succeeded", operator.log_tail()
    assert run["status"]["result"] == {"done": ["s1", "s2", "s3", "s4"]}
    assert [(n, node) for n, node, _ in step_log(log)] == [(1, "s1"), (1, "s2"), (2, "s3"), (2, "s4")]
