"""The Pydantic AI ticket agent run by the operator on the real API server: a crash after a journaled
model response, an approval refused, an approval granted."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest

from agentrun.examples.manifests import agent_run
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
    resume,
    wait_phase,
)

pytestmark = pytest.mark.cluster


def model_calls(log: Path) -> list[tuple[int, str]]:
    """(attempt number, what the model answered) for every call of the FunctionModel."""
    return [(int(n), what) for n, what in (line.split() for line in log.read_text().splitlines())]


def checkpoints(kube: Kube, ns: str, run: str, kind: str) -> list[dict[str, Any]]:
    items = kube.custom.list_namespaced_custom_object(
        GROUP, VERSION, ns, "checkpoints", label_selector=f"agentrun.dev/run={run}"
    )["items"]
    return [c for c in items if c["spec"].get("kind") == kind]


def answer(kube: Kube, ns: str, name: str, value: Any) -> None:
    pending = wait_phase(kube, ns, name, {"AuthRequired", "Failed"})["status"]["pendingRequest"]
    assert pending["reason"] == "auth_required", pending
    assert pending["acceptedSchema"]["required"] == ["approved"]
    assert "create_ticket" in pending["prompt"]
    resume(kube, ns, name, pending, value, key="answer")


def test_killed_after_a_journaled_model_response_the_model_is_not_called_again(
    kube: Kube, run_namespace: str, operator: OperatorProcess, tickets: TicketServiceProcess, tmp_path: Path
) -> None:
    ns, name, log = run_namespace, "pai", tmp_path / "model.log"
    spec = {"title": "Printer on fire", "body": "third floor", "holdInTool": [1]}
    env = {**tickets.env(), "AGENTRUN_MODEL_LOG": str(log)}
    create_run(kube, ns, agent_run(name, "pydantic_ai_agent", spec, env=env, retry=FAST_RETRY))

    # Attempt 1: the model asks for the tool; its response is journaled; the tool holds: kill it there.
    wait_for(lambda: checkpoints(kube, ns, name, "Journal"), interval=0.2, what="a journal entry")
    status = kube.core.read_namespaced_pod(f"{name}-a1", ns).status
    os.killpg(int(status.container_statuses[0].container_id.removeprefix("process://")), signal.SIGKILL)

    run = wait_phase(kube, ns, name, {"Succeeded", "Failed", "NeedsReconciliation"}, timeout=120)
    assert run["status"]["phase"] == "Succeeded", operator.log_tail()
    assert [a["status"]["phase"] for a in attempts(kube, ns, name)] == ["Failed", "Succeeded"]
    # The tool call was answered once, in Attempt 1; Attempt 2 got it from the journal (with the same
    # tool call id: the ledger key) and only called the model for what came after the tool.
    assert model_calls(log) == [(1, "tool-call"), (2, "answer")]
    [ticket] = tickets.creations()
    assert run["status"]["result"] == {"output": f"Opened {ticket['ticketId']}."}
    [effect] = kube.custom.list_namespaced_custom_object(
        GROUP, VERSION, ns, "sideeffects", label_selector=f"agentrun.dev/run={name}"
    )["items"]
    # the Run's key for that tool call id, which the tool handed on to the ticket service
    assert effect["spec"]["idempotencyKey"].startswith(f"{name}.create_ticket.pyd_ai_")
    assert ticket["idempotencyKey"] == effect["spec"]["idempotencyKey"]
    assert effect["status"]["state"] == "Confirmed"
    assert effect["status"]["externalReference"] == ticket["ticketId"]
    # usage from the model's responses, counted where the model really answered (not for the replay)
    usage = attempts(kube, ns, name)[1]["status"]["usage"]
    assert usage["modelCalls"] == 1 and usage["inputTokens"] > 0 and usage["outputTokens"] > 0


def test_an_approval_refused_the_tool_never_runs_and_the_model_is_told(
    kube: Kube, run_namespace: str, operator: OperatorProcess, tickets: TicketServiceProcess, tmp_path: Path
) -> None:
    ns, name, log = run_namespace, "pai-no", tmp_path / "model.log"
    spec = {"title": "Printer on fire", "requireApproval": True}
    env = {**tickets.env(), "AGENTRUN_MODEL_LOG": str(log)}
    create_run(kube, ns, agent_run(name, "pydantic_ai_agent", spec, env=env))

    answer(kube, ns, name, {"approved": False, "comment": "not now"})
    run = wait_phase(kube, ns, name, {"Succeeded", "Failed"})
    assert run["status"]["phase"] == "Succeeded", operator.log_tail()
    assert run["status"]["result"] == {"output": "No ticket: not now"}
    assert tickets.creations() == []
    effects = kube.custom.list_namespaced_custom_object(
        GROUP, VERSION, ns, "sideeffects", label_selector=f"agentrun.dev/run={name}"
    )["items"]
    assert effects == []  # denied before the ledger: nothing was even about to be sent
    assert model_calls(log) == [(1, "tool-call"), (2, "answer")]
    # the message history, with the denial, is the last Checkpoint's state
    state = get_checkpoint_state(kube, ns, name)
    parts = [p for m in state["messages"] for p in m["parts"]]
    assert [p["part_kind"] for p in parts][-3:] == ["tool-call", "tool-return", "text"]
    assert parts[-2]["content"] == "not now"


def test_an_approval_granted_opens_one_ticket(
    kube: Kube, run_namespace: str, operator: OperatorProcess, tickets: TicketServiceProcess
) -> None:
    ns, name = run_namespace, "pai-yes"
    spec = {"title": "Printer on fire", "requireApproval": True}
    create_run(kube, ns, agent_run(name, "pydantic_ai_agent", spec, env=tickets.env()))

    answer(kube, ns, name, {"approved": True})
    run = wait_phase(kube, ns, name, {"Succeeded", "Failed"})
    assert run["status"]["phase"] == "Succeeded", operator.log_tail()
    [ticket] = tickets.creations()
    assert run["status"]["result"] == {"output": f"Opened {ticket['ticketId']}."}
    assert len(attempts(kube, ns, name)) == 2  # asked once, answered once
    [effect] = kube.custom.list_namespaced_custom_object(
        GROUP, VERSION, ns, "sideeffects", label_selector=f"agentrun.dev/run={name}"
    )["items"]
    assert effect["spec"]["idempotencyKey"].endswith(".approved")  # the call as approved, in the ledger
    assert (effect["status"]["state"], ticket["idempotencyKey"]) == (
        "Confirmed",
        effect["spec"]["idempotencyKey"],
    )


def get_checkpoint_state(kube: Kube, ns: str, name: str) -> dict[str, Any]:
    latest = get_run(kube, ns, name)["status"]["latestCheckpoint"]
    [checkpoint] = [c for c in checkpoints(kube, ns, name, "State") if c["spec"]["id"] == latest]
    state: dict[str, Any] = checkpoint["spec"]["state"]
    return state
