"""core.runs: grants (the first Attempt, retries, the lease epoch they give out), a grant interrupted
before its Attempt was created, and Runs over their budgets.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from agentrun.api import (
    ATTEMPT_ANNOTATION,
    LEASE_EPOCH_ANNOTATION,
    RESUME_FROM_ANNOTATION,
    Attempt,
    AttemptPhase,
    FailureClass,
    json_digest,
)
from agentrun.api.budgets import POD_SPEC_BUDGET, RUN_INPUT_BUDGET
from agentrun.core import failures
from agentrun.core.plan import (
    CreateAttempt,
    CreatePod,
    DeletePod,
    PatchRunStatus,
    WriteLease,
)
from agentrun.core.pods import PodView
from agentrun.core.runs import World, decide
from unit.factories import (
    LEASE_RESOURCE_VERSION,
    LEASE_SECONDS,
    NOW,
    RUN,
    RUN_UID,
    TRACE_ID,
    attempt_patches,
    ended_pod,
    events,
    failed_attempt,
    failure_of,
    held_by,
    kinds,
    make_attempt,
    make_lease,
    make_run,
    make_world,
    name_of,
    of_type,
    run_patch,
    run_status,
    running_pod,
    ts,
)
from unit.run_worlds import (
    CHECKPOINT,
    DEADLINE,
    FINISHED,
    LATEST_CHECKPOINT,
    WAITING,
    at_rest,
    backing_off,
    cancelled,
    ended,
    queued,
    record,
    resume,
    retry_spec,
    supervising,
)

# ---- the grant ---------------------------------------------------------------------------------------------


def test_first_grant() -> None:
    plan = decide(make_world(make_run()))
    lease, status, create, pod = plan.actions

    assert lease == WriteLease(name_of(1), 1, LEASE_SECONDS, None)
    assert isinstance(status, PatchRunStatus)
    assert {k: status.patch[k] for k in ("phase", "currentAttempt", "attempts", "leaseEpoch")} == {
        "phase": "Running",
        "currentAttempt": 1,
        "attempts": 1,
        "leaseEpoch": 1,
    }
    assert status.patch["observedCancelEpoch"] == 0
    assert status.patch["nextAttemptTime"] is None
    assert isinstance(create, CreateAttempt)
    assert create.body["metadata"]["name"] == name_of(1)
    assert create.body["metadata"]["labels"] == {"agentrun.dev/run": RUN}
    assert create.body["metadata"]["ownerReferences"][0]["uid"] == RUN_UID
    assert create.body["spec"] == {
        "runName": RUN,
        "number": 1,
        "leaseEpoch": 1,
        "cancelEpoch": 0,
        "reason": "initial",
    }
    assert isinstance(pod, CreatePod)
    assert pod.body["metadata"]["name"] == name_of(1)
    assert pod.body["metadata"]["annotations"][LEASE_EPOCH_ANNOTATION] == "1"
    assert events(plan) == []  # a Run's first Attempt is no news; its Attempt gets no status until it runs


def test_a_run_first_seen_with_a_cancel_epoch_starts_with_it() -> None:
    plan = decide(make_world(make_run(spec={"cancelEpoch": 2})))

    assert run_patch(plan)["observedCancelEpoch"] == 2
    assert of_type(plan, CreateAttempt)[0].body["spec"]["cancelEpoch"] == 2


@pytest.mark.parametrize(
    ("spec", "refusal"),
    [
        ({"cancelEpoch": 2, "input": {"blob": "x" * RUN_INPUT_BUDGET}}, None),
        ({"cancelEpoch": 2}, "not allowed"),
    ],
    ids=["over-budget", "account-refused"],
)
def test_a_run_failed_at_first_sight_records_its_cancel_epoch_and_counters(
    spec: dict[str, Any], refusal: str | None
) -> None:
    """Otherwise the cancelEpoch it was created with would later pass for a cancel of the Failed Run; and
    its counters say that nothing was started (status.attempts 0, not absent)."""
    world = replace(make_world(make_run(spec=spec)), account_refusal=refusal)
    patch = run_patch(decide(world))

    assert (patch["phase"], patch["observedCancelEpoch"]) == ("Failed", 2)
    assert (patch["attempts"], patch["leaseEpoch"]) == (0, 0)


def test_grant_uses_the_runs_lease_duration() -> None:
    world = make_world(
        make_run(run_status("Queued"), spec={"lease": {"durationSeconds": 15, "renewSeconds": 5}})
    )
    assert of_type(decide(world), WriteLease) == [WriteLease(name_of(1), 1, 15, None)]


RETRY_REASONS = {
    "after-transient": (failed_attempt(2, FailureClass.TRANSIENT), "retry:transient"),
    "after-rate-limited": (failed_attempt(2, FailureClass.RATE_LIMITED), "retry:rate_limited"),
    "after-infrastructure": (failed_attempt(2, FailureClass.INFRASTRUCTURE), "retry:infrastructure"),
    "after-lease-lost": (
        make_attempt(2, phase="LeaseLost", failure=failure_of(FailureClass.LEASE_LOST)),
        "lease_expired",
    ),
    "after-a-failure-without-details": (make_attempt(2, phase="Failed"), "retry:infrastructure"),
}


@pytest.mark.parametrize(("previous", "reason"), RETRY_REASONS.values(), ids=RETRY_REASONS.keys())
def test_retry_grant(previous: Attempt, reason: str) -> None:
    """Attempt 3 after Attempt 2 (lease epoch 2) failed: the lease moves to epoch 3, preconditioned."""
    world = backing_off(
        2,
        previous=previous,
        history=(failed_attempt(1, FailureClass.TRANSIENT, "first"),),
        latestCheckpoint=LATEST_CHECKPOINT,
        spec={"retry": {"maxAttempts": 5}},
    )
    plan = decide(world)
    status = run_patch(plan)
    create = of_type(plan, CreateAttempt)[0]
    pod = of_type(plan, CreatePod)[0]

    assert of_type(plan, WriteLease) == [WriteLease(name_of(3), 3, LEASE_SECONDS, LEASE_RESOURCE_VERSION)]
    assert (status["currentAttempt"], status["attempts"], status["leaseEpoch"]) == (3, 3, 3)
    assert status["nextAttemptTime"] is None
    assert create.body["spec"] == {
        "runName": RUN,
        "number": 3,
        "leaseEpoch": 3,
        "cancelEpoch": 0,
        "reason": reason,
        "resumeFrom": LATEST_CHECKPOINT,
    }
    annotations = pod.body["metadata"]["annotations"]
    assert annotations[ATTEMPT_ANNOTATION] == name_of(3)
    assert annotations[LEASE_EPOCH_ANNOTATION] == "3"
    assert annotations[RESUME_FROM_ANNOTATION] == LATEST_CHECKPOINT
    assert not attempt_patches(plan).get(name_of(2)), "the failed Attempt is left as it is"


@pytest.mark.parametrize(
    "world",
    [queued(), backing_off()],
    ids=["first-grant", "retry-grant"],
)
def test_an_interrupted_grant_adopts_the_lease_epoch(world: World) -> None:
    """The operator wrote the Lease for the next Attempt and died: the epoch is adopted, not bumped."""
    number = (world.run.status.current_attempt or 0) + 1
    plan = decide(replace(world, lease=held_by(number)))

    assert of_type(plan, WriteLease) == []
    assert run_patch(plan)["leaseEpoch"] == number
    assert of_type(plan, CreateAttempt)[0].body["spec"]["leaseEpoch"] == number


def test_a_grant_gives_out_the_epoch_of_a_revoked_lease() -> None:
    """Attempt 1 lost its lease: the Lease was revoked at epoch 2 at once, and Attempt 2 gets epoch 2."""
    world = backing_off(
        previous=make_attempt(1, phase="LeaseLost", failure=failure_of(FailureClass.LEASE_LOST)),
        lease=make_lease(None, 2),
        leaseEpoch=2,
    )
    plan = decide(world)

    assert of_type(plan, WriteLease) == [WriteLease(name_of(2), 2, LEASE_SECONDS, LEASE_RESOURCE_VERSION)]
    assert run_patch(plan)["leaseEpoch"] == 2
    assert of_type(plan, CreateAttempt)[0].body["spec"]["leaseEpoch"] == 2
    assert of_type(plan, CreateAttempt)[0].body["spec"]["reason"] == "lease_expired"


def test_a_grant_after_a_revocation_the_run_did_not_record() -> None:
    """The operator revoked the Lease (epoch 2) and died before writing the Run (still at epoch 1): the
    grant adopts epoch 2 all the same, so no epoch is skipped."""
    world = backing_off(lease=make_lease(None, 2))
    plan = decide(world)

    assert of_type(plan, WriteLease) == [WriteLease(name_of(2), 2, LEASE_SECONDS, LEASE_RESOURCE_VERSION)]
    assert run_patch(plan)["leaseEpoch"] == 2


def test_grant_carries_the_cancel_epoch() -> None:
    world = backing_off(cancel_epoch=2, spec={"cancelEpoch": 2})
    plan = decide(world)

    assert run_patch(plan)["observedCancelEpoch"] == 2
    assert of_type(plan, CreateAttempt)[0].body["spec"]["cancelEpoch"] == 2
    assert of_type(plan, CreatePod)[0].body["metadata"]["annotations"]["agentrun.dev/cancel-epoch"] == "2"


CARRIED = {"priority": "high"}
ANSWERED_ATTEMPT = make_attempt(  # resumed from LATEST_CHECKPOINT with CARRIED, then failed
    2,
    phase="Failed",
    reason="resume:req-1",
    failure=failure_of(FailureClass.TRANSIENT),
    resume_from=LATEST_CHECKPOINT,
    input_value=CARRIED,
)
CARRIED_ANSWERS = {
    "resume-failed-before-a-checkpoint": (ANSWERED_ATTEMPT, LATEST_CHECKPOINT, CARRIED),
    "resume-failed-after-a-new-checkpoint": (ANSWERED_ATTEMPT, "ckpt-8", None),
    "a-carried-answer-is-carried-again": (
        make_attempt(
            2,
            phase="Failed",
            failure=failure_of(FailureClass.INFRASTRUCTURE),
            resume_from=LATEST_CHECKPOINT,
            input_value=CARRIED,
        ),
        LATEST_CHECKPOINT,
        CARRIED,
    ),
    "lease-lost-before-a-checkpoint": (
        make_attempt(
            2,
            phase="LeaseLost",
            reason="resume:req-1",
            failure=failure_of(FailureClass.LEASE_LOST),
            resume_from=LATEST_CHECKPOINT,
            input_value=CARRIED,
        ),
        LATEST_CHECKPOINT,
        CARRIED,
    ),
    "no-answer-to-carry": (failed_attempt(2, FailureClass.TRANSIENT), LATEST_CHECKPOINT, None),
}


@pytest.mark.parametrize(
    ("previous", "latest", "carried"), CARRIED_ANSWERS.values(), ids=CARRIED_ANSWERS.keys()
)
def test_an_automatic_retry_carries_an_answer_not_built_on_yet(
    previous: Attempt, latest: str, carried: Any
) -> None:
    """An answered Attempt that fails before saving a Checkpoint leaves the Run at the same waiting point:
    its retry gets the same answer, or the agent would ask again what was answered already."""
    world = backing_off(2, previous=previous, latestCheckpoint=latest, spec={"retry": {"maxAttempts": 5}})
    spec = of_type(decide(world), CreateAttempt)[0].body["spec"]

    assert spec["resumeFrom"] == latest
    assert spec.get("input") == carried
    assert spec["reason"] != "initial"


def test_an_interrupted_retry_grant_is_recreated_with_the_carried_answer() -> None:
    run = make_run(run_status("Running", current=3, lease_epoch=3, latestCheckpoint=LATEST_CHECKPOINT))
    plan = decide(
        make_world(
            run, attempts=[failed_attempt(1, FailureClass.TRANSIENT), ANSWERED_ATTEMPT], lease=held_by(3)
        )
    )
    spec = of_type(plan, CreateAttempt)[0].body["spec"]

    assert (spec["number"], spec["reason"], spec.get("input")) == (3, "retry:transient", CARRIED)


LEFTOVERS = {
    "pending-attempt-with-its-pod-running": (
        "Cancelled",
        make_attempt(2, phase="Pending", started=False),
        running_pod(2),
        True,
    ),
    "running-attempt-without-a-pod": ("Cancelled", make_attempt(2), None, False),
    "attempt-without-status-pod-stopping": (
        "Failed",
        make_attempt(2, phase=None, started=False),
        running_pod(2, deleting=True),
        False,
    ),
    "pending-attempt-pod-ended": ("Succeeded", make_attempt(2, phase="Pending"), ended_pod(2, 0), False),
}


@pytest.mark.parametrize(("phase", "leftover", "pod", "stops_pod"), LEFTOVERS.values(), ids=LEFTOVERS.keys())
def test_a_stopped_run_aborts_the_attempts_its_stop_did_not_see(
    phase: str, leftover: Attempt, pod: PodView | None, stops_pod: bool
) -> None:
    """A grant that raced with a cancel, or an Attempt the operator's cache did not hold yet when the Run
    stopped: once seen, it is Aborted and its Pod stopped, so no Attempt of an ended Run reads as going."""
    world = at_rest(phase)
    world = replace(
        world,
        attempts={**world.attempts, 2: leftover},
        pods={pod.name: pod} if pod else {},
    )
    plan = decide(world)

    assert attempt_patches(plan) == {
        name_of(2): [
            {
                "phase": "Aborted",
                "completionTime": ts(NOW),
                "failure": failures.failure(
                    FailureClass.CANCELLED, f"the Run was {phase} before this Attempt finished"
                ).to_api(),
                **({} if leftover.status.trace_id else {"traceId": TRACE_ID}),
            }
        ]
    }
    assert of_type(plan, DeletePod) == ([DeletePod(name_of(2))] if stops_pod else [])
    assert of_type(plan, CreateAttempt) == [] and of_type(plan, CreatePod) == []


@pytest.mark.parametrize(
    ("world", "phase"),
    [
        (
            cancelled(
                supervising(2, attempt=None, pod=None, history=(failed_attempt(1, FailureClass.TRANSIENT),))
            ),
            "Cancelled",
        ),
        (
            supervising(
                2, attempt=None, pod=None, spec=DEADLINE, history=(failed_attempt(1, FailureClass.TRANSIENT),)
            ),
            "Failed",
        ),
    ],
    ids=["cancel", "deadline"],
)
def test_a_stop_creates_the_attempt_an_interrupted_grant_promised_and_ends_it(
    world: World, phase: str
) -> None:
    """The grant of Attempt 2 wrote the Run (status.attempts 2) and the operator stopped before creating
    it; then the Run was stopped. The Attempt is created all the same, and aborted: status.attempts
    never counts an Attempt that does not exist."""
    world = replace(world, attempts={1: world.attempts[1]})
    plan = decide(world)

    [create] = of_type(plan, CreateAttempt)
    assert create.body["metadata"]["name"] == name_of(2)
    assert create.body["spec"]["reason"] == "retry:transient"
    assert [p["phase"] for p in attempt_patches(plan)[name_of(2)]] == ["Aborted"]
    assert run_patch(plan)["phase"] == phase
    assert of_type(plan, CreatePod) == []
    assert kinds(plan).index("CreateAttempt") < kinds(plan).index("PatchAttemptStatus")


def test_a_takeover_writes_the_run_before_it_ends_the_attempt() -> None:
    """The Run's status write (new lease epoch, preconditioned) decides between the takeover and a
    commit racing it; were the Attempt marked LeaseLost first, a commit landing in between would be
    accepted from an Attempt the history calls lost."""
    writes = kinds(decide(supervising(expires_in=-1.0)))

    assert writes.index("WriteLease") < writes.index("PatchRunStatus") < writes.index("PatchAttemptStatus")


def test_a_stopped_run_with_finished_attempts_writes_nothing_to_them() -> None:
    plan = decide(at_rest("Cancelled"))

    assert attempt_patches(plan) == {}
    assert of_type(plan, DeletePod) == []


# ---- crash recovery ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("history", "reason"),
    [
        ((), "initial"),
        ((failed_attempt(1, FailureClass.RATE_LIMITED),), "retry:rate_limited"),
        ((make_attempt(1, phase="LeaseLost", failure=failure_of(FailureClass.LEASE_LOST)),), "lease_expired"),
    ],
    ids=["first", "after-rate-limited", "after-lease-loss"],
)
def test_missing_attempt_is_created_as_promised(history: tuple[Attempt, ...], reason: str) -> None:
    number = len(history) + 1
    run = make_run(
        run_status("Running", current=number, lease_epoch=number, latestCheckpoint=LATEST_CHECKPOINT)
    )
    plan = decide(make_world(run, attempts=history, lease=held_by(number)))
    spec = of_type(plan, CreateAttempt)[0].body["spec"]

    assert spec["number"] == number
    assert spec["leaseEpoch"] == number  # status.leaseEpoch: the grant's epoch, not a new one
    assert spec["reason"] == reason
    assert spec["resumeFrom"] == LATEST_CHECKPOINT
    assert of_type(plan, WriteLease) == []
    assert of_type(plan, CreatePod)[0].body["metadata"]["name"] == name_of(number)


TRIGGERS: dict[str, Callable[[Attempt], World]] = {
    "run-still-running": lambda attempt: supervising(
        attempt=attempt, pod=ended(1, 1), pendingRequest=WAITING
    ),
    "run-still-running-pod-gone": lambda attempt: supervising(
        attempt=attempt, pod=None, pendingRequest=WAITING
    ),
    "lease-expired": lambda attempt: supervising(attempt=attempt, expires_in=-1.0, pendingRequest=WAITING),
    "cancel": lambda attempt: cancelled(supervising(attempt=attempt, pod=ended(1, 0))),
    "cancel-requested": lambda attempt: make_world(
        make_run(
            run_status("CancelRequested", current=1, lease_epoch=1, cancel_epoch=1), spec={"cancelEpoch": 1}
        ),
        attempts=[attempt],
    ),
    "deadline": lambda attempt: supervising(attempt=attempt, spec=DEADLINE),
}


@pytest.mark.parametrize("trigger", TRIGGERS.values(), ids=TRIGGERS.keys())
@pytest.mark.parametrize("phase", FINISHED, ids=[p.value for p in FINISHED])
def test_history_is_never_rewritten(phase: AttemptPhase, trigger: Callable[[Attempt], World]) -> None:
    failure = (
        failure_of(FailureClass.TRANSIENT)
        if phase in (AttemptPhase.FAILED, AttemptPhase.LEASE_LOST)
        else None
    )
    plan = decide(trigger(make_attempt(1, phase=phase.value, failure=failure)))

    assert name_of(1) not in attempt_patches(plan)
    assert of_type(plan, PatchRunStatus), "the Run moves on all the same"


# ---- a grant interrupted before its Attempt was created ----------------------------------------------------


def granted(number: int, history: tuple[Attempt, ...], spec: dict[str, Any], **status: Any) -> World:
    """The Run records Attempt `number` (lease epoch `number`, held), which was never created."""
    run = make_run(run_status("Running", current=number, lease_epoch=number, **status), spec=spec)
    return make_world(run, attempts=history, lease=held_by(number))


ANSWERED = {
    "inputs": [
        {
            "requestId": "req-1",
            "checkpointId": CHECKPOINT,
            "digest": json_digest({"choice": "a"}),
            "idempotencyKey": "answer-1",
            "time": ts(NOW),
        }
    ],
    "controls": [record("answer-1", "Resume")],
    "latestCheckpoint": CHECKPOINT,
}
ACCEPTED_VALUE = {"requestId": "req-1", "idempotencyKey": "answer-1", "value": {"choice": "a"}}  # answer-1's
RESUMED_ONCE = (
    make_attempt(1, phase="Interrupted"),
    make_attempt(2, phase="Failed", reason="resume:req-1", failure=failure_of(FailureClass.TRANSIENT)),
)

PROMISES: dict[str, tuple[World, str, Any]] = {
    "after-a-resume": (
        granted(2, (make_attempt(1, phase="Interrupted"),), resume(), **ANSWERED),
        "resume:req-1",
        {"choice": "a"},
    ),
    "after-a-resume-whose-spec-a-second-answer-replaced": (
        granted(
            2,
            (make_attempt(1, phase="Interrupted"),),
            resume(key="answer-2"),  # refused already; the status kept what was accepted
            **{
                **ANSWERED,
                "controls": [
                    record("answer-1", "Resume"),
                    record("answer-2", "Resume", "Rejected", "NotWaiting"),
                ],
            },
            acceptedInput=ACCEPTED_VALUE,
        ),
        "resume:req-1",
        {"choice": "a"},
    ),
    "after-a-resume-whose-spec-changed-since-accepted-by-an-older-operator": (
        granted(
            2,
            (make_attempt(1, phase="Interrupted"),),
            resume(key="answer-2"),  # a second answer, refused already: the first one's value is gone
            **{
                **ANSWERED,
                "controls": [
                    record("answer-1", "Resume"),
                    record("answer-2", "Resume", "Rejected", "NotWaiting"),
                ],
            },
        ),
        "resume:req-1",
        None,
    ),
    "after-a-manual-retry": (
        granted(
            2,
            (failed_attempt(1, FailureClass.DETERMINISTIC),),
            retry_spec(),
            controls=[record("retry-1", "Retry")],
        ),
        "manual_retry",
        None,
    ),
    "after-a-manual-retry-of-an-interrupted-attempt": (
        granted(
            2, (make_attempt(1, phase="Interrupted"),), retry_spec(), controls=[record("retry-1", "Retry")]
        ),
        "manual_retry",
        None,
    ),
    "automatic-after-a-resume": (granted(3, RESUMED_ONCE, resume(), **ANSWERED), "retry:transient", None),
    "automatic-after-a-manual-retry": (
        granted(
            3,
            (
                failed_attempt(1, FailureClass.DETERMINISTIC),
                make_attempt(
                    2, phase="LeaseLost", reason="manual_retry", failure=failure_of(FailureClass.LEASE_LOST)
                ),
            ),
            retry_spec(),
            controls=[record("retry-1", "Retry")],
        ),
        "lease_expired",
        None,
    ),
    "refused-requests-do-not-count": (
        granted(
            2,
            (failed_attempt(1, FailureClass.RATE_LIMITED),),
            retry_spec(),
            controls=[
                record("retry-1", "Retry", "Rejected", "NotRetryable"),
                record("answer-1", "Resume", "Rejected", "NotWaiting"),
                record("pause-1", "Pause"),
            ],
        ),
        "retry:rate_limited",
        None,
    ),
}


@pytest.mark.parametrize(("world", "reason", "value"), PROMISES.values(), ids=PROMISES.keys())
def test_a_missing_attempt_is_created_as_its_grant_promised(world: World, reason: str, value: Any) -> None:
    """The grant wrote the Run's status (with its control record) and the operator died before creating
    the Attempt: the Attempt is created with the reason and the answer of that grant."""
    plan = decide(world)
    spec = of_type(plan, CreateAttempt)[0].body["spec"]

    assert kinds(plan) == ["CreateAttempt", "CreatePod"]
    assert spec["reason"] == reason
    assert spec.get("input") == value


def test_a_grant_deletes_the_superseded_pod_at_once_before_anything_else() -> None:
    plan = decide(backing_off())
    first = plan.actions[0]
    assert first == DeletePod("triage-a1", grace_seconds=0)
    assert not [a for a in plan.actions[1:] if isinstance(a, DeletePod)]


OVER_BUDGET: dict[str, tuple[dict[str, Any], str, str]] = {
    "input": ({"input": {"blob": "x" * RUN_INPUT_BUDGET}}, "InputTooLarge", "spec.input is"),
    "pod-template": (
        {"agent": {"image": "a", "podTemplate": {"spec": {"blob": "x" * POD_SPEC_BUDGET}}}},
        "PodTemplateTooLarge",
        "spec.agent.podTemplate.spec is",
    ),
}


@pytest.mark.parametrize(("spec", "reason", "says"), OVER_BUDGET.values(), ids=OVER_BUDGET.keys())
def test_a_run_over_its_spec_budget_fails_before_any_attempt(
    spec: dict[str, Any], reason: str, says: str
) -> None:
    plan = decide(make_world(make_run(run_status("Queued"), spec=spec)))

    [patch] = [p.patch for p in of_type(plan, PatchRunStatus)]
    assert kinds(plan) == ["PatchRunStatus"]
    assert (patch["phase"], patch["failure"]["class"], patch["failure"]["reason"]) == (
        "Failed",
        "deterministic",
        reason,
    )
    assert patch["failure"]["message"].startswith(says)
    assert "store large data elsewhere" in patch["failure"]["message"]


def test_a_run_at_its_input_budget_starts() -> None:
    at_budget = {"input": "x" * (RUN_INPUT_BUDGET - 2)}
    plan = decide(make_world(make_run(run_status("Queued"), spec=at_budget)))

    assert "CreateAttempt" in kinds(plan)
