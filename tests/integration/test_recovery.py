"""The recovery rule on a real API server and a real ticket service (seed 2): "no success answer only
means the result is invisible, not that the action did not happen". Each test injects one fault and
checks the tickets that exist, the sends the ledger recorded and where the Run ended."""

from __future__ import annotations

from typing import Any

import pytest

from agentrun.examples.ticket_agent import ticket_key
from devcluster.operator import OperatorProcess
from devcluster.tickets import TicketServiceProcess
from integration.test_cli import VERDICT, cli
from integration.test_side_effects import PATIENT, kill_worker_during_create, side_effects, ticket_run
from support.kube import Kube, wait_for
from support.runs import GROUP, VERSION, attempts, create_run, get_run, resume, wait_phase

pytestmark = pytest.mark.cluster


STOPPED = {"Succeeded", "Failed", "NeedsReconciliation", "Cancelled"}


def the_effect(kube: Kube, ns: str, run: str) -> dict[str, Any]:
    [effect] = side_effects(kube, ns, run)
    return effect


def outcomes(effect: dict[str, Any]) -> list[str | None]:
    return [send.get("outcome") for send in effect["status"].get("sends", [])]


def stopped(kube: Kube, ns: str, run: str, operator: OperatorProcess, phase: str) -> dict[str, Any]:
    final = wait_phase(kube, ns, run, STOPPED, timeout=120)
    assert final["status"]["phase"] == phase, (final["status"], operator.log_tail())
    return final


def test_a_create_that_times_out_is_found_by_lookup_and_never_sent_again(
    kube: Kube, run_namespace: str, operator: OperatorProcess, tickets: TicketServiceProcess
) -> None:
    ns = run_namespace
    # The service stores the ticket and holds its answer past the client's timeout (5 s: time enough for
    # a loaded machine's service to store the create before the lookup that follows the timeout).
    tickets.set_faults(holdCreates=True)
    create_run(kube, ns, ticket_run("late", tickets, env={"TICKET_SERVICE_TIMEOUT": "5"}))
    run = stopped(kube, ns, "late", operator, "Succeeded")
    tickets.clear_faults()
    [created] = tickets.creations()
    assert run["status"]["result"]["ticket"] == created["ticketId"]
    effect = the_effect(kube, ns, "late")
    assert (effect["status"]["state"], effect["status"]["externalReference"]) == (
        "Confirmed",
        created["ticketId"],
    )
    assert effect["status"]["resolvedBy"] == "lookup by late-a1", "found by the same Attempt's lookup"
    assert outcomes(effect) == ["Confirmed"], "one send; the lookup confirmed it"
    assert effect["spec"]["operationId"].startswith("op-")
    assert effect["spec"]["requestDigest"].startswith("sha256:")
    assert len(attempts(kube, ns, "late")) == 1


def test_a_create_dropped_before_it_was_stored_is_looked_up_absent_and_sent_again(
    kube: Kube, run_namespace: str, operator: OperatorProcess, tickets: TicketServiceProcess
) -> None:
    ns = run_namespace
    tickets.set_faults(dropCreateRequests=1)
    create_run(kube, ns, ticket_run("dropped", tickets))
    stopped(kube, ns, "dropped", operator, "Succeeded")
    assert len(tickets.creations()) == 1
    effect = the_effect(kube, ns, "dropped")
    assert outcomes(effect) == ["Absent", "Confirmed"], "2 sends, same key; the lookup said absent between"
    assert effect["status"]["resolvedBy"] == "lookup by dropped-a1"


def test_an_irreversible_create_is_never_sent_again_after_an_unknown_outcome(
    kube: Kube, run_namespace: str, operator: OperatorProcess, tickets: TicketServiceProcess
) -> None:
    ns = run_namespace
    tickets.set_faults(dropCreateRequests=1)
    create_run(kube, ns, ticket_run("once", tickets, reversible=False))
    run = stopped(kube, ns, "once", operator, "NeedsReconciliation")
    assert run["status"]["failure"]["reason"] == "IrreversibleUnknown"
    assert tickets.creations() == []
    effect = the_effect(kube, ns, "once")
    assert (effect["status"]["state"], outcomes(effect)) == ("Unknown", ["Absent"])

    # A person checked: it did not happen. One command records it and continues the Run; the next Attempt
    # sends again with the same key, with a fresh maxSends.
    name = effect["metadata"]["name"]
    resolved = cli(
        kube,
        ns,
        "resolve-effect",
        name,
        "--absent",
        "--reason",
        "no ticket in the tool",
        "--retry",
        "--timeout",
        VERDICT,
    )
    assert resolved.returncode == 0, resolved.stderr
    assert "Absent: it did not happen" in resolved.stdout
    stopped(kube, ns, "once", operator, "Succeeded")
    assert len(tickets.creations()) == 1
    effect = the_effect(kube, ns, "once")
    status = effect["status"]
    assert (status["state"], status["resolution"], status["resolvedSends"]) == ("Confirmed", "Absent", 1)
    assert status["resolutionMessage"] == "no ticket in the tool"
    assert outcomes(effect) == ["Absent", "Confirmed"]
    assert attempts(kube, ns, "once")[-1]["spec"]["reason"] == "manual_retry"


def test_someone_elses_ticket_under_the_key_is_a_conflict(
    kube: Kube, run_namespace: str, operator: OperatorProcess, tickets: TicketServiceProcess
) -> None:
    ns = run_namespace
    tickets.create(ticket_key(ns, "clash"), "not ours", "someone else's")
    tickets.set_faults(dropCreateRequests=1)
    create_run(kube, ns, ticket_run("clash", tickets))
    run = stopped(kube, ns, "clash", operator, "NeedsReconciliation")
    assert run["status"]["failure"]["reason"] == "ConflictingResults"
    assert len(tickets.creations()) == 1, "only someone else's"
    effect = the_effect(kube, ns, "clash")
    assert effect["status"]["state"] == "Unknown"
    assert "other content" in effect["status"]["conflict"]["message"]


def test_a_429_is_sent_again_with_the_same_key_and_never_fails_the_record(
    kube: Kube, run_namespace: str, operator: OperatorProcess, tickets: TicketServiceProcess
) -> None:
    ns = run_namespace
    tickets.set_faults(rateLimitCreates=1, rateLimitRetryAfter=0)
    create_run(kube, ns, ticket_run("slow", tickets))
    stopped(kube, ns, "slow", operator, "Succeeded")
    assert len(tickets.creations()) == 1
    effect = the_effect(kube, ns, "slow")
    assert (effect["status"]["state"], outcomes(effect)) == ("Confirmed", ["Failed", "Confirmed"])
    assert len(attempts(kube, ns, "slow")) == 1, "re-sent inside the Attempt"


def test_max_sends_exhausted_stops_for_reconciliation(
    kube: Kube, run_namespace: str, operator: OperatorProcess, tickets: TicketServiceProcess
) -> None:
    ns = run_namespace
    tickets.set_faults(rateLimitCreates=10, rateLimitRetryAfter=0)
    create_run(kube, ns, ticket_run("spent", tickets, maxSends=2))
    run = stopped(kube, ns, "spent", operator, "NeedsReconciliation")
    assert run["status"]["failure"]["reason"] == "MaxSendsReached"
    assert tickets.creations() == []
    effect = the_effect(kube, ns, "spent")
    assert outcomes(effect) == ["Failed", "Failed"]
    assert effect["status"]["state"] == "Pending", (
        "the record stays as it is: nothing happened, nothing is unknown"
    )


def test_a_cancel_during_the_send_leaves_the_record_unknown_not_pending(
    kube: Kube, run_namespace: str, operator: OperatorProcess, tickets: TicketServiceProcess
) -> None:
    ns = run_namespace
    tickets.set_faults(holdCreates=True)
    create_run(kube, ns, ticket_run("stop", tickets, env=PATIENT))
    key = ticket_key(ns, "stop")
    wait_for(
        lambda: any(entry["idempotencyKey"] == key for entry in tickets.in_flight()),
        timeout=120,
        what="the ticket service holding its answer to the create",
    )
    kube.custom.patch_namespaced_custom_object(
        GROUP, VERSION, ns, "runs", "stop", {"spec": {"cancelEpoch": 1}}
    )
    stopped(kube, ns, "stop", operator, "Cancelled")
    effect = wait_for(
        lambda: (e := the_effect(kube, ns, "stop"))["status"]["state"] != "Pending" and e,
        timeout=120,
        what="the in-flight record settled",
    )
    tickets.clear_faults()
    assert effect["status"]["state"] == "Unknown"
    assert outcomes(effect) in ([None], ["Unknown"]), "the send stays what it was: maybe"
    listed = cli(kube, ns, "effects", "stop")
    assert "Unknown" in listed.stdout, listed.stdout
    report = wait_for(
        lambda: get_run(kube, ns, "stop")["status"].get("report", {}).get("effects"), what="the report"
    )
    assert [e["state"] for e in report] == ["Unknown"]
    assert "cancel" in report[0]["note"]


def test_an_approval_of_one_request_does_not_approve_another_under_the_same_key(
    kube: Kube, run_namespace: str, operator: OperatorProcess, tickets: TicketServiceProcess
) -> None:
    ns = run_namespace
    body = ticket_run("gate", tickets, reversible=False, planFromInput=True, title="first")
    body["spec"]["approvals"] = {"irreversible": True}
    create_run(kube, ns, body)
    first = wait_phase(kube, ns, "gate", {"AuthRequired"} | STOPPED)["status"]
    assert first["phase"] == "AuthRequired", operator.log_tail()
    assert tickets.creations() == [], "an irreversible action waits for approval before its first send"
    # The input changes before the answer: the next Attempt asks for another request, same key.
    scenario = {**body["spec"]["input"], "title": "second"}
    kube.custom.patch_namespaced_custom_object(
        GROUP, VERSION, ns, "runs", "gate", {"spec": {"input": scenario}}
    )
    answer(kube, ns, "gate", first["pendingRequest"], "approve-1")
    second = wait_for(
        lambda: (
            (s := get_run(kube, ns, "gate")["status"]).get("phase") in {"AuthRequired"} | STOPPED
            and s.get("pendingRequest", {}).get("requestId") != first["pendingRequest"]["requestId"]
            and s
        ),
        timeout=120,
        what="a second approval request",
    )
    assert second["phase"] == "AuthRequired", operator.log_tail()
    assert tickets.creations() == [], "the first approval did not approve the second request"
    answer(kube, ns, "gate", second["pendingRequest"], "approve-2")
    stopped(kube, ns, "gate", operator, "Succeeded")
    [created] = tickets.creations()
    assert created["title"].endswith("second")
    effect = the_effect(kube, ns, "gate")
    approval = wait_for(lambda: the_effect(kube, ns, "gate")["status"].get("approval"), what="the approval")
    assert approval["requestId"] == second["pendingRequest"]["requestId"]
    assert approval["requestDigest"] == effect["spec"]["requestDigest"]


def answer(kube: Kube, ns: str, run: str, pending: dict[str, Any], key: str) -> None:
    resume(kube, ns, run, pending, {"approved": True}, key=key)


def test_the_same_key_with_another_request_is_refused_and_never_sent(
    kube: Kube, run_namespace: str, operator: OperatorProcess, tickets: TicketServiceProcess
) -> None:
    ns = run_namespace
    tickets.set_faults(holdCreates=True)
    body = ticket_run("reuse", tickets, env=PATIENT, planFromInput=True, title="first", failAfterTicket=[1])
    create_run(kube, ns, body)
    key = ticket_key(ns, "reuse")
    wait_for(
        lambda: any(e["idempotencyKey"] == key for e in tickets.in_flight()), timeout=120, what="the create"
    )
    # While the first request is in flight, the input changes: the next Attempt asks another request.
    scenario = {**body["spec"]["input"], "title": "second"}
    kube.custom.patch_namespaced_custom_object(
        GROUP, VERSION, ns, "runs", "reuse", {"spec": {"input": scenario}}
    )
    tickets.clear_faults()
    run = stopped(kube, ns, "reuse", operator, "Failed")
    assert run["status"]["failure"]["reason"] == "IdempotencyKeyReused"
    assert [c["title"] for c in tickets.creations()] == ["[normal] first"], (
        "the second request was never sent"
    )
    assert outcomes(the_effect(kube, ns, "reuse")) == ["Confirmed"]


def test_a_cancelled_run_whose_worker_died_mid_send_has_its_record_marked_unknown_by_the_operator(
    kube: Kube, run_namespace: str, operator: OperatorProcess, tickets: TicketServiceProcess
) -> None:
    ns = run_namespace
    tickets.set_faults(holdCreates=True)
    body = ticket_run("gone", tickets, env=PATIENT)
    body["spec"]["retry"]["backoff"] = {"initialSeconds": 600, "factor": 1.0, "maxSeconds": 600}  # no retry
    create_run(kube, ns, body)
    kill_worker_during_create(kube, tickets, ns, "gone")  # SIGKILL: the SDK writes nothing more
    kube.custom.patch_namespaced_custom_object(
        GROUP, VERSION, ns, "runs", "gone", {"spec": {"cancelEpoch": 1}}
    )
    stopped(kube, ns, "gone", operator, "Cancelled")
    effect = wait_for(
        lambda: (e := the_effect(kube, ns, "gone"))["status"]["state"] == "Unknown" and e,
        timeout=120,
        what="the operator marking the in-flight record Unknown",
    )
    tickets.clear_faults()
    assert outcomes(effect) == [None], "the send stays in flight: nobody heard its answer"
    last = effect["status"]["history"][-1]
    assert "in flight when the Run was cancelled" in last["message"] and "attempt" not in last

    def reported_unknown() -> list[dict[str, Any]] | None:
        """The report's effects once they name the record Unknown: the report written with the Cancelled
        phase may precede the record's change, which brings it up to date."""
        effects: list[dict[str, Any]] = (
            get_run(kube, ns, "gone")["status"].get("report", {}).get("effects") or []
        )
        return effects if [e["state"] for e in effects] == ["Unknown"] else None

    report = wait_for(reported_unknown, timeout=120, what="the report naming the record Unknown")
    assert [e["state"] for e in report] == ["Unknown"] and "cancelled" in report[0]["note"]
    assert get_run(kube, ns, "gone")["status"]["sideEffects"]["unknown"] == 1
