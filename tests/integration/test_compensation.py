"""Compensation that runs, on a real API server and a real ticket service: a cancel, a final failure or a
person's request undoes the Run's ticket by closing it, exactly once, through the ledger (key
<key>:compensate), even when the compensation Attempt is killed midway."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.rest import ApiException

from agentrun.core.ledger import compensation_key, side_effect_name
from agentrun.examples.ticket_agent import ticket_key
from devcluster.operator import OperatorProcess
from devcluster.tickets import TicketServiceProcess
from integration.test_cli import VERDICT, cli
from integration.test_side_effects import PATIENT, side_effects, ticket_run
from support.kube import Kube, wait_for
from support.runs import GROUP, VERSION, attempts, create_run, get_run, wait_phase

pytestmark = pytest.mark.cluster

STOPPED = {"Succeeded", "Failed", "Cancelled", "NeedsReconciliation"}


def compensating_run(
    name: str,
    tickets: TicketServiceProcess,
    compensation: dict[str, Any] | None = None,
    *,
    max_attempts: int | None = None,
    env: dict[str, str] | None = None,
    **scenario: Any,
) -> dict[str, Any]:
    manifest = ticket_run(name, tickets, env=env, **scenario)
    if compensation is not None:
        manifest["spec"]["compensation"] = compensation
    if max_attempts is not None:
        manifest["spec"]["retry"]["maxAttempts"] = max_attempts
    return manifest


def ended(kube: Kube, ns: str, name: str, operator: OperatorProcess, phase: str) -> dict[str, Any]:
    run = wait_phase(kube, ns, name, STOPPED, timeout=120)
    assert run["status"]["phase"] == phase, (run["status"], operator.log_tail())
    return run


def records(kube: Kube, ns: str, name: str) -> dict[str, dict[str, Any]]:
    """The Run's SideEffects by idempotency key."""
    return {e["spec"]["idempotencyKey"]: e for e in side_effects(kube, ns, name)}


def cancel(kube: Kube, ns: str, name: str) -> None:
    kube.custom.patch_namespaced_custom_object(GROUP, VERSION, ns, "runs", name, {"spec": {"cancelEpoch": 1}})


def assert_closed_once(kube: Kube, ns: str, name: str, tickets: TicketServiceProcess) -> None:
    """One ticket, closed by exactly one close (no close ever arrived twice), and the ledger says so: the
    effect Compensated, its compensation's record Confirmed, the report listing it as compensated."""
    [ticket] = tickets.tickets()
    assert ticket["status"] == "closed"
    closes = tickets.closes()
    assert [(c["event"], c["ticketId"]) for c in closes] == [("closed", ticket["id"])], tickets.audit()
    key = ticket_key(ns, name)
    ledger = records(kube, ns, name)
    assert ledger[key]["status"]["state"] == "Compensated"
    undo = ledger[compensation_key(key)]
    assert (undo["spec"]["tool"], undo["spec"]["step"], undo["status"]["state"]) == (
        "close_ticket",
        "compensate",
        "Confirmed",
    )
    assert closes[0]["closeKey"] == f"{key}:close"
    run = wait_for(
        lambda: (r := get_run(kube, ns, name))["status"].get("report", {}).get("compensated") and r,
        timeout=120,
        what="the report listing the compensated ticket",
    )
    report = run["status"]["report"]
    assert report["compensated"] == [side_effect_name(name, key)]
    assert (report["happened"], report["cannotBeUndone"], report["unknown"]) == ([], [], [])
    assert [e["tool"] for e in report["effects"]] == ["create_ticket"], (
        "a compensation is no effect of its own"
    )
    assert run["status"]["sideEffects"] == {"confirmed": 0, "compensated": 1, "unknown": 0, "irreversible": 0}
    assert "compensating" not in run["status"]


def as_worker(kube: Kube, pid: int) -> Kube:
    """The cluster as the worker process `pid` sees it: its Pod-bound token (its KUBECONFIG)."""
    env = Path(f"/proc/{pid}/environ").read_bytes().decode().split("\0")
    kubeconfig = dict(item.split("=", 1) for item in env if "=" in item)["KUBECONFIG"]
    return Kube(Path(kubeconfig), kube.kubectl_path)


def committed(lease_epoch: int) -> dict[str, Any]:
    return {"attempt": "killed-a2", "leaseEpoch": lease_epoch, "cancelEpoch": 1}


def reasons_and_phases(kube: Kube, ns: str, name: str) -> list[tuple[str, str]]:
    return [(a["spec"]["reason"], a["status"]["phase"]) for a in attempts(kube, ns, name)]


def test_a_cancel_with_on_cancel_compensate_closes_the_ticket_exactly_once(
    kube: Kube, run_namespace: str, operator: OperatorProcess, tickets: TicketServiceProcess
) -> None:
    ns = run_namespace
    create_run(kube, ns, compensating_run("undo", tickets, {"onCancel": "Compensate"}, askAfterTicket=True))
    waiting = wait_phase(kube, ns, "undo", {"InputRequired", *STOPPED})
    assert waiting["status"]["phase"] == "InputRequired", operator.log_tail()
    assert len(tickets.creations()) == 1
    cancel(kube, ns, "undo")
    run = ended(kube, ns, "undo", operator, "Cancelled")
    assert_closed_once(kube, ns, "undo", tickets)
    assert reasons_and_phases(kube, ns, "undo") == [("initial", "Interrupted"), ("compensate", "Succeeded")]
    assert run["status"]["observedCancelEpoch"] == 1
    # A cancelled Run stays so: its cancelEpoch is frozen, and nothing compensates twice.
    assert cli(kube, ns, "compensate", "undo", "--timeout", VERDICT).returncode == 0
    assert len(attempts(kube, ns, "undo")) == 2
    assert len(tickets.closes()) == 1


def test_a_compensation_attempt_killed_midway_is_retried_and_still_closes_once(
    kube: Kube, run_namespace: str, operator: OperatorProcess, tickets: TicketServiceProcess
) -> None:
    ns = run_namespace
    manifest = compensating_run(
        "killed", tickets, {"onCancel": "Compensate"}, env=PATIENT, askAfterTicket=True
    )
    create_run(kube, ns, manifest)
    assert wait_phase(kube, ns, "killed", {"InputRequired", *STOPPED})["status"]["phase"] == "InputRequired"
    tickets.set_faults(holdCloses=True)
    cancel(kube, ns, "killed")
    # The close reached the service and was applied; its answer is held: the worker cannot tell yet.
    wait_for(
        lambda: any(entry["op"] == "close" for entry in tickets.in_flight()),
        timeout=120,
        what="the ticket service holding its answer to the close",
    )
    during = get_run(kube, ns, "killed")["status"]
    assert during["phase"] == "Compensating"
    pod = kube.core.read_namespaced_pod("killed-a2", ns).status
    pid = int(pod.container_statuses[0].container_id.removeprefix("process://"))
    # The compensation Attempt's own credentials may not write the Run (it needs to write nothing there).
    forged = {"result": {"ticket": "forged"}, "committedBy": committed(during["leaseEpoch"])}
    with pytest.raises(ApiException) as refused:
        as_worker(kube, pid).custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, ns, "runs", "killed", {"status": forged}
        )
    assert refused.value.status == 403 and "StaleWorker: Run killed is Compensating" in str(
        refused.value.body
    )
    os.killpg(pid, signal.SIGKILL)
    tickets.clear_faults()  # the held answer goes nowhere; the next compensation Attempt looks it up
    ended(kube, ns, "killed", operator, "Cancelled")
    assert_closed_once(kube, ns, "killed", tickets)
    assert reasons_and_phases(kube, ns, "killed") == [
        ("initial", "Interrupted"),
        ("compensate", "Failed"),
        ("compensate", "Succeeded"),
    ]
    undo = records(kube, ns, "killed")[compensation_key(ticket_key(ns, "killed"))]
    assert undo["status"]["resolvedBy"] == "lookup by killed-a3", "found closed, never sent again"
    assert [s["attempt"] for s in undo["status"]["sends"]] == ["killed-a2"]


def test_a_final_failure_with_on_failure_compensate_closes_once_and_stays_failed(
    kube: Kube, run_namespace: str, operator: OperatorProcess, tickets: TicketServiceProcess
) -> None:
    ns = run_namespace
    manifest = compensating_run(
        "failing", tickets, {"onFailure": "Compensate"}, max_attempts=1, failAfterTicket=[1]
    )
    create_run(kube, ns, manifest)
    run = ended(kube, ns, "failing", operator, "Failed")
    assert_closed_once(kube, ns, "failing", tickets)
    assert reasons_and_phases(kube, ns, "failing") == [("initial", "Failed"), ("compensate", "Succeeded")]
    assert run["status"]["failure"]["class"] == "transient", "the failure that ended the Run stays"


def test_a_compensate_request_on_a_succeeded_run_closes_once_and_it_stays_succeeded(
    kube: Kube, run_namespace: str, operator: OperatorProcess, tickets: TicketServiceProcess
) -> None:
    ns = run_namespace
    create_run(kube, ns, compensating_run("done", tickets))
    before = ended(kube, ns, "done", operator, "Succeeded")
    compensate = ["compensate", "done", "--effect", ticket_key(ns, "done"), "--wait", "--timeout", VERDICT]
    out = cli(kube, ns, *compensate)
    assert out.returncode == 0, (out.stdout, out.stderr, operator.log_tail())
    run = ended(kube, ns, "done", operator, "Succeeded")
    assert_closed_once(kube, ns, "done", tickets)
    assert run["status"]["result"] == before["status"]["result"]
    [record] = [c for c in run["status"]["controls"] if c["op"] == "Compensate"]
    assert (record["outcome"], record["reason"]) == ("Accepted", "Accepted")
    assert reasons_and_phases(kube, ns, "done") == [("initial", "Succeeded"), ("compensate", "Succeeded")]
    # The same request again changes nothing; a key no effect has is refused.
    request = {"idempotencyKey": record["idempotencyKey"], "effects": [ticket_key(ns, "done")]}
    kube.custom.patch_namespaced_custom_object(
        GROUP, VERSION, ns, "runs", "done", {"spec": {"compensateRequest": request}}
    )
    unknown = {"idempotencyKey": "undo-nothing", "effects": ["no-such-key"]}
    kube.custom.patch_namespaced_custom_object(
        GROUP, VERSION, ns, "runs", "done", {"spec": {"compensateRequest": unknown}}
    )
    refused = wait_for(
        lambda: next(
            (
                c
                for c in get_run(kube, ns, "done")["status"]["controls"]
                if c["idempotencyKey"] == "undo-nothing"
            ),
            None,
        ),
        timeout=120,
        what="undo-nothing judged",
    )
    assert (refused["outcome"], refused["reason"]) == ("Rejected", "UnknownEffect")
    assert len(attempts(kube, ns, "done")) == 2
    assert len(tickets.closes()) == 1


def test_a_record_that_cannot_be_settled_needs_reconciliation_then_a_request_completes_it(
    kube: Kube, run_namespace: str, operator: OperatorProcess, tickets: TicketServiceProcess
) -> None:
    ns = run_namespace
    tickets.set_faults(holdCreates=True, failLookups=True)
    manifest = compensating_run("open", tickets, {"onCancel": "Compensate", "maxAttempts": 1}, env=PATIENT)
    create_run(kube, ns, manifest)
    key = ticket_key(ns, "open")
    wait_for(
        lambda: any(entry["idempotencyKey"] == key for entry in tickets.in_flight()),
        timeout=120,
        what="the ticket service holding its answer to the create",
    )
    cancel(kube, ns, "open")
    wait_for(
        lambda: records(kube, ns, "open")[key].get("status", {}).get("state") == "Unknown",
        timeout=120,
        what="the cancelled send recorded Unknown",
    )
    tickets.set_faults(holdCreates=False)  # the cancelled worker's call returns; lookups still fail
    run = ended(kube, ns, "open", operator, "NeedsReconciliation")
    assert (run["status"]["failure"]["reason"], run["status"]["compensating"]["returnPhase"]) == (
        "CompensationIncomplete",
        "Cancelled",
    )
    assert records(kube, ns, "open")[key]["status"]["state"] == "Unknown"
    assert tickets.closes() == []
    assert len(tickets.creations()) == 1
    retry = cli(kube, ns, "retry", "open", "--timeout", VERDICT)
    assert retry.returncode != 0 and "CompensationIncomplete" in retry.stdout, retry.stdout

    # The lookups work again: a person asks once more; the create is found, its ticket closed.
    tickets.clear_faults()
    out = cli(kube, ns, "compensate", "open", "--wait", "--timeout", VERDICT)
    assert out.returncode == 0, (out.stdout, out.stderr, operator.log_tail())
    ended(kube, ns, "open", operator, "Cancelled")
    assert_closed_once(kube, ns, "open", tickets)
    assert records(kube, ns, "open")[key]["status"]["resolvedBy"] == "lookup by open-a3"
