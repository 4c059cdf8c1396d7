"""The side-effect ledger against a real external service: never twice, never guessed."""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest

from agentrun.core.ledger import approval_request_id, request_digest, side_effect_name
from agentrun.examples.manifests import agent_run
from agentrun.examples.ticket_agent import ticket_key
from devcluster.operator import OperatorProcess
from devcluster.tickets import TicketServiceProcess
from support.kube import Kube, wait_for
from support.runs import FAST_RETRY, GROUP, VERSION, attempts, create_run, get_run, resume, wait_phase

pytestmark = pytest.mark.cluster


# While the service holds a create's answer, the worker waits for it: longer than any test takes, so the
# worker never gives up on its own (a timeout is an unknown outcome too, but not the one under test).
PATIENT = {"TICKET_SERVICE_TIMEOUT": "600"}


def ticket_run(
    name: str, service: TicketServiceProcess, env: dict[str, str] | None = None, **scenario: Any
) -> dict[str, Any]:
    scenario = {"title": f"ticket of {name}", "body": "details", "askPriority": False, **scenario}
    return agent_run(
        name,
        "ticket_agent",
        scenario,
        env={**service.env(), **(env or {})},
        retry={**FAST_RETRY, "maxAttempts": 4, "sameErrorLimit": 5},
    )


def side_effects(kube: Kube, namespace: str, run: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = kube.custom.list_namespaced_custom_object(
        GROUP, VERSION, namespace, "sideeffects", label_selector=f"agentrun.dev/run={run}"
    )["items"]
    return items


def kill_worker_during_create(kube: Kube, tickets: TicketServiceProcess, namespace: str, run: str) -> None:
    """SIGKILLs the first worker once the ticket service has received and stored its create, and before
    the worker hears back: the service must hold its answers (holdCreates), until the caller lifts the
    hold. (The ledger's Pending is written before the call, so it says nothing about the service.)"""
    assert tickets.set_faults().get("holdCreates"), "the service must hold the create's answer"
    key = ticket_key(namespace, run)
    wait_for(
        lambda: any(entry["idempotencyKey"] == key for entry in tickets.in_flight()),
        timeout=120,
        what=f"the ticket service holding its answer to the create {key}",
    )
    status = kube.core.read_namespaced_pod(f"{run}-a1", namespace).status
    os.killpg(int(status.container_statuses[0].container_id.removeprefix("process://")), signal.SIGKILL)


def test_ticket_agent_asks_then_opens_one_ticket(
    kube: Kube, run_namespace: str, operator: OperatorProcess, tickets: TicketServiceProcess
) -> None:
    ns = run_namespace
    create_run(kube, ns, ticket_run("ask", tickets, askPriority=True))
    waiting = wait_phase(kube, ns, "ask", {"InputRequired", "Failed"})
    pending = waiting["status"]["pendingRequest"]
    resume(kube, ns, "ask", pending, {"priority": "high"}, key="answer-1")
    run = wait_phase(kube, ns, "ask", {"Succeeded", "Failed"})
    assert run["status"]["phase"] == "Succeeded", operator.log_tail()
    [created] = tickets.creations()
    assert run["status"]["result"] == {
        "ticket": created["ticketId"],
        "priority": "high",
        "executedNow": True,
        "reobserved": True,  # the resumed Attempt looked at the ticket service again
        "ticketSeenOnResume": False,
    }
    assert created["title"] == "[high] ticket of ask"
    [effect] = side_effects(kube, ns, "ask")
    assert (effect["status"]["state"], effect["status"]["externalReference"]) == (
        "Confirmed",
        created["ticketId"],
    )

    # The report follows the ledger (level-based), so read it once it lists the effect.
    report = wait_for(
        lambda: get_run(kube, ns, "ask")["status"]["report"]["effects"], timeout=120, what="the report"
    )
    assert [(e["tool"], e["state"], e["reversible"]) for e in report] == [
        ("create_ticket", "Confirmed", True)
    ]
    assert get_run(kube, ns, "ask")["status"]["sideEffects"] == {
        "confirmed": 1,
        "compensated": 0,
        "unknown": 0,
        "irreversible": 0,
    }


def test_worker_killed_between_the_call_and_its_confirmation_finds_the_ticket_by_key(
    kube: Kube, run_namespace: str, operator: OperatorProcess, tickets: TicketServiceProcess
) -> None:
    ns = run_namespace
    tickets.set_faults(holdCreates=True)
    create_run(kube, ns, ticket_run("crash", tickets, env=PATIENT))
    kill_worker_during_create(kube, tickets, ns, "crash")
    tickets.clear_faults()  # the held answer goes nowhere; the next Attempt looks the ticket up
    run = wait_phase(kube, ns, "crash", {"Succeeded", "Failed", "NeedsReconciliation"})
    assert run["status"]["phase"] == "Succeeded", operator.log_tail()
    assert len(tickets.creations()) == 1, tickets.audit()
    assert run["status"]["result"]["executedNow"] is False, "attempt 2 reused the ticket it found"
    [effect] = side_effects(kube, ns, "crash")
    assert effect["status"]["state"] == "Confirmed"
    assert effect["status"]["resolvedBy"] == "lookup by crash-a2"
    assert [a["status"]["phase"] for a in attempts(kube, ns, "crash")] == ["Failed", "Succeeded"]


def test_unknown_outcome_stops_automation_until_reconciled(
    kube: Kube, run_namespace: str, operator: OperatorProcess, tickets: TicketServiceProcess
) -> None:
    ns = run_namespace
    # Lookups fail from the start, so no Attempt after the kill can find the ticket (the first one never
    # looks it up: it has no record yet, so it executes).
    # The lookup is retried with backoff until the send deadline (a short one here), then gives up.
    tickets.set_faults(holdCreates=True, failLookups=True)
    create_run(kube, ns, ticket_run("unsure", tickets, env=PATIENT, sendDeadlineSeconds=3))
    kill_worker_during_create(kube, tickets, ns, "unsure")
    tickets.set_faults(holdCreates=False)
    run = wait_phase(kube, ns, "unsure", {"Succeeded", "Failed", "NeedsReconciliation"})
    assert run["status"]["phase"] == "NeedsReconciliation", operator.log_tail()
    assert run["status"]["failure"]["class"] == "unknown_side_effect"
    assert run["status"]["failure"]["reason"] == "LookupUnavailable"
    [effect] = side_effects(kube, ns, "unsure")
    assert effect["status"]["state"] == "Unknown"
    assert run["status"]["sideEffects"]["unknown"] == 1
    assert len(tickets.creations()) == 1, "no second ticket"

    # A retry is refused while the outcome is unknown ...
    retry = {"spec": {"retryRequest": {"idempotencyKey": "retry-1", "reason": "lookup is back"}}}
    kube.custom.patch_namespaced_custom_object(GROUP, VERSION, ns, "runs", "unsure", retry)
    wait_for(lambda: get_run(kube, ns, "unsure")["status"].get("controls"), what="retry-1 processed")
    [refused] = get_run(kube, ns, "unsure")["status"]["controls"]
    assert (refused["outcome"], refused["reason"]) == ("Rejected", "UnresolvedSideEffects")

    # ... until a person resolves the effect; then the retry reuses the ticket and never creates one.
    tickets.clear_faults()
    [ticket] = tickets.tickets()
    resolution = {
        "status": {
            "state": "Confirmed",
            "resolvedBy": "alice",
            "externalReference": ticket["id"],
            "result": ticket,
        }
    }
    kube.impersonating("alice").custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, ns, "sideeffects", effect["metadata"]["name"], resolution
    )
    retry = {"spec": {"retryRequest": {"idempotencyKey": "retry-2", "reason": "resolved by alice"}}}
    kube.custom.patch_namespaced_custom_object(GROUP, VERSION, ns, "runs", "unsure", retry)
    run = wait_phase(kube, ns, "unsure", {"Succeeded", "Failed"})
    assert run["status"]["phase"] == "Succeeded", operator.log_tail()
    assert run["status"]["result"]["ticket"] == ticket["id"]
    assert attempts(kube, ns, "unsure")[-1]["spec"]["reason"] == "manual_retry"
    assert len(tickets.creations()) == 1


def test_a_confirmed_effect_is_never_executed_again_across_retries(
    kube: Kube, run_namespace: str, operator: OperatorProcess, tickets: TicketServiceProcess
) -> None:
    ns = run_namespace
    create_run(kube, ns, ticket_run("retries", tickets, failAfterTicket=[1, 2, 3]))
    run = wait_phase(kube, ns, "retries", {"Succeeded", "Failed"}, timeout=120)
    assert run["status"]["phase"] == "Succeeded", operator.log_tail()
    assert len(attempts(kube, ns, "retries")) == 4
    assert [e["event"] for e in tickets.audit()] == ["created"], (
        "no replay either: the SDK never called again"
    )
    assert run["status"]["result"]["executedNow"] is False


@pytest.mark.parametrize("approved", [True, False], ids=["approved", "refused"])
def test_a_gated_action_waits_for_approval_before_it_runs(
    kube: Kube, run_namespace: str, operator: OperatorProcess, tickets: TicketServiceProcess, approved: bool
) -> None:
    ns = run_namespace
    name = "gated" if approved else "refused"
    create_run(kube, ns, ticket_run(name, tickets, requireApproval=True))
    waiting = wait_phase(kube, ns, name, {"AuthRequired", "Failed", "Succeeded"})
    assert waiting["status"]["phase"] == "AuthRequired", operator.log_tail()
    pending = waiting["status"]["pendingRequest"]
    assert pending["reason"] == "auth_required"
    assert "create_ticket" in pending["prompt"]
    assert tickets.creations() == [], "nothing runs before the approval"
    # what is approved, shown with the request: its digest recomputed from it is the one approved
    action = pending["action"]
    assert action["tool"] == "create_ticket"
    assert request_digest(action["tool"], action.get("target"), action["request"]) == action["requestDigest"]
    assert pending["requestId"] == approval_request_id(
        side_effect_name(name, action["idempotencyKey"]), action["requestDigest"]
    )
    resume(kube, ns, name, pending, {"approved": approved, "comment": "checked by alice"}, key="approval")
    done = wait_phase(kube, ns, name, {"Succeeded", "Failed"})
    if not approved:
        assert done["status"]["failure"]["class"] == "deterministic"
        assert "not approved" in done["status"]["failure"]["message"]
        assert tickets.creations() == []
        return
    assert done["status"]["phase"] == "Succeeded", operator.log_tail()
    assert len(tickets.creations()) == 1
    [effect] = side_effects(kube, ns, name)
    assert effect["status"]["approval"]["requestId"] == pending["requestId"]
    assert effect["status"]["state"] == "Confirmed"
    # who approved (the answer's answeredBy, checked by the API server), wherever the approval shows
    assert effect["status"]["approval"]["approvedBy"] == "alice"
    assert [(i["requestId"], i["answeredBy"]) for i in done["status"]["inputs"]] == [
        (pending["requestId"], "alice")
    ]
    [reported] = done["status"]["report"]["effects"]
    assert reported["approvedBy"] == "alice"
