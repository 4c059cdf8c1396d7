"""The operator's side of the identity fence, without a cluster: refusals classified from their message,
Rejected derived from a worker's rejectedCommit, expiresAt on the operator's clock, approvals recorded by
the operator from the Attempt that brought them."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from agentrun.admission import admission_policies
from agentrun.api import Attempt, RejectedCommitReason
from agentrun.core import ledger
from agentrun.core.fence import REFUSAL_CAUSES, refusal_cause
from agentrun.core.plan import PatchAttemptStatus, PatchRunStatus, PatchSideEffectStatus
from agentrun.core.runs import decide
from unit.factories import (
    NOW,
    ended_pod,
    make_attempt,
    make_run,
    make_side_effect,
    make_world,
    of_type,
    pending_request,
    run_status,
    ts,
)

POLICY_PREFIX = (
    "admission webhook denied: ValidatingAdmissionPolicy 'run-status.agentrun.dev' denied request: "
)


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        (
            POLICY_PREFIX + "StaleAfterCancel: Run x has a cancel pending",
            ("StaleAfterCancel", "stale_after_cancel"),
        ),
        (POLICY_PREFIX + "StaleWorker: Run x is Failed", ("StaleWorker", "stale_worker")),
        (
            POLICY_PREFIX + "NotCurrentAttempt: its current Attempt is x-a2",
            ("NotCurrentAttempt", "stale_worker"),
        ),
        (POLICY_PREFIX + "NotOwnRun: Pod y-a1 is not an Attempt of Run x", ("NotOwnRun", None)),
        (POLICY_PREFIX + "NotPodBound: token not bound", ("NotPodBound", None)),
        (POLICY_PREFIX + "NotWorkerField: changes phase", ("NotWorkerField", None)),
        ("the object has been modified; please apply your changes", None),
        ("StaleWorkers are not a cause without the colon", None),
    ],
)
def test_a_refusal_is_classified_from_its_message_alone(
    message: str, expected: tuple[str, Any] | None
) -> None:
    found = refusal_cause(message)
    if expected is None:
        assert found is None
    else:
        cause, reason = expected
        assert found == (cause, None if reason is None else RejectedCommitReason(reason))


def test_every_cause_the_policies_name_is_classified() -> None:
    messages = " ".join(
        v["messageExpression"]
        for doc in admission_policies("system:serviceaccount:ns:op")
        if doc["kind"] == "ValidatingAdmissionPolicy"
        for v in doc["spec"]["validations"]
    )
    named = {cause for cause in REFUSAL_CAUSES if f"'{cause}:" in messages}
    assert named == set(REFUSAL_CAUSES)


def _rejected(attempt: Attempt) -> Attempt:
    status = attempt.status.to_api() | {"rejectedCommit": {"reason": "stale_worker", "message": "late"}}
    return Attempt.model_validate(attempt.to_api() | {"status": status})


@pytest.mark.parametrize(
    ("phase", "marked"),
    [
        ("Running", True),
        ("Failed", True),
        ("LeaseLost", True),
        ("Interrupted", True),
        ("Rejected", False),
        ("Succeeded", False),
    ],
)
def test_the_operator_marks_an_attempt_rejected_from_the_workers_record(phase: str, marked: bool) -> None:
    run = make_run(run_status("Running", current=2, lease_epoch=2))
    world = make_world(run, attempts=[_rejected(make_attempt(1, phase=phase)), make_attempt(2)])
    patches = [a for a in of_type(decide(world), PatchAttemptStatus) if a.patch.get("phase") == "Rejected"]
    assert bool(patches) == marked
    if marked:
        [patch] = patches
        assert patch.name == "triage-a1"
        assert patch.expected_resource_version == "201"


def _interrupted(request: dict[str, Any]) -> dict[str, Any]:
    run = make_run(run_status("Running", current=1, lease_epoch=1, pendingRequest=request))
    world = make_world(run, attempts=[make_attempt(1)], pods=[ended_pod(1, 0)])
    [patch] = [a.patch for a in of_type(decide(world), PatchRunStatus) if "phase" in a.patch]
    return patch


def test_expiry_is_derived_on_the_operators_clock_from_expires_in_seconds() -> None:
    patch = _interrupted(pending_request() | {"expiresInSeconds": 3600})
    assert patch["phase"] == "InputRequired"
    assert patch["pendingRequest"] == {"expiresAt": ts(NOW + timedelta(seconds=3600))}


@pytest.mark.parametrize(
    "request_fields", [{}, {"expiresInSeconds": 60, "expiresAt": ts(NOW + timedelta(seconds=5))}]
)
def test_a_request_without_lifetime_or_with_its_expiry_already_set_keeps_it(
    request_fields: dict[str, Any],
) -> None:
    patch = _interrupted(pending_request() | request_fields)
    assert "pendingRequest" not in patch


def _approval_world(answer: Any, *, approval: dict[str, Any] | None = None) -> Any:
    effect = make_side_effect("k1", "Pending")
    name = str(effect.metadata.name)
    if approval is not None:
        effect = type(effect).model_validate(
            effect.to_api()
            | {"status": (effect.status.to_api() if effect.status else {}) | {"approval": approval}}
        )
    resumed = make_attempt(
        2, reason=f"resume:{ledger.approval_request_id(name)}", input_value=answer, resume_from="ckpt-2"
    )
    run = make_run(run_status("Running", current=2, lease_epoch=2))
    return name, make_world(
        run, attempts=[make_attempt(1, phase="Interrupted"), resumed], side_effects=[effect]
    )


@pytest.mark.parametrize(
    ("answer", "approval", "recorded"),
    [
        ({"approved": True}, None, True),
        ({"approved": True, "comment": "ok"}, None, True),
        ({"approved": False}, None, False),
        ({"approved": "yes"}, None, False),
        ({"approved": True}, {"requestId": "approve-x", "time": ts(NOW)}, False),
    ],
)
def test_the_operator_records_an_approval_from_the_attempt_that_brought_it(
    answer: Any, approval: dict[str, Any] | None, recorded: bool
) -> None:
    name, world = _approval_world(answer, approval=approval)
    writes = of_type(decide(world), PatchSideEffectStatus)
    if not recorded:
        assert writes == []
        return
    assert writes == [
        PatchSideEffectStatus(
            name, {"approval": {"requestId": ledger.approval_request_id(name), "time": ts(NOW)}}
        )
    ]
