"""Control requests from outside: pause at a step boundary, idempotent resumes, and the races between
resume and cancel."""

from __future__ import annotations

from pathlib import Path

import pytest
from kubernetes.client.exceptions import ApiException

from devcluster.operator import OperatorProcess
from support.agentrun import error_message
from support.kube import Kube, wait_for
from support.runs import (
    attempts,
    controls,
    create_run,
    get_run,
    patch_spec,
    resume,
    resume_patch,
    scenario_run,
    wait_phase,
)

pytestmark = pytest.mark.cluster


def test_pause_stops_at_the_next_step_boundary_and_resume_continues(
    kube: Kube, run_namespace: str, operator: OperatorProcess, tmp_path: Path
) -> None:
    ns, gate = run_namespace, tmp_path / "gate"
    # The agent waits before its third step until the gate opens, so the pause is asked for while the
    # Run is mid-way however slow the machine (not after it has run all six steps).
    scenario = {"steps": 6, "stepSeconds": 0.4, "gate": {"file": str(gate), "atStep": 3}}
    create_run(kube, ns, scenario_run("pausable", scenario))
    wait_for(
        lambda: get_run(kube, ns, "pausable").get("status", {}).get("latestCheckpoint") == "pausable-a1-s2",
        what="the agent at its gate, after its second step",
    )
    patch_spec(kube, ns, "pausable", {"pause": {"requestId": "maintenance-1", "reason": "database upgrade"}})
    gate.touch()
    paused = wait_phase(kube, ns, "pausable", {"Paused", "Succeeded", "Failed"})
    assert paused["status"]["phase"] == "Paused", operator.log_tail()
    pending = paused["status"]["pendingRequest"]
    assert (pending["requestId"], pending["reason"]) == ("maintenance-1", "paused")
    assert pending["checkpointId"] == paused["status"]["latestCheckpoint"]
    steps_done = int(pending["checkpointId"].rsplit("-s", 1)[1])
    assert steps_done < 6, "paused before the end"
    wait_for(lambda: "maintenance-1" in controls(kube, ns, "pausable"), what="the pause recorded")
    assert controls(kube, ns, "pausable")["maintenance-1"]["outcome"] == "Accepted"

    resume(kube, ns, "pausable", paused["status"]["pendingRequest"], {}, key="carry-on")
    done = wait_phase(kube, ns, "pausable", {"Succeeded", "Failed"})
    assert done["status"]["phase"] == "Succeeded", operator.log_tail()
    assert done["status"]["result"]["resumedAt"] == steps_done
    assert attempts(kube, ns, "pausable")[-1]["spec"]["reason"] == "resume:maintenance-1"


def test_the_same_resume_twice_starts_one_attempt_and_a_second_key_is_refused(
    kube: Kube, run_namespace: str, operator: OperatorProcess
) -> None:
    ns = run_namespace
    create_run(kube, ns, scenario_run("twice", {"steps": 2, "ask": {"atStep": 2, "prompt": "Go?"}}))
    waiting = wait_phase(kube, ns, "twice", {"InputRequired", "Failed"})
    resume(kube, ns, "twice", waiting["status"]["pendingRequest"], {"go": True}, key="first")
    wait_for(lambda: "first" in controls(kube, ns, "twice"), what="the first answer recorded")
    # a double click (no change), then a second person, too late
    resume(kube, ns, "twice", waiting["status"]["pendingRequest"], {"go": True}, key="first")
    resume(kube, ns, "twice", waiting["status"]["pendingRequest"], {"go": False}, key="second")
    wait_for(lambda: "second" in controls(kube, ns, "twice"), what="the second answer recorded")
    done = wait_phase(kube, ns, "twice", {"Succeeded", "Failed"})
    recorded = controls(kube, ns, "twice")
    assert recorded["first"]["outcome"] == "Accepted"
    assert (recorded["second"]["outcome"], recorded["second"]["reason"]) in {
        ("Rejected", "NotWaiting"),
        ("Rejected", "UnknownRequest"),
    }
    assert done["status"]["result"]["answer"] == {"go": True}
    assert [i["idempotencyKey"] for i in done["status"]["inputs"]] == ["first"]
    assert len(attempts(kube, ns, "twice")) == 2, "one resume, one Attempt"


def test_cancel_and_resume_together_cancel_wins_and_the_resume_is_refused(
    kube: Kube, run_namespace: str, operator: OperatorProcess
) -> None:
    ns = run_namespace
    create_run(kube, ns, scenario_run("race", {"steps": 2, "ask": {"atStep": 1, "prompt": "Go?"}}))
    waiting = wait_phase(kube, ns, "race", {"InputRequired", "Failed"})
    late = resume_patch(waiting["status"]["pendingRequest"], {"go": True}, "late")
    patch_spec(kube, ns, "race", {"cancelEpoch": 1, **late})
    cancelled = wait_phase(kube, ns, "race", {"Cancelled", "Succeeded", "Failed"})
    assert cancelled["status"]["phase"] == "Cancelled"
    wait_for(lambda: "late" in controls(kube, ns, "race"), what="the resume judged")
    assert (controls(kube, ns, "race")["late"]["outcome"], controls(kube, ns, "race")["late"]["reason"]) == (
        "Rejected",
        "NotWaiting",
    )
    assert len(attempts(kube, ns, "race")) == 1, "no Attempt started after the cancel"
    assert "result" not in get_run(kube, ns, "race")["status"]


def test_a_retry_of_a_running_run_is_refused_with_a_reason(
    kube: Kube, run_namespace: str, operator: OperatorProcess, tmp_path: Path
) -> None:
    ns, gate = run_namespace, tmp_path / "gate"
    # The agent waits before its second step until the gate opens: the retry is judged on a Running Run.
    create_run(kube, ns, scenario_run("busy", {"steps": 4, "gate": {"file": str(gate), "atStep": 2}}))
    wait_phase(kube, ns, "busy", {"Running"})
    patch_spec(kube, ns, "busy", {"retryRequest": {"idempotencyKey": "too-soon", "reason": "impatient"}})
    wait_for(lambda: "too-soon" in controls(kube, ns, "busy"), what="the retry judged")
    refusal = controls(kube, ns, "busy")["too-soon"]
    assert (refusal["op"], refusal["outcome"], refusal["reason"]) == ("Retry", "Rejected", "NotRetryable")
    gate.touch()
    assert wait_phase(kube, ns, "busy", {"Succeeded", "Failed"})["status"]["phase"] == "Succeeded"
    assert len(attempts(kube, ns, "busy")) == 1
    reasons = {
        e.reason for e in kube.core.list_namespaced_event(ns).items if e.involved_object.name == "busy"
    }
    assert "RetryRejected" in reasons


def test_two_people_answering_at_once_one_answer_is_taken_and_the_other_is_told_why(
    kube: Kube, run_namespace: str, operator: OperatorProcess
) -> None:
    ns = run_namespace
    create_run(kube, ns, scenario_run("both", {"steps": 2, "ask": {"atStep": 1, "prompt": "Go?"}}))
    waiting = wait_phase(kube, ns, "both", {"InputRequired", "Failed"})
    assert waiting["status"]["phase"] == "InputRequired", operator.log_tail()
    pending = waiting["status"]["pendingRequest"]
    operator.stop()  # both answers arrive before the operator sees either: the API server decides
    try:
        resume(kube, ns, "both", pending, {"go": True}, key="alice-go", by="alice")
        with pytest.raises(ApiException) as refused:
            resume(kube, ns, "both", pending, {"go": False}, key="bob-no", by="bob")
    finally:
        operator.start()
        operator.wait_ready()
    assert refused.value.status == 422
    message = error_message(refused.value)
    assert (
        f"spec.resume holds an answer to {pending['requestId']} (idempotencyKey alice-go, by alice)"
        in message
    )
    assert "cannot be replaced or removed until its outcome is in status.controls" in message

    done = wait_phase(kube, ns, "both", {"Succeeded", "Failed"})
    assert done["status"]["phase"] == "Succeeded", operator.log_tail()
    assert done["status"]["result"]["answer"] == {"go": True}, "the first answer, never overwritten"
    [answer] = done["status"]["inputs"]
    assert (answer["idempotencyKey"], answer["answeredBy"]) == ("alice-go", "alice")
    recorded = controls(kube, ns, "both")
    assert (recorded["alice-go"]["outcome"], recorded["alice-go"]["requestedBy"]) == ("Accepted", "alice")
    assert "bob-no" not in recorded, "refused by the API server: never written, nothing to judge"


def test_every_control_request_records_who_sent_it(
    kube: Kube, run_namespace: str, operator: OperatorProcess
) -> None:
    ns = run_namespace
    # An agent that runs until it is stopped: the cancel finds it Running however slow the machine.
    create_run(kube, ns, scenario_run("named", {"steps": 1, "fail": {"how": "hang"}}))
    wait_phase(kube, ns, "named", {"Running"})
    carol = kube.impersonating("carol")
    patch_spec(
        carol,
        ns,
        "named",
        {"cancelEpoch": 1, "cancelRequest": {"idempotencyKey": "stop", "requestedBy": "carol"}},
    )
    wait_for(lambda: "stop" in controls(kube, ns, "named"), what="the cancel recorded")
    assert controls(kube, ns, "named")["stop"]["requestedBy"] == "carol"
    wait_phase(kube, ns, "named", {"Cancelled"})
    dave = kube.impersonating("dave")
    patch_spec(dave, ns, "named", {"compensateRequest": {"idempotencyKey": "undo", "requestedBy": "dave"}})
    wait_for(lambda: "undo" in controls(kube, ns, "named"), what="the compensate request recorded")
    assert controls(kube, ns, "named")["undo"]["requestedBy"] == "dave"
