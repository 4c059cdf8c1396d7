"""core.runs: side effects in the status, resume, manual retry, pause, checkpoint retention, conditions
and the Plan.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import pytest

from agentrun.api import (
    FailureClass,
    RunPhase,
    json_digest,
)
from agentrun.core import controls, report
from agentrun.core.conditions import conditions_for
from agentrun.core.plan import (
    CreateAttempt,
    DeleteCheckpoint,
    DeletePod,
    PatchRunStatus,
    Plan,
    RecordEvent,
    WriteLease,
)
from agentrun.core.runs import World, decide
from agentrun.core.runs.transition import Transition
from unit.factories import (
    EARLIER,
    GENERATION,
    LEASE_RESOURCE_VERSION,
    LEASE_SECONDS,
    NO_SIDE_EFFECTS,
    NOW,
    RUN,
    committed_by,
    events,
    failed_attempt,
    kinds,
    make_attempt,
    make_lease,
    make_run,
    make_side_effect,
    make_world,
    name_of,
    of_type,
    pending_request,
    run_patch,
    run_status,
    ts,
)
from unit.run_worlds import (
    CHAIN,
    CHECKPOINT,
    COMMITTED,
    CONDITION_FACTS,
    CONDITION_TYPES,
    EFFECT_COUNTS,
    EFFECTS,
    GRANT,
    PAUSED,
    RECORD,
    SCHEMA,
    UNKNOWN_EFFECT,
    WAITING,
    at_rest,
    backing_off,
    ended,
    expiring_at,
    merge,
    pause_spec,
    record,
    resume,
    retry_spec,
    stopped,
    supervising,
    waiting,
    with_checkpoints,
)

# ---- side effects in the status ----------------------------------------------------------------------------


def test_the_report_of_a_stopped_run() -> None:
    world = replace(supervising(pod=ended(1, 0), **COMMITTED), side_effects=tuple(reversed(EFFECTS)))
    patch = run_patch(decide(world))

    assert patch["report"] == {
        "effects": [
            {
                "name": EFFECTS[0].metadata.name,
                "tool": "create_ticket",
                "state": "Confirmed",
                "externalReference": "T-1",
                "reversible": False,
            },
            {
                "name": EFFECTS[1].metadata.name,
                "tool": "send_mail",
                "state": "Compensated",
                "reversible": True,
            },
            {
                "name": EFFECTS[2].metadata.name,
                "tool": "refund",
                "target": "order-7",
                "state": "Unknown",
                "reversible": False,
            },
        ],
        "omitted": 0,
        "happened": [EFFECTS[0].metadata.name],
        "compensated": [EFFECTS[1].metadata.name],
        "cannotBeUndone": [EFFECTS[0].metadata.name],
        "unknown": [EFFECTS[2].metadata.name],
    }


@pytest.mark.parametrize("phase", ["Succeeded", "Cancelled", "Failed", "NeedsReconciliation"])
def test_a_stopped_run_refreshes_its_report_only(phase: str) -> None:
    world = replace(at_rest(phase, sideEffects={**NO_SIDE_EFFECTS, "unknown": 1}), side_effects=EFFECTS)
    plan = decide(world)

    assert plan.actions == [
        PatchRunStatus({"sideEffects": EFFECT_COUNTS, "report": report.run_report(EFFECTS)})
    ]
    assert plan.requeue_after is None
    refreshed = make_run(run_status(phase, current=1, lease_epoch=1, sideEffects=EFFECT_COUNTS))
    assert decide(replace(world, run=refreshed)).actions == [], "once in step, nothing more"


# ---- resume ------------------------------------------------------------------------------------------------


def test_resume_accepted() -> None:
    world = waiting(request={**WAITING, "acceptedSchema": SCHEMA}, spec=resume({"choice": "b"}))
    plan = decide(world)
    patch = run_patch(plan)
    create = of_type(plan, CreateAttempt)[0].body["spec"]

    assert of_type(plan, WriteLease) == [WriteLease(name_of(2), 2, LEASE_SECONDS, LEASE_RESOURCE_VERSION)]
    assert (patch["phase"], patch["currentAttempt"], patch["leaseEpoch"]) == ("Running", 2, 2)
    assert patch["pendingRequest"] is None
    assert patch["controls"] == [
        {
            "idempotencyKey": "answer-1",
            "op": "Resume",
            "digest": json_digest(
                {"requestId": "req-1", "checkpointId": CHECKPOINT, "value": {"choice": "b"}}
            ),
            "outcome": "Accepted",
            "reason": "Accepted",
            "message": "answer to req-1 accepted",
            "time": ts(NOW),
        }
    ]
    assert patch["inputs"] == [
        {
            "requestId": "req-1",
            "checkpointId": CHECKPOINT,
            "digest": json_digest({"choice": "b"}),
            "idempotencyKey": "answer-1",
            "time": ts(NOW),
            "reason": "input_required",
        }
    ]
    kept = {"requestId": "req-1", "idempotencyKey": "answer-1", "value": {"choice": "b"}}
    assert patch["acceptedInput"] == kept
    assert patch["spentKeys"] == [
        {"key": "answer-1", "op": "Resume", "digest": controls.short_digest(patch["controls"][0]["digest"])}
    ]
    assert create == {
        "runName": RUN,
        "number": 2,
        "leaseEpoch": 2,
        "cancelEpoch": 0,
        "reason": "resume:req-1",
        "resumeFrom": CHECKPOINT,
        "input": {"choice": "b"},
    }
    assert ("Normal", "ResumeAccepted") in events(plan)


def test_resume_keeps_earlier_records() -> None:
    earlier = [record("answer-0", "Resume", "Rejected", "UnknownRequest"), record("pause-1", "Pause")]
    inputs = [
        {
            "requestId": "req-0",
            "checkpointId": "ckpt-1",
            "digest": json_digest(1),
            "idempotencyKey": "a0",
            "time": ts(EARLIER),
        }
    ]
    patch = run_patch(decide(waiting(spec=resume(), controls=earlier, inputs=inputs)))

    assert [c["idempotencyKey"] for c in patch["controls"]] == ["answer-0", "pause-1", "answer-1"]
    assert [i["requestId"] for i in patch["inputs"]] == ["req-0", "req-1"]


REFUSED_RESUMES: dict[str, tuple[World, str, str]] = {
    "running": (
        replace(supervising(), run=make_run(supervising().run.status.to_api(), spec=resume())),
        "NotWaiting",
        "not waiting",
    ),
    "failed-over-to-backoff": (
        backing_off(spec=resume(), due=NOW + timedelta(seconds=9)),
        "NotWaiting",
        "RetryBackoff",
    ),
    "waiting-without-a-request": (
        make_world(make_run(run_status("InputRequired", current=1, lease_epoch=1), spec=resume())),
        "NotWaiting",
        "not waiting",
    ),
    "another-request": (waiting(spec=resume(request_id="req-0")), "UnknownRequest", "req-0"),
    "another-checkpoint": (waiting(spec=resume(checkpoint="ckpt-1")), "StaleCheckpoint", "ckpt-1"),
    "checkpoint-moved-on": (waiting(spec=resume(), latestCheckpoint="ckpt-3"), "StaleCheckpoint", CHECKPOINT),
    "expired": (
        waiting(request=expiring_at(NOW - timedelta(seconds=5)), spec=resume()),
        "RequestExpired",
        "expired",
    ),
    "not-an-allowed-value": (
        waiting(request={**WAITING, "acceptedSchema": SCHEMA}, spec=resume({"choice": "z"})),
        "SchemaMismatch",
        "value at choice: 'z' is not one of ['a', 'b']",
    ),
    "missing-field": (
        waiting(request={**WAITING, "acceptedSchema": SCHEMA}, spec=resume({"pick": "a"})),
        "SchemaMismatch",
        "'choice' is a required property",
    ),
    "wrong-type": (
        waiting(request={**WAITING, "acceptedSchema": SCHEMA}, spec=resume("a")),
        "SchemaMismatch",
        "'a' is not of type 'object'",
    ),
    "invalid-schema": (
        waiting(request={**WAITING, "acceptedSchema": {"type": "no-such-type"}}, spec=resume()),
        "SchemaMismatch",
        "schema is invalid",
    ),
}


@pytest.mark.parametrize(("world", "reason", "says"), REFUSED_RESUMES.values(), ids=REFUSED_RESUMES.keys())
def test_resume_refused(world: World, reason: str, says: str) -> None:
    """A refused resume is recorded with its reason and a Warning; the Run is left exactly as it was."""
    plan = decide(world)

    assert [type(a) for a in plan.actions] == [PatchRunStatus, RecordEvent]
    patch = run_patch(plan)
    assert set(patch) == {"controls", "observedGeneration", "spentKeys"}
    assert patch["observedGeneration"] == GENERATION
    (entry,) = [c for c in patch["controls"] if c["idempotencyKey"] == "answer-1"]
    assert (entry["op"], entry["outcome"], entry["reason"]) == ("Resume", "Rejected", reason)
    assert says in entry["message"]
    assert entry["time"] == ts(NOW)
    assert events(plan) == [("Warning", "ResumeRejected")]
    assert says in of_type(plan, RecordEvent)[0].message


def test_a_refused_resume_then_the_request_expires() -> None:
    """Recorded first, then the next decision (the record written) fails the Run: input_expired."""
    world = waiting(request=expiring_at(NOW - timedelta(seconds=5)), spec=resume())
    refused = run_patch(decide(world))
    after = replace(world, run=make_run(merge(world.run.status.to_api(), refused), spec=resume()))
    patch = run_patch(decide(after))

    assert patch["phase"] == "Failed"
    assert patch["failure"]["class"] == "input_expired"
    assert patch["failure"]["reason"] == "RequestExpired"
    assert "req-1" in patch["message"]


def test_request_expired() -> None:
    plan = decide(waiting(request=expiring_at(NOW - timedelta(minutes=3))))
    patch = run_patch(plan)

    assert patch["failure"] == {
        "class": "input_expired",
        "reason": "RequestExpired",
        "message": f"nobody answered request req-1 before {NOW - timedelta(minutes=3)}",
    }
    assert patch["report"] == report.run_report([])
    assert ("Warning", "RequestExpired") in events(plan)
    assert of_type(plan, WriteLease) == [], "a waiting Run holds no worker to fence off"


# ---- manual retry ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("world", "resume_from"),
    [
        (stopped(spec=retry_spec()), CHECKPOINT),
        (stopped(spec=retry_spec(from_checkpoint="ckpt-1"), checkpoints=CHAIN[:2]), "ckpt-1"),
        # Revoked at epoch 2 (a deadline, a lost lease) and recorded: that epoch is given out, not bumped.
        (replace(stopped(spec=retry_spec(), leaseEpoch=2), lease=make_lease(None, 2)), CHECKPOINT),
        (stopped(spec=retry_spec(), latestCheckpoint=None), None),
    ],
    ids=["from-the-latest", "from-a-named-checkpoint", "after-a-revocation", "from-the-beginning"],
)
def test_manual_retry_accepted(world: World, resume_from: str | None) -> None:
    status = world.run.status.to_api()
    status["failure"] = {"class": "deterministic", "reason": "NotRetryable", "message": "boom"}
    status["pendingRequest"] = WAITING  # left over, e.g. from a request that expired
    plan = decide(replace(world, run=make_run(status, spec=world.run.spec.to_api())))
    patch = run_patch(plan)
    spec = of_type(plan, CreateAttempt)[0].body["spec"]

    assert of_type(plan, WriteLease) == [WriteLease(name_of(2), 2, LEASE_SECONDS, LEASE_RESOURCE_VERSION)]
    assert (patch["phase"], patch["currentAttempt"], patch["attempts"], patch["leaseEpoch"]) == (
        "Running",
        2,
        2,
        2,
    )
    assert patch["failure"] is None, "the failure is cleared"
    assert patch["pendingRequest"] is None, "a request left from before is not the new Attempt's"
    assert patch.get("latestCheckpoint") == (resume_from if resume_from == "ckpt-1" else None)
    (entry,) = patch["controls"]
    assert (entry["idempotencyKey"], entry["op"], entry["outcome"]) == ("retry-1", "Retry", "Accepted")
    assert "fixed the credentials" in entry["message"]
    assert spec["reason"] == "manual_retry"
    assert spec.get("resumeFrom") == resume_from
    assert spec["leaseEpoch"] == 2
    assert "input" not in spec
    assert ("Normal", "ManualRetry") in events(plan)


REFUSED_RETRIES: dict[str, tuple[World, str, str]] = {
    "running": (
        replace(supervising(), run=make_run(supervising().run.status.to_api(), spec=retry_spec())),
        "NotRetryable",
        "Running",
    ),
    "waiting": (waiting(spec=retry_spec()), "NotRetryable", "InputRequired"),
    "unknown-side-effect": (
        stopped("NeedsReconciliation", spec=retry_spec(), side_effects=(UNKNOWN_EFFECT, EFFECTS[0])),
        "UnresolvedSideEffects",
        str(UNKNOWN_EFFECT.metadata.name),
    ),
    "unknown-checkpoint": (
        stopped(spec=retry_spec(from_checkpoint="ckpt-9"), checkpoints=CHAIN),
        "UnknownCheckpoint",
        "ckpt-9",
    ),
    "unknown-side-effect-before-the-checkpoint": (
        stopped(spec=retry_spec(from_checkpoint="ckpt-9"), side_effects=(UNKNOWN_EFFECT,)),
        "UnresolvedSideEffects",
        "resolve-effect",
    ),
}


@pytest.mark.parametrize(("world", "reason", "says"), REFUSED_RETRIES.values(), ids=REFUSED_RETRIES.keys())
def test_manual_retry_refused(world: World, reason: str, says: str) -> None:
    plan = decide(world)

    assert [type(a) for a in plan.actions if not isinstance(a, DeleteCheckpoint)] == [
        PatchRunStatus,
        RecordEvent,
    ]
    patch = run_patch(plan)
    assert set(patch) == RECORD
    (entry,) = patch["controls"]
    assert (entry["idempotencyKey"], entry["op"], entry["outcome"], entry["reason"]) == (
        "retry-1",
        "Retry",
        "Rejected",
        reason,
    )
    assert says in entry["message"]
    assert events(plan) == [("Warning", "RetryRejected")]


def test_manual_retry_once_the_side_effect_is_resolved() -> None:
    """Refused while the ticket's fate is unknown; a person resolves it; a new key is then accepted."""
    world = stopped("NeedsReconciliation", spec=retry_spec(), side_effects=(UNKNOWN_EFFECT,))
    refused = run_patch(decide(world))
    resolved = (make_side_effect("ticket-1", "Confirmed"),)
    status = merge(world.run.status.to_api(), refused)
    same_key = replace(world, run=make_run(status, spec=retry_spec()), side_effects=resolved)
    new_key = replace(same_key, run=make_run(status, spec=retry_spec("retry-2")))

    assert kinds(decide(same_key)) == ["PatchRunStatus"]  # the report catches up; the retry stays refused
    assert set(run_patch(decide(same_key))) == {"sideEffects", "report"}
    assert kinds(decide(new_key)) == GRANT
    assert [(c["idempotencyKey"], c["outcome"]) for c in run_patch(decide(new_key))["controls"]] == [
        ("retry-1", "Rejected"),
        ("retry-2", "Accepted"),
    ]


# ---- pause -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("world", "outcome", "reason"),
    [
        (waiting("Paused", request=PAUSED, spec=pause_spec()), "Accepted", "Accepted"),
        (waiting(spec=pause_spec()), "Rejected", "NotRunning"),
        (
            waiting("AuthRequired", request=pending_request("auth_required"), spec=pause_spec()),
            "Rejected",
            "NotRunning",
        ),
        (
            waiting("Paused", request=pending_request("paused", "pause-0"), spec=pause_spec()),
            "Rejected",
            "NotRunning",
        ),
    ],
    ids=["paused-as-asked", "waiting-for-input", "waiting-for-approval", "paused-for-another-request"],
)
def test_pause_record(world: World, outcome: str, reason: str) -> None:
    plan = decide(world)
    (entry,) = run_patch(plan)["controls"]

    assert kinds(plan) == ["PatchRunStatus"]
    assert (entry["idempotencyKey"], entry["op"], entry["outcome"], entry["reason"]) == (
        "pause-1",
        "Pause",
        outcome,
        reason,
    )
    assert entry["digest"] == json_digest({"requestId": "pause-1", "reason": "maintenance window"})
    assert events(plan) == ([] if outcome == "Accepted" else [("Warning", "PauseRejected")])


# ---- checkpoint retention ----------------------------------------------------------------------------------

RETAINED: dict[str, tuple[World, int, list[str]]] = {
    "oldest-first-beyond-the-count": (
        supervising(latestCheckpoint="ckpt-5"),
        2,
        ["ckpt-3", "ckpt-2", "ckpt-1"],
    ),
    "never-the-latest": (supervising(latestCheckpoint="ckpt-2"), 1, ["ckpt-4", "ckpt-3", "ckpt-1"]),
    "never-the-pending-request": (
        waiting(request={**WAITING, "checkpointId": "ckpt-1"}, latestCheckpoint="ckpt-5"),
        2,
        ["ckpt-3", "ckpt-2"],
    ),
    "never-a-resume-point": (
        supervising(
            3,
            attempt=make_attempt(3, resume_from="ckpt-2"),
            history=(
                failed_attempt(1, FailureClass.TRANSIENT, "a"),
                failed_attempt(2, FailureClass.TRANSIENT, "b", resume_from="ckpt-1"),
            ),
            latestCheckpoint="ckpt-5",
        ),
        1,
        ["ckpt-4", "ckpt-3"],
    ),
    "all-within-the-count": (supervising(latestCheckpoint="ckpt-5"), 5, []),
    "count-of-one": (supervising(latestCheckpoint="ckpt-5"), 1, ["ckpt-4", "ckpt-3", "ckpt-2", "ckpt-1"]),
    "succeeded-run": (
        at_rest("Succeeded", latestCheckpoint="ckpt-5", sideEffects=NO_SIDE_EFFECTS),
        3,
        ["ckpt-2", "ckpt-1"],
    ),
}


@pytest.mark.parametrize(("world", "retention", "pruned"), RETAINED.values(), ids=RETAINED.keys())
def test_checkpoint_retention(world: World, retention: int, pruned: list[str]) -> None:
    plan = decide(with_checkpoints(world, *reversed(CHAIN), retention=retention))

    assert of_type(plan, DeleteCheckpoint) == [DeleteCheckpoint(name) for name in pruned]


def test_no_checkpoint_is_pruned_without_checkpoints() -> None:
    assert of_type(decide(with_checkpoints(supervising(), retention=1)), DeleteCheckpoint) == []


# ---- conditions --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("phase", "statuses"), CONDITION_FACTS.items(), ids=[p.value for p in CONDITION_FACTS]
)
def test_conditions_follow_the_phase(phase: RunPhase, statuses: list[str]) -> None:
    conditions = conditions_for(phase, "SomeReason", "msg", generation=4, previous=None, now=NOW)

    assert [c["type"] for c in conditions] == CONDITION_TYPES
    assert [c["status"] for c in conditions] == statuses
    assert all(c["observedGeneration"] == 4 and c["lastTransitionTime"] == ts(NOW) for c in conditions)
    succeeded = conditions[0]
    if phase in (RunPhase.FAILED, RunPhase.CANCELLED, RunPhase.NEEDS_RECONCILIATION):
        assert succeeded["reason"] == "SomeReason"


# The condition each phase's message is written on (the others carry none): a failure's message once.
MESSAGE_ON = {
    RunPhase.QUEUED: "Succeeded",
    RunPhase.RUNNING: "LeaseHeld",
    RunPhase.RETRY_BACKOFF: "Succeeded",
    RunPhase.INPUT_REQUIRED: "Waiting",
    RunPhase.AUTH_REQUIRED: "Waiting",
    RunPhase.PAUSED: "Waiting",
    RunPhase.CANCEL_REQUESTED: "CancelRequested",
    RunPhase.COMPENSATING: "Succeeded",
    RunPhase.CANCELLED: "Succeeded",
    RunPhase.SUCCEEDED: "Succeeded",
    RunPhase.FAILED: "Succeeded",
    RunPhase.NEEDS_RECONCILIATION: "Succeeded",
}


@pytest.mark.parametrize(("phase", "carrier"), MESSAGE_ON.items(), ids=[p.value for p in MESSAGE_ON])
def test_the_message_is_on_the_one_condition_it_belongs_to(phase: RunPhase, carrier: str) -> None:
    conditions = conditions_for(
        phase, "SomeReason", "the step failed: boom", generation=4, previous=None, now=NOW
    )

    assert {c["type"]: c["message"] for c in conditions} == {
        kind: "the step failed: boom" if kind == carrier else "" for kind in CONDITION_TYPES
    }


def test_every_phase_says_where_its_message_goes() -> None:
    assert set(MESSAGE_ON) == set(RunPhase) == set(CONDITION_FACTS)


def test_no_lease_is_held_between_two_compensation_attempts() -> None:
    running = conditions_for(RunPhase.COMPENSATING, "Compensating", "m", generation=1, previous=None, now=NOW)
    backoff = conditions_for(
        RunPhase.COMPENSATING,
        "Compensating",
        "m",
        generation=1,
        previous=None,
        now=NOW,
        between_attempts=True,
    )

    assert [(c["status"], c["reason"]) for c in running if c["type"] == "LeaseHeld"] == [
        ("True", "CompensationRunning")
    ]
    assert [(c["status"], c["reason"]) for c in backoff if c["type"] == "LeaseHeld"] == [
        ("False", "NoActiveAttempt")
    ]


def conditions_at(phase: RunPhase, when: datetime) -> list[dict[str, Any]]:
    return conditions_for(phase, phase.value, "before", generation=GENERATION, previous=None, now=when)


def test_last_transition_time_moves_only_with_the_status() -> None:
    """Running (written at EARLIER) → RetryBackoff: only LeaseHeld changes status."""
    world = supervising(pod=ended(1, 75), conditions=conditions_at(RunPhase.RUNNING, EARLIER))
    conditions = {c["type"]: c for c in run_patch(decide(world))["conditions"]}

    assert conditions["Succeeded"]["lastTransitionTime"] == ts(EARLIER)  # Unknown → Unknown
    assert conditions["Succeeded"]["reason"] == "RetryBackoff"  # the reason moves on regardless
    assert conditions["Waiting"]["lastTransitionTime"] == ts(EARLIER)
    assert conditions["CancelRequested"]["lastTransitionTime"] == ts(EARLIER)
    assert conditions["LeaseHeld"]["lastTransitionTime"] == ts(NOW)  # True → False
    assert conditions["LeaseHeld"]["status"] == "False"


def test_last_transition_time_when_the_run_succeeds() -> None:
    world = supervising(
        pod=ended(1, 0), committedBy=committed_by(1, 1), conditions=conditions_at(RunPhase.RUNNING, EARLIER)
    )
    conditions = {c["type"]: c for c in run_patch(decide(world))["conditions"]}

    assert conditions["Succeeded"]["lastTransitionTime"] == ts(NOW)
    assert conditions["Waiting"]["lastTransitionTime"] == ts(EARLIER)
    assert conditions["LeaseHeld"]["lastTransitionTime"] == ts(NOW)


def test_conditions_without_previous_ones_start_now() -> None:
    patch = run_patch(decide(make_world(make_run())))
    assert {c["lastTransitionTime"] for c in patch["conditions"]} == {ts(NOW)}


# ---- the Plan ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("wakes", "expected"),
    [([], None), ([5.0], 5.0), ([5.0, 2.0, 9.0], 2.0), ([-3.0], 0.0), ([0.0, 4.0], 0.0)],
    ids=["none", "one", "earliest-wins", "past-is-now", "zero"],
)
def test_a_transition_wakes_at_the_earliest(wakes: list[float], expected: float | None) -> None:
    transition = Transition()
    for seconds in wakes:
        transition = transition.wake_in(seconds)
    assert transition.requeue_after == expected


def test_plan_keeps_order_and_filters_by_kind() -> None:
    plan = Plan([DeletePod("a"), RecordEvent("Normal", "X", "x"), DeletePod("b")])
    assert plan.of(DeletePod) == [DeletePod("a"), DeletePod("b")]
    assert [type(a) for a in plan.actions] == [DeletePod, RecordEvent, DeletePod]
