"""core.runs.decide: the Run state machine, one transition per case, then restart safety by simulation.

A case is a World (what the operator observes) and the writes the decision must ask for, in order. The
simulation at the end runs whole Runs against an in-memory API server and kills the operator between
any two writes of any decision, to show that a restart continues without skipping or reusing an epoch,
creating an Attempt twice or rewriting history.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

import pytest

from agentrun.api import (
    ATTEMPT_ANNOTATION,
    LEASE_EPOCH_ANNOTATION,
    RESUME_FROM_ANNOTATION,
    Attempt,
    AttemptPhase,
    FailureClass,
    RunPhase,
)
from agentrun.core.conditions import conditions_for
from agentrun.core.failures import fingerprint
from agentrun.core.lease import LeaseView, Sighting, seconds_until_expiry, sight
from agentrun.core.plan import (
    Action,
    CreateAttempt,
    CreatePod,
    DeletePod,
    PatchAttemptStatus,
    PatchRunStatus,
    Plan,
    RecordEvent,
    WriteLease,
)
from agentrun.core.pods import PodView, pod_view
from agentrun.core.retry import backoff_seconds
from agentrun.core.runs import RECHECK_SECONDS, World, decide
from unit.factories import (
    CREATED,
    EARLIER,
    GENERATION,
    LEASE_RESOURCE_VERSION,
    NOW,
    RUN,
    RUN_UID,
    attempt_patches,
    committed_by,
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
    pending_pod,
    pending_request,
    run_patch,
    run_status,
    running_pod,
    ts,
)

GRANT = ["WriteLease", "PatchRunStatus", "CreateAttempt", "CreatePod", "PatchAttemptStatus"]
ADOPTED_GRANT = ["PatchRunStatus", "CreateAttempt", "CreatePod", "PatchAttemptStatus"]
CONDITION_TYPES = ["Succeeded", "Waiting", "CancelRequested", "LeaseHeld"]
FINISHED = [
    AttemptPhase.SUCCEEDED,
    AttemptPhase.FAILED,
    AttemptPhase.INTERRUPTED,
    AttemptPhase.ABORTED,
    AttemptPhase.LEASE_LOST,
    AttemptPhase.REJECTED,
]
TIMEOUT_1 = "timeout after 3012ms"
TIMEOUT_2 = "timeout after 2990ms"  # the same error as far as the fingerprint goes
LATEST_CHECKPOINT = "ckpt-7"


# ---- worlds ------------------------------------------------------------------------------------------------


def supervising(
    number: int = 1,
    *,
    pod: PodView | str | None = "running",
    attempt: Attempt | None = None,
    history: tuple[Attempt, ...] = (),
    lease: LeaseView | None = None,
    expires_in: float | None = 30.0,
    spec: dict[str, Any] | None = None,
    now: datetime = NOW,
    **status: Any,
) -> World:
    """A Run in phase Running whose current Attempt `number` holds lease epoch `number`.

    pod: "running" (the default), "pending", None (no Pod seen) or a PodView.
    """
    run = make_run(run_status("Running", current=number, lease_epoch=number, **status), spec=spec)
    if isinstance(pod, PodView):
        pods = [pod]
    else:
        pods = {"running": [running_pod(number)], "pending": [pending_pod(number)], None: []}[pod]
    return make_world(
        run,
        attempts=[*history, attempt or make_attempt(number)],
        pods=pods,
        lease=lease or held_by(number),
        expires_in=expires_in,
        now=now,
    )


def ended(number: int, code: int, message: str | None = None, **kw: Any) -> PodView:
    return ended_pod(number, code, message=message, **kw)


def sdk(failure_class: str, message: str, **extra: Any) -> str:
    return json.dumps({"class": failure_class, "message": message, **extra})


def backing_off(
    number: int = 1,
    *,
    due: datetime | None = NOW - timedelta(seconds=1),
    previous: Attempt | None = None,
    history: tuple[Attempt, ...] = (),
    lease: LeaseView | None = None,
    spec: dict[str, Any] | None = None,
    **status: Any,
) -> World:
    """A Run in RetryBackoff after its Attempt `number` failed (transient unless said otherwise)."""
    if due is not None:
        status["nextAttemptTime"] = ts(due)
    run = make_run(run_status("RetryBackoff", current=number, lease_epoch=number, **status), spec=spec)
    previous = previous or failed_attempt(number, FailureClass.TRANSIENT)
    return make_world(
        run,
        attempts=[*history, previous],
        pods=[ended(number, 75)],
        lease=lease or held_by(number),
    )


def at_rest(phase: str, number: int = 1, **status: Any) -> World:
    """A Run in `phase` after Attempt `number` ended, its Pod gone."""
    run = make_run(run_status(phase, current=number, lease_epoch=number, **status))
    attempt_phase = {"Succeeded": "Succeeded", "InputRequired": "Interrupted"}.get(phase, "Failed")
    failure = failure_of(FailureClass.DETERMINISTIC) if attempt_phase == "Failed" else None
    return make_world(run, attempts=[make_attempt(number, phase=attempt_phase, failure=failure)])


def cancelled(world: World, epoch: int = 1) -> World:
    """The same World after the user raised spec.cancelEpoch."""
    spec = world.run.spec.model_copy(update={"cancel_epoch": epoch})
    return replace(world, run=world.run.model_copy(update={"spec": spec}))


def queued(**status: Any) -> World:
    return make_world(make_run(run_status("Queued", **status)))


DEADLINE = {"deadlineSeconds": 300}  # the Run was created 600 s before NOW
WAITING = pending_request("input_required")
NOT_STARTED = make_attempt(1, phase="Pending", started=False)


# The status of each condition (in CONDITION_TYPES order) in each phase: the same facts as the phase.
CONDITION_FACTS = {
    RunPhase.QUEUED: ["Unknown", "False", "False", "False"],
    RunPhase.RUNNING: ["Unknown", "False", "False", "True"],
    RunPhase.RETRY_BACKOFF: ["Unknown", "False", "False", "False"],
    RunPhase.INPUT_REQUIRED: ["Unknown", "True", "False", "False"],
    RunPhase.AUTH_REQUIRED: ["Unknown", "True", "False", "False"],
    RunPhase.PAUSED: ["Unknown", "True", "False", "False"],
    RunPhase.CANCEL_REQUESTED: ["Unknown", "False", "True", "False"],
    RunPhase.CANCELLED: ["False", "False", "True", "False"],
    RunPhase.SUCCEEDED: ["True", "False", "False", "False"],
    RunPhase.FAILED: ["False", "False", "False", "False"],
    RunPhase.NEEDS_RECONCILIATION: ["False", "False", "False", "False"],
}


# (case, the ended Attempt, its Pod, Run status fields, the phase the Run moves to)
CATCHING_UP: list[tuple[str, Attempt, PodView | None, dict[str, Any], str]] = [
    ("failed-attempt", failed_attempt(1, FailureClass.TRANSIENT), ended(1, 75), {}, "RetryBackoff"),
    ("failed-attempt-pod-gone", failed_attempt(1, FailureClass.TRANSIENT), None, {}, "RetryBackoff"),
    (
        "deterministic-attempt",
        failed_attempt(1, FailureClass.DETERMINISTIC),
        ended(1, 1),
        {},
        "Failed",
    ),
    (
        "lease-lost-attempt",
        make_attempt(1, phase="LeaseLost", failure=failure_of(FailureClass.LEASE_LOST)),
        None,
        {},
        "RetryBackoff",
    ),
    (
        "succeeded-attempt",
        make_attempt(1, phase="Succeeded"),
        ended(1, 0),
        {"committedBy": committed_by(1, 1)},
        "Succeeded",
    ),
    (
        "interrupted-attempt",
        make_attempt(1, phase="Interrupted"),
        ended(1, 0),
        {"pendingRequest": WAITING},
        "InputRequired",
    ),
    ("rejected-attempt", make_attempt(1, phase="Rejected"), ended(1, 1), {}, "RetryBackoff"),
    (
        "attempt-failed-by-the-executor",  # its Pod was refused (bad podTemplate): never created
        failed_attempt(1, FailureClass.DETERMINISTIC, "the attempt Pod was refused", started=False),
        None,
        {},
        "Failed",
    ),
]


# ---- the transition table ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Transition:
    world: World
    writes: list[str]  # action types in order, Events left out
    phase: str | None = None  # the phase the Run status patch sets; None: no Run status patch
    attempts: dict[int, str] = field(default_factory=dict)  # the phase each patched Attempt ends with
    stop_reason: str | None = None  # status.failure.reason of a Failed Run
    requeue: float | str | None = None  # "backoff": exactly until status.nextAttemptTime


TRANSITIONS: dict[str, Transition] = {
    # ---- start
    "new-run-is-queued": Transition(make_world(make_run()), ["PatchRunStatus"], "Queued", requeue=0.0),
    "created-with-a-cancel-epoch-is-not-a-cancel": Transition(
        make_world(make_run(spec={"cancelEpoch": 2})), ["PatchRunStatus"], "Queued", requeue=0.0
    ),
    "queued-grants-attempt-1": Transition(queued(), GRANT, "Running", {1: "Pending"}),
    "queued-grant-interrupted-after-the-lease": Transition(
        make_world(make_run(run_status("Queued")), lease=held_by(1)), ADOPTED_GRANT, "Running", {1: "Pending"}
    ),
    # ---- supervising a live Attempt
    "running-healthy": Transition(supervising(), [], requeue=30.05),
    "running-pod-started": Transition(
        supervising(attempt=NOT_STARTED), ["PatchAttemptStatus"], attempts={1: "Running"}, requeue=30.05
    ),
    "running-pod-not-started-yet": Transition(
        supervising(pod="pending", attempt=NOT_STARTED), [], requeue=30.05
    ),
    "running-pod-not-seen-yet": Transition(supervising(pod=None, attempt=NOT_STARTED), ["CreatePod"]),
    "running-lease-not-sighted-yet": Transition(supervising(expires_in=None), [], requeue=RECHECK_SECONDS),
    "running-lease-of-another-epoch": Transition(
        supervising(lease=held_by(1, epoch=7), expires_in=-10), [], requeue=RECHECK_SECONDS
    ),
    "running-lease-gone": Transition(
        make_world(
            make_run(run_status("Running", current=1, lease_epoch=1)),
            attempts=[make_attempt(1)],
            pods=[running_pod(1)],
        ),
        [],
        requeue=RECHECK_SECONDS,
    ),
    "running-lease-expired": Transition(
        supervising(expires_in=0.0),
        ["PatchAttemptStatus", "DeletePod", "PatchRunStatus"],
        "RetryBackoff",
        {1: "LeaseLost"},
        requeue="backoff",
    ),
    "running-lease-expired-before-the-pod-started": Transition(
        supervising(pod="pending", attempt=NOT_STARTED, expires_in=-5.0),
        ["PatchAttemptStatus", "DeletePod", "PatchRunStatus"],
        "RetryBackoff",
        {1: "LeaseLost"},
        requeue="backoff",
    ),
    "running-lease-expired-on-the-last-attempt": Transition(
        supervising(
            3,
            history=(
                failed_attempt(1, FailureClass.TRANSIENT, "one"),
                failed_attempt(2, FailureClass.TRANSIENT),
            ),
            expires_in=-1.0,
        ),
        ["PatchAttemptStatus", "DeletePod", "PatchRunStatus"],
        "Failed",
        {3: "LeaseLost"},
        stop_reason="RetryBudgetExhausted",
    ),
    "running-pod-vanished-after-start": Transition(
        supervising(pod=None),
        ["PatchAttemptStatus", "PatchRunStatus"],
        "RetryBackoff",
        {1: "Failed"},
        requeue="backoff",
    ),
    # ---- the agent container ended
    "pod-succeeded-with-commit": Transition(
        supervising(pod=ended(1, 0), committedBy=committed_by(1, 1), result={"ticket": "T-1"}),
        ["PatchAttemptStatus", "PatchRunStatus"],
        "Succeeded",
        {1: "Succeeded"},
    ),
    "pod-succeeded-commit-wins-over-pending-request": Transition(
        supervising(pod=ended(1, 0), committedBy=committed_by(1, 1), pendingRequest=WAITING),
        ["PatchAttemptStatus", "PatchRunStatus"],
        "Succeeded",
        {1: "Succeeded"},
    ),
    **{
        f"pod-succeeded-with-{reason.replace('_', '-')}-request": Transition(
            supervising(pod=ended(1, 0), pendingRequest=pending_request(reason)),
            ["PatchAttemptStatus", "PatchRunStatus"],
            phase,
            {1: "Interrupted"},
        )
        for reason, phase in [
            ("input_required", "InputRequired"),
            ("auth_required", "AuthRequired"),
            ("paused", "Paused"),
        ]
    },
    "exit-0-without-commit": Transition(
        supervising(pod=ended(1, 0)),
        ["PatchAttemptStatus", "PatchRunStatus"],
        "Failed",
        {1: "Failed"},
        stop_reason="NotRetryable",
    ),
    "exit-0-commit-by-another-attempt": Transition(
        supervising(
            2,
            pod=ended(2, 0),
            history=(failed_attempt(1, FailureClass.TRANSIENT),),
            committedBy=committed_by(1, 1),
        ),
        ["PatchAttemptStatus", "PatchRunStatus"],
        "Failed",
        {2: "Failed"},
        stop_reason="NotRetryable",
    ),
    **{
        f"retried-{case}": Transition(
            supervising(pod=pod),
            ["PatchAttemptStatus", "PatchRunStatus"],
            "RetryBackoff",
            {1: "Failed"},
            requeue="backoff",
        )
        for case, pod in [
            ("exit-75", ended(1, 75)),
            ("sdk-transient", ended(1, 75, sdk("transient", "upstream 503"))),
            ("sdk-rate-limited", ended(1, 1, sdk("rate_limited", "429", retryAfterSeconds=20))),
            ("oom-killed", ended(1, 137, reason="OOMKilled")),
            ("evicted", ended(1, 137, pod_reason="Evicted")),
            ("sigkill", ended(1, 137)),
            ("sigterm", ended(1, 143)),
        ]
    },
    **{
        f"not-retried-{case}": Transition(
            supervising(pod=pod),
            ["PatchAttemptStatus", "PatchRunStatus"],
            "Failed",
            {1: "Failed"},
            stop_reason="NotRetryable",
        )
        for case, pod in [
            ("exit-1", ended(1, 1, "KeyError: 'ticket'")),
            ("sdk-deterministic", ended(1, 1, sdk("deterministic", "bad input"))),
            ("sdk-cancelled", ended(1, 1, sdk("cancelled", "stopped"))),
            ("sdk-input-expired", ended(1, 1, sdk("input_expired", "nobody answered"))),
        ]
    },
    "unknown-side-effect-needs-reconciliation": Transition(
        supervising(pod=ended(1, 1, sdk("unknown_side_effect", "ticket may exist"))),
        ["PatchAttemptStatus", "PatchRunStatus"],
        "NeedsReconciliation",
        {1: "Failed"},
        stop_reason="UnknownSideEffect",
    ),
    "unknown-side-effect-even-if-listed-in-retry-on": Transition(
        supervising(
            pod=ended(1, 1, sdk("unknown_side_effect", "ticket may exist")),
            spec={"retry": {"retryOn": ["unknown_side_effect", "transient"]}},
        ),
        ["PatchAttemptStatus", "PatchRunStatus"],
        "NeedsReconciliation",
        {1: "Failed"},
        stop_reason="UnknownSideEffect",
    ),
    "not-retried-class-outside-retry-on": Transition(
        supervising(pod=ended(1, 75), spec={"retry": {"retryOn": ["rate_limited"]}}),
        ["PatchAttemptStatus", "PatchRunStatus"],
        "Failed",
        {1: "Failed"},
        stop_reason="NotRetryable",
    ),
    "retry-budget-exhausted": Transition(
        supervising(
            3,
            pod=ended(3, 75, "third"),
            history=(
                failed_attempt(1, FailureClass.TRANSIENT, "first"),
                failed_attempt(2, FailureClass.INFRASTRUCTURE),
            ),
        ),
        ["PatchAttemptStatus", "PatchRunStatus"],
        "Failed",
        {3: "Failed"},
        stop_reason="RetryBudgetExhausted",
    ),
    "same-error-twice": Transition(
        supervising(
            2, pod=ended(2, 75, TIMEOUT_2), history=(failed_attempt(1, FailureClass.TRANSIENT, TIMEOUT_1),)
        ),
        ["PatchAttemptStatus", "PatchRunStatus"],
        "Failed",
        {2: "Failed"},
        stop_reason="RepeatedFailure",
    ),
    "same-error-not-consecutive": Transition(
        supervising(
            3,
            pod=ended(3, 75, TIMEOUT_2),
            history=(
                failed_attempt(1, FailureClass.TRANSIENT, TIMEOUT_1),
                failed_attempt(2, FailureClass.TRANSIENT),
            ),
            spec={"retry": {"maxAttempts": 5}},
        ),
        ["PatchAttemptStatus", "PatchRunStatus"],
        "RetryBackoff",
        {3: "Failed"},
        requeue="backoff",
    ),
    "same-error-after-a-lease-loss": Transition(
        supervising(
            2, pod=ended(2, 75, TIMEOUT_2), history=(failed_attempt(1, FailureClass.LEASE_LOST, TIMEOUT_1),)
        ),
        ["PatchAttemptStatus", "PatchRunStatus"],
        "RetryBackoff",
        {2: "Failed"},
        requeue="backoff",
    ),
    # ---- crash recovery: the Run is ahead of its objects
    "attempt-1-missing": Transition(
        make_world(make_run(run_status("Running", current=1, lease_epoch=1)), lease=held_by(1)),
        ["CreateAttempt", "CreatePod", "PatchAttemptStatus"],
        attempts={1: "Pending"},
    ),
    "attempt-2-missing": Transition(
        make_world(
            make_run(run_status("Running", current=2, lease_epoch=2)),
            attempts=[failed_attempt(1, FailureClass.TRANSIENT)],
            lease=held_by(2),
        ),
        ["CreateAttempt", "CreatePod", "PatchAttemptStatus"],
        attempts={2: "Pending"},
    ),
    "attempt-created-pod-missing": Transition(
        supervising(pod=None, attempt=make_attempt(1, phase=None, started=False)),
        ["CreatePod", "PatchAttemptStatus"],
        attempts={1: "Pending"},
    ),
    # ---- crash recovery: the Attempt ended but the Run did not move on; the Attempt is left as it is
    **{
        f"run-catches-up-with-{case}": Transition(
            supervising(attempt=attempt, pod=pod, **status),
            ["PatchRunStatus"],
            phase,
            requeue="backoff" if phase == "RetryBackoff" else None,
            stop_reason="NotRetryable" if phase == "Failed" else None,
        )
        for case, attempt, pod, status, phase in CATCHING_UP
    },
    # ---- backoff
    "backoff-not-due-yet": Transition(backing_off(due=NOW + timedelta(seconds=40)), [], requeue=40.0),
    "backoff-due": Transition(backing_off(), GRANT, "Running", {2: "Pending"}),
    "backoff-due-exactly-now": Transition(backing_off(due=NOW), GRANT, "Running", {2: "Pending"}),
    "backoff-without-next-attempt-time": Transition(backing_off(due=None), GRANT, "Running", {2: "Pending"}),
    "backoff-grant-interrupted-after-the-lease": Transition(
        backing_off(lease=held_by(2)), ADOPTED_GRANT, "Running", {2: "Pending"}
    ),
    "backoff-after-lease-loss": Transition(
        backing_off(previous=make_attempt(1, phase="LeaseLost", failure=failure_of(FailureClass.LEASE_LOST))),
        GRANT,
        "Running",
        {2: "Pending"},
    ),
    # ---- cancel
    "cancel-live-pod": Transition(
        cancelled(supervising()), ["PatchRunStatus", "DeletePod"], "CancelRequested"
    ),
    "cancel-pending-pod": Transition(
        cancelled(supervising(pod="pending", attempt=NOT_STARTED)),
        ["PatchRunStatus", "DeletePod"],
        "CancelRequested",
    ),
    "cancel-pod-being-deleted": Transition(
        cancelled(supervising(pod=running_pod(1, deleting=True))),
        ["PatchRunStatus", "DeletePod"],
        "CancelRequested",
    ),
    "cancel-queued": Transition(cancelled(queued()), ["PatchRunStatus"], "Cancelled"),
    "cancel-attempt-without-pod": Transition(
        cancelled(supervising(pod=None, attempt=NOT_STARTED)),
        ["PatchAttemptStatus", "PatchRunStatus"],
        "Cancelled",
        {1: "Aborted"},
    ),
    "cancel-after-the-pod-ended": Transition(
        cancelled(supervising(pod=ended(1, 75))),
        ["PatchAttemptStatus", "PatchRunStatus"],
        "Cancelled",
        {1: "Aborted"},
    ),
    "cancel-during-backoff": Transition(cancelled(backing_off()), ["PatchRunStatus"], "Cancelled"),
    "cancel-while-waiting-for-input": Transition(
        cancelled(at_rest("InputRequired", pendingRequest=WAITING)), ["PatchRunStatus"], "Cancelled"
    ),
    "cancel-a-failed-run": Transition(cancelled(at_rest("Failed")), ["PatchRunStatus"], "Cancelled"),
    "cancel-requested-pod-not-stopped-yet": Transition(
        make_world(
            make_run(
                run_status("CancelRequested", current=1, lease_epoch=1, cancel_epoch=1),
                spec={"cancelEpoch": 1},
            ),
            attempts=[make_attempt(1)],
            pods=[running_pod(1)],
            lease=held_by(1),
        ),
        ["DeletePod"],
        requeue=RECHECK_SECONDS,
    ),
    "cancel-requested-pod-still-running": Transition(
        make_world(
            make_run(
                run_status("CancelRequested", current=1, lease_epoch=1, cancel_epoch=1),
                spec={"cancelEpoch": 1},
            ),
            attempts=[make_attempt(1)],
            pods=[running_pod(1, deleting=True)],
            lease=held_by(1),
        ),
        [],
        requeue=RECHECK_SECONDS,
    ),
    **{
        f"cancel-requested-{case}": Transition(
            make_world(
                make_run(
                    run_status("CancelRequested", current=1, lease_epoch=1, cancel_epoch=1),
                    spec={"cancelEpoch": cancel_epoch},
                ),
                attempts=[make_attempt(1)],
                pods=pods,
                lease=held_by(1),
            ),
            ["PatchAttemptStatus", "PatchRunStatus"],
            "Cancelled",
            {1: "Aborted"},
        )
        for case, pods, cancel_epoch in [
            ("pod-gone", [], 1),
            ("pod-ended", [ended(1, 143)], 1),
            ("raised-again-pod-gone", [], 2),
        ]
    },
    # ---- deadline
    "deadline-running": Transition(
        supervising(spec=DEADLINE),
        ["WriteLease", "PatchAttemptStatus", "DeletePod", "PatchRunStatus"],
        "Failed",
        {1: "Aborted"},
        stop_reason="DeadlineExceeded",
    ),
    "deadline-pod-ended": Transition(
        supervising(pod=ended(1, 75), spec=DEADLINE),
        ["WriteLease", "PatchAttemptStatus", "PatchRunStatus"],
        "Failed",
        {1: "Aborted"},
        stop_reason="DeadlineExceeded",
    ),
    "deadline-queued": Transition(
        make_world(make_run(run_status("Queued"), spec=DEADLINE)),
        ["WriteLease", "PatchRunStatus"],
        "Failed",
        stop_reason="DeadlineExceeded",
    ),
    "deadline-in-backoff": Transition(
        backing_off(spec=DEADLINE), ["WriteLease", "PatchRunStatus"], "Failed", stop_reason="DeadlineExceeded"
    ),
    "deadline-while-waiting": Transition(
        make_world(
            make_run(
                run_status("InputRequired", current=1, lease_epoch=1, pendingRequest=WAITING), spec=DEADLINE
            ),
            attempts=[make_attempt(1, phase="Interrupted")],
            lease=held_by(1),
        ),
        ["WriteLease", "PatchRunStatus"],
        "Failed",
        stop_reason="DeadlineExceeded",
    ),
    "deadline-revocation-interrupted": Transition(
        supervising(spec=DEADLINE, lease=make_lease(None, 2)),
        ["PatchAttemptStatus", "DeletePod", "PatchRunStatus"],
        "Failed",
        {1: "Aborted"},
        stop_reason="DeadlineExceeded",
    ),
    "deadline-exactly-now": Transition(
        supervising(spec={"deadlineSeconds": 600}),
        ["WriteLease", "PatchAttemptStatus", "DeletePod", "PatchRunStatus"],
        "Failed",
        {1: "Aborted"},
        stop_reason="DeadlineExceeded",
    ),
    "deadline-ahead-wakes-at-the-deadline": Transition(
        supervising(spec={"deadlineSeconds": 620}), [], requeue=20.0
    ),
    "deadline-ahead-lease-first": Transition(supervising(spec={"deadlineSeconds": 900}), [], requeue=30.05),
    "deadline-ahead-while-waiting": Transition(
        make_world(
            make_run(
                run_status("InputRequired", current=1, lease_epoch=1, pendingRequest=WAITING),
                spec={"deadlineSeconds": 3600},
            ),
            attempts=[make_attempt(1, phase="Interrupted")],
        ),
        [],
        requeue=3000.0,
    ),
    "cancel-wins-over-deadline": Transition(
        cancelled(supervising(spec=DEADLINE)), ["PatchRunStatus", "DeletePod"], "CancelRequested"
    ),
    # ---- nothing to do
    "succeeded-is-final": Transition(at_rest("Succeeded", committedBy=committed_by(1, 1)), []),
    "cancelled-is-final": Transition(at_rest("Cancelled", cancel_epoch=1), []),
    "failed-waits-for-a-manual-retry": Transition(at_rest("Failed"), []),
    "failed-ignores-the-deadline": Transition(
        make_world(make_run(run_status("Failed", current=1, lease_epoch=1), spec=DEADLINE)), []
    ),
    "needs-reconciliation-waits-for-a-person": Transition(at_rest("NeedsReconciliation"), []),
    "waiting-for-input": Transition(at_rest("InputRequired", pendingRequest=WAITING), []),
    "being-deleted": Transition(
        make_world(
            make_run(
                run_status("Running", current=1, lease_epoch=1), metadata={"deletionTimestamp": ts(NOW)}
            ),
            attempts=[make_attempt(1)],
            pods=[ended(1, 75)],
            lease=held_by(1),
            expires_in=-100.0,
        ),
        [],
    ),
    "being-deleted-before-queued": Transition(
        make_world(make_run(metadata={"deletionTimestamp": ts(NOW)})), []
    ),
}


def next_attempt_time(plan: Plan) -> datetime:
    return datetime.fromisoformat(run_patch(plan)["nextAttemptTime"].replace("Z", "+00:00"))


@pytest.mark.parametrize("case", TRANSITIONS.values(), ids=TRANSITIONS.keys())
def test_transition(case: Transition) -> None:
    plan = decide(case.world)

    assert kinds(plan) == case.writes
    patches = of_type(plan, PatchRunStatus)
    assert [p.patch["phase"] for p in patches] == ([case.phase] if case.phase else [])
    assert {name: p[-1]["phase"] for name, p in attempt_patches(plan).items()} == {
        name_of(n): phase for n, phase in case.attempts.items()
    }
    if case.stop_reason is not None:
        assert run_patch(plan)["failure"]["reason"] == case.stop_reason
    elif patches:
        assert "failure" not in run_patch(plan)
    if case.requeue == "backoff":
        delay = (next_attempt_time(plan) - case.world.now).total_seconds()
        assert plan.requeue_after == delay > 0
    else:
        assert plan.requeue_after == (pytest.approx(case.requeue) if case.requeue is not None else None)


CASES_WITH_STATUS_PATCHES = {k: c for k, c in TRANSITIONS.items() if "PatchRunStatus" in c.writes}


@pytest.mark.parametrize("case", CASES_WITH_STATUS_PATCHES.values(), ids=CASES_WITH_STATUS_PATCHES.keys())
def test_every_status_patch_has_conditions_and_generation(case: Transition) -> None:
    patch = run_patch(decide(case.world))

    assert patch["observedGeneration"] == GENERATION
    assert patch["message"]
    assert [c["type"] for c in patch["conditions"]] == CONDITION_TYPES
    for condition in patch["conditions"]:
        assert condition["observedGeneration"] == GENERATION
        assert condition["status"] in ("True", "False", "Unknown")
        assert condition["reason"]
        assert condition["lastTransitionTime"]
    assert [c["status"] for c in patch["conditions"]] == CONDITION_FACTS[RunPhase(patch["phase"])]


@pytest.mark.parametrize("case", TRANSITIONS.values(), ids=TRANSITIONS.keys())
def test_created_objects_are_valid(case: Transition) -> None:
    plan = decide(case.world)
    for create in of_type(plan, CreateAttempt):
        attempt = Attempt.model_validate(create.body)
        assert attempt.metadata.name == name_of(attempt.spec.number)
    attempts = {str(a.metadata.name) for a in case.world.attempts.values()}
    attempts |= {c.body["metadata"]["name"] for c in of_type(plan, CreateAttempt)}
    for pod in of_type(plan, CreatePod):
        name = pod.body["metadata"]["name"]
        assert name in attempts, "a Pod only for an Attempt that exists or is created first"
        assert [r["name"] for r in pod.body["metadata"]["ownerReferences"]] == [RUN, name]


@pytest.mark.parametrize("case", TRANSITIONS.values(), ids=TRANSITIONS.keys())
def test_decide_is_pure(case: Transition) -> None:
    before = case.world.run.model_dump()
    first, second = decide(case.world), decide(case.world)

    assert first == second
    assert case.world.run.model_dump() == before


# ---- the grant ---------------------------------------------------------------------------------------------


def test_first_grant() -> None:
    plan = decide(queued())
    lease, status, create, pod, pending = plan.actions[:5]

    assert lease == WriteLease(name_of(1), 1, 60, None)
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
    assert pending == PatchAttemptStatus(name_of(1), {"phase": "Pending", "podName": name_of(1)})
    assert events(plan) == [("Normal", "AttemptStarted")]


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

    assert of_type(plan, WriteLease) == [WriteLease(name_of(3), 3, 60, LEASE_RESOURCE_VERSION)]
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


def test_an_interrupted_grant_after_a_deadline_revocation() -> None:
    """Not reachable today (a Failed Run is not granted again), but a Lease nobody holds is taken over."""
    world = backing_off(lease=make_lease(None, 2))
    assert of_type(decide(world), WriteLease) == [WriteLease(name_of(2), 3, 60, LEASE_RESOURCE_VERSION)]


def test_grant_carries_the_cancel_epoch() -> None:
    world = backing_off(cancel_epoch=2, spec={"cancelEpoch": 2})
    plan = decide(world)

    assert run_patch(plan)["observedCancelEpoch"] == 2
    assert of_type(plan, CreateAttempt)[0].body["spec"]["cancelEpoch"] == 2
    assert of_type(plan, CreatePod)[0].body["metadata"]["annotations"]["agentrun.dev/cancel-epoch"] == "2"


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


# ---- failures and retries ----------------------------------------------------------------------------------


def test_retry_backoff_patch() -> None:
    plan = decide(supervising(pod=ended(1, 75, TIMEOUT_1)))
    patch = run_patch(plan)
    delay = backoff_seconds(make_run().spec.retry, 1, RUN_UID)
    due = next_attempt_time(plan)

    assert patch["phase"] == "RetryBackoff"
    assert 4 <= delay < 6
    assert NOW + timedelta(seconds=delay) <= due < NOW + timedelta(seconds=delay + 1)
    assert "Attempt 2 starts at" in patch["message"]
    assert "failure" not in patch
    assert events(plan) == [("Warning", "AttemptFailed"), ("Normal", "RetryScheduled")]
    failure = attempt_patches(plan)[name_of(1)][0]["failure"]
    assert failure["class"] == "transient"
    assert failure["exitCode"] == 75
    assert failure["fingerprint"] == fingerprint(FailureClass.TRANSIENT, TIMEOUT_1)


@pytest.mark.parametrize("fraction", [0.0, 0.001, 0.5, 0.999])
def test_next_attempt_time_never_comes_early(fraction: float) -> None:
    """status holds whole seconds; the stored time is rounded up, never down."""
    now = NOW + timedelta(seconds=fraction)
    plan = decide(supervising(pod=ended(1, 1, sdk("rate_limited", "429", retryAfterSeconds=30)), now=now))
    due = next_attempt_time(plan)

    assert due >= now + timedelta(seconds=30)
    assert due.microsecond == 0
    assert plan.requeue_after == (due - now).total_seconds()
    just_before = replace(backing_off(due=due), now=now + timedelta(seconds=29.999))
    assert kinds(decide(just_before)) == []


@pytest.mark.parametrize(
    ("retry_after", "at_least"), [(120, 120), (1000, 1000), (1, 4)], ids=["2m", "over-the-cap", "short"]
)
def test_retry_after_delays_the_next_attempt(retry_after: int, at_least: int) -> None:
    plan = decide(supervising(pod=ended(1, 1, sdk("rate_limited", "429", retryAfterSeconds=retry_after))))

    assert next_attempt_time(plan) >= NOW + timedelta(seconds=at_least)
    assert attempt_patches(plan)[name_of(1)][0]["failure"]["retryAfterSeconds"] == retry_after


def test_failed_run_records_the_failure() -> None:
    plan = decide(
        supervising(
            2, pod=ended(2, 75, TIMEOUT_2), history=(failed_attempt(1, FailureClass.TRANSIENT, TIMEOUT_1),)
        )
    )
    patch = run_patch(plan)

    assert patch["failure"] == {
        "class": "transient",
        "reason": "RepeatedFailure",
        "message": TIMEOUT_2,
        "fingerprint": fingerprint(FailureClass.TRANSIENT, TIMEOUT_1),
    }
    succeeded = next(c for c in patch["conditions"] if c["type"] == "Succeeded")
    assert (succeeded["status"], succeeded["reason"]) == ("False", "RepeatedFailure")
    assert ("Warning", "RepeatedFailure") in events(plan)


def test_exit_0_without_commit_is_a_deterministic_failure() -> None:
    plan = decide(supervising(pod=ended(1, 0)))
    failure = attempt_patches(plan)[name_of(1)][0]["failure"]

    assert failure["class"] == "deterministic"
    assert failure["exitCode"] == 0
    assert "without committing" in failure["message"]


def test_success() -> None:
    plan = decide(supervising(pod=ended(1, 0), committedBy=committed_by(1, 1), result={"ticket": "T-1"}))
    attempt = attempt_patches(plan)[name_of(1)][0]

    assert attempt == {"phase": "Succeeded", "completionTime": ts(NOW)}
    succeeded = next(c for c in run_patch(plan)["conditions"] if c["type"] == "Succeeded")
    assert succeeded["status"] == "True"
    assert events(plan) == [("Normal", "Succeeded")]


@pytest.mark.parametrize("reason", ["input_required", "auth_required", "paused"])
def test_interrupt_is_waiting(reason: str) -> None:
    plan = decide(supervising(pod=ended(1, 0), pendingRequest=pending_request(reason, "req-9")))
    patch = run_patch(plan)
    waiting = next(c for c in patch["conditions"] if c["type"] == "Waiting")

    assert attempt_patches(plan)[name_of(1)] == [{"phase": "Interrupted", "completionTime": ts(NOW)}]
    assert waiting["status"] == "True"
    assert "req-9" in patch["message"]


def test_pod_start_is_recorded() -> None:
    plan = decide(supervising(attempt=NOT_STARTED))
    assert attempt_patches(plan) == {
        name_of(1): [{"phase": "Running", "startTime": running_pod(1).running_since, "podName": name_of(1)}]
    }


# ---- lease expiry ------------------------------------------------------------------------------------------


def test_lease_expiry() -> None:
    plan = decide(supervising(expires_in=-0.5))
    lost = attempt_patches(plan)[name_of(1)]

    assert lost[0]["phase"] == "LeaseLost"
    assert lost[0]["failure"]["class"] == "lease_lost"
    assert "60s" in lost[0]["failure"]["message"]
    assert of_type(plan, DeletePod) == [DeletePod(name_of(1), grace_seconds=0)]
    assert run_patch(plan)["phase"] == "RetryBackoff"
    assert of_type(plan, WriteLease) == [], "the Lease is taken over when the next Attempt is granted"


def test_lease_about_to_expire_wakes_just_after() -> None:
    assert decide(supervising(expires_in=0.2)).requeue_after == pytest.approx(0.25)


def test_repeated_lease_loss_stops_the_run() -> None:
    world = supervising(
        2,
        expires_in=-1.0,
        history=(
            make_attempt(
                1,
                phase="LeaseLost",
                failure=failure_of(FailureClass.LEASE_LOST, "the worker did not renew its lease within 60s"),
            ),
        ),
    )
    plan = decide(world)

    assert run_patch(plan)["failure"]["reason"] == "RepeatedFailure"


# ---- cancel and deadline -----------------------------------------------------------------------------------


def test_cancel_stops_the_pod() -> None:
    plan = decide(cancelled(supervising(), epoch=3))
    patch = run_patch(plan)

    assert patch["observedCancelEpoch"] == 3
    assert of_type(plan, DeletePod) == [DeletePod(name_of(1))]
    cancel = next(c for c in patch["conditions"] if c["type"] == "CancelRequested")
    assert cancel["status"] == "True"
    assert ("Normal", "CancelRequested") in events(plan)


def test_cancelled() -> None:
    world = make_world(
        make_run(
            run_status("CancelRequested", current=1, lease_epoch=1, cancel_epoch=1), spec={"cancelEpoch": 2}
        ),
        attempts=[make_attempt(1)],
    )
    plan = decide(world)
    patch = run_patch(plan)

    assert attempt_patches(plan)[name_of(1)][0]["failure"]["class"] == "cancelled"
    assert patch["observedCancelEpoch"] == 2
    assert patch["nextAttemptTime"] is None
    assert [c["status"] for c in patch["conditions"]] == ["False", "False", "True", "False"]


def test_deadline() -> None:
    plan = decide(supervising(3, spec=DEADLINE, lease=held_by(3, epoch=4)))
    patch = run_patch(plan)
    aborted = attempt_patches(plan)[name_of(3)][0]

    assert of_type(plan, WriteLease) == [WriteLease(None, 5, 60, LEASE_RESOURCE_VERSION)]
    assert patch["leaseEpoch"] == 5
    assert patch["nextAttemptTime"] is None
    assert patch["failure"] == {
        "class": "cancelled",
        "reason": "DeadlineExceeded",
        "message": "the Run exceeded its deadline of 300s",
    }
    assert aborted["phase"] == "Aborted"
    assert aborted["failure"]["class"] == "cancelled"
    assert of_type(plan, DeletePod) == [DeletePod(name_of(3))]
    assert ("Warning", "DeadlineExceeded") in events(plan)


def test_deadline_before_any_lease() -> None:
    plan = decide(make_world(make_run(run_status("Queued"), spec=DEADLINE)))

    assert of_type(plan, WriteLease) == [WriteLease(None, 1, 60, None)]
    assert run_patch(plan)["leaseEpoch"] == 1


def test_deadline_revocation_interrupted_is_not_repeated() -> None:
    """The Lease was revoked (epoch 2) and the operator died before writing the Run: epoch 2 stands."""
    plan = decide(supervising(spec=DEADLINE, lease=make_lease(None, 2, resource_version="4712")))

    assert of_type(plan, WriteLease) == []
    assert run_patch(plan)["leaseEpoch"] == 2


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
def test_plan_wakes_at_the_earliest(wakes: list[float], expected: float | None) -> None:
    plan = Plan()
    for seconds in wakes:
        plan.wake_in(seconds)
    assert plan.requeue_after == expected


def test_plan_keeps_order_and_filters_by_kind() -> None:
    plan = Plan().add(DeletePod("a"), RecordEvent("Normal", "X", "x"), DeletePod("b"))
    assert plan.of(DeletePod) == [DeletePod("a"), DeletePod("b")]
    assert [type(a) for a in plan.actions] == [DeletePod, RecordEvent, DeletePod]


# ---- restart safety, by simulation -------------------------------------------------------------------------


def merge(target: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """A JSON merge patch (RFC 7386)."""
    out = copy.deepcopy(target)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


class Violation(AssertionError):
    """A write the API server would refuse, or one that breaks a promise of DESIGN.md."""


@dataclass
class Cluster:
    """An API server, a kubelet and the workers, in memory: enough to carry out Plans like the executor.

    Writes are checked as the API server would (resourceVersion preconditions, idempotent creates by
    name, an ended Attempt keeps its phase) plus the promises of restart safety (a lease epoch only ever
    moves by one, an Attempt is never created with another spec than the first time).

    Each attempt's fate is scripted: "exit:<code>[:<message>]" ends it after it ran one tick, "commit"
    commits a result and exits 0, "hang" keeps it running without renewing its lease, "forever" keeps
    it running and renewing, "cancel" makes the user raise spec.cancelEpoch while it runs.
    """

    spec: dict[str, Any]
    fates: dict[int, str]
    clock: float = 1.0  # seconds since the Run was created, also the operator's monotonic clock
    status: dict[str, Any] | None = None
    attempts: dict[str, dict[str, Any]] = field(default_factory=dict)
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    lease: dict[str, Any] | None = None
    sighting: Sighting | None = None
    resource_version: int = 100
    lease_epochs: list[int] = field(default_factory=list)  # every epoch written, in order
    pods_created: list[str] = field(default_factory=list)

    @property
    def now(self) -> datetime:
        return CREATED + timedelta(seconds=self.clock)

    def _next_rv(self) -> str:
        self.resource_version += 1
        return str(self.resource_version)

    def world(self) -> World:
        lease = expires_in = None
        if self.lease is not None:
            lease = LeaseView(
                self.lease["holder"], self.lease["epoch"], self.lease["duration"], self.lease["rv"]
            )
            self.sighting = sight(self.sighting, lease.resource_version, self.clock)
            expires_in = seconds_until_expiry(self.sighting, lease.duration_seconds, self.clock)
        parsed = (Attempt.model_validate(body) for body in self.attempts.values())
        views = (pod_view(body) for body in self.pods.values())
        return World(
            run=make_run(self.status, spec=self.spec),
            attempts={a.spec.number: a for a in parsed},
            pods={v.name: v for v in views},
            lease=lease,
            now=self.now,
            lease_expires_in=expires_in,
        )

    # ---- the API server

    def apply(self, action: Action) -> None:
        match action:
            case PatchRunStatus(patch=patch):
                old = self.status or {}
                if old.get("phase") in ("Succeeded", "Cancelled"):
                    raise Violation(f"a {old['phase']} Run changed: {patch}")
                if patch.get("leaseEpoch", old.get("leaseEpoch", 0)) < old.get("leaseEpoch", 0):
                    raise Violation(
                        f"status.leaseEpoch went back: {old['leaseEpoch']} -> {patch['leaseEpoch']}"
                    )
                self.status = merge(old, patch)
            case WriteLease(
                holder=holder, epoch=epoch, duration_seconds=duration, expected_resource_version=rv
            ):
                if rv is None and self.lease is not None:
                    raise Violation("the Lease was created twice")
                if rv is not None and (self.lease is None or self.lease["rv"] != rv):
                    raise Violation(f"the Lease write expected resourceVersion {rv}: it changed")
                previous = self.lease["epoch"] if self.lease else 0
                # A revoked Lease (no holder) carries a fresh epoch that the next grant gives out as is.
                adopts_revoked = self.lease is not None and self.lease["holder"] is None and holder is not None
                if epoch != (previous if adopts_revoked else previous + 1):
                    raise Violation(f"lease epoch {previous} -> {epoch}: skipped or reused")
                self.lease = {"holder": holder, "epoch": epoch, "duration": duration, "rv": self._next_rv()}
                if not adopts_revoked:
                    self.lease_epochs.append(epoch)
            case CreateAttempt(body=body):
                name, epoch = body["metadata"]["name"], body["spec"]["leaseEpoch"]
                granted = self.lease is not None and (self.lease["holder"], self.lease["epoch"]) == (
                    name,
                    epoch,
                )
                if not granted or (self.status or {}).get("leaseEpoch") != epoch:
                    raise Violation(f"{name} created before lease epoch {epoch} was granted and recorded")
                if name in self.attempts:
                    if self.attempts[name]["spec"] != body["spec"]:
                        raise Violation(f"{name} created again with another spec")
                    return
                stored = copy.deepcopy(body)
                stored["metadata"]["uid"] = f"uid-{name}"
                self.attempts[name] = stored
            case PatchAttemptStatus(name=name, patch=patch):
                attempt = self.attempts[name]
                phase = attempt["status"].get("phase")
                if phase in FINISHED and patch.get("phase", phase) != phase:
                    raise Violation(f"{name} ended {phase} and was rewritten to {patch['phase']}")
                attempt["status"] = merge(attempt["status"], patch)
            case CreatePod(body=body):
                name = body["metadata"]["name"]
                if name not in self.attempts:
                    raise Violation(f"Pod {name} before its Attempt")
                if name not in self.pods:
                    self.pods[name] = {"metadata": {"name": name}, "status": {"phase": "Pending"}}
                    self.pods_created.append(name)
            case DeletePod(name=name):
                if name in self.pods:
                    self.pods[name]["metadata"]["deletionTimestamp"] = ts(self.now)
            case RecordEvent():
                pass

    def check_lease_matches_the_run(self) -> None:
        """After a complete decision, a Running Run's current Attempt holds the lease the Run records."""
        status = self.status or {}
        if status.get("phase") == "Running":
            holder = name_of(status["currentAttempt"])
            assert self.lease is not None
            assert (self.lease["holder"], self.lease["epoch"]) == (holder, status["leaseEpoch"])

    # ---- the kubelet and the workers

    def kubelet(self) -> bool:
        """Moves every Pod one step on; True if anything the operator watches changed (renewals aside)."""
        changed = False
        for name, pod in list(self.pods.items()):
            status = pod["status"]
            if pod["metadata"].get("deletionTimestamp"):
                del self.pods[name]
                changed = True
                continue
            if status["phase"] == "Pending":
                pod["status"] = {
                    "phase": "Running",
                    "containerStatuses": [
                        {"name": "agent", "state": {"running": {"startedAt": ts(self.now)}}}
                    ],
                }
                changed = True
                continue
            if status["phase"] != "Running":
                continue
            fate = self.fates[self.attempts[name]["spec"]["number"]]
            if fate == "hang":
                continue
            if fate in ("forever", "cancel"):
                if fate == "cancel" and not self.spec.get("cancelEpoch"):
                    self.spec["cancelEpoch"] = 1  # the user cancels; this agent ignores it
                    changed = True
                if self.lease and self.lease["holder"] == name:
                    self.lease["rv"] = self._next_rv()
                continue
            if fate == "commit":
                self._commit(name)
                self._end(name, 0, "")
            else:
                _, code, *message = fate.split(":", 2)
                self._end(name, int(code), message[0] if message else None)
            changed = True
        return changed

    def _commit(self, name: str) -> None:
        spec, status = self.attempts[name]["spec"], self.status or {}
        if (spec["leaseEpoch"], spec["cancelEpoch"]) != (
            status.get("leaseEpoch"),
            self.spec.get("cancelEpoch", 0),
        ):
            raise Violation(f"{name} was fenced off while it was still the Run's current Attempt")
        record = {"attempt": name, "leaseEpoch": spec["leaseEpoch"], "cancelEpoch": spec["cancelEpoch"]}
        self.status = merge(status, {"result": {"done": True}, "committedBy": record})

    def _end(self, name: str, code: int, message: str | None) -> None:
        terminated: dict[str, Any] = {"exitCode": code, "reason": "Completed" if code == 0 else "Error"}
        if message is not None:
            terminated["message"] = message
        self.pods[name]["status"] = {
            "phase": "Succeeded" if code == 0 else "Failed",
            "containerStatuses": [{"name": "agent", "state": {"terminated": terminated}}],
        }

    # ---- the operator

    def drive(self, crash: tuple[int, int] | None = None, max_steps: int = 60) -> list[Plan]:
        """Decide and write until the Run rests; with crash=(step, n) the operator dies after the first
        n writes of decision `step`, and a new one (whose lease clock starts afresh) takes over.

        Time moves 1 s after any change the operator would be told about (its own writes, a Pod moving
        on, a restart), otherwise as far as the decision asked to be woken."""
        plans = []
        for step in range(max_steps):
            plan = decide(self.world())
            plans.append(plan)
            actions = plan.actions
            restarted = False
            if crash is not None and crash[0] == step:
                actions, restarted = actions[: crash[1]], True
                self.sighting = None
            for action in actions:
                self.apply(action)
            if not restarted:
                self.check_lease_matches_the_run()
            phase = (self.status or {}).get("phase")
            if (
                not plan.actions
                and plan.requeue_after is None
                and phase in ("Succeeded", "Failed", "Cancelled")
            ):
                return plans
            changed = self.kubelet() or restarted or any(not isinstance(a, RecordEvent) for a in actions)
            self.clock += 1.0 if changed or plan.requeue_after is None else plan.requeue_after
        raise AssertionError(f"the Run did not come to rest: {self.status}")


@dataclass(frozen=True)
class Story:
    fates: dict[int, str]
    phase: str
    attempts: list[tuple[str, str]]  # (phase, reason) of each Attempt, in order
    lease_epochs: list[int]
    stop_reason: str | None = None
    spec: dict[str, Any] = field(default_factory=dict)


STORIES = {
    "first-try": Story({1: "commit"}, "Succeeded", [("Succeeded", "initial")], [1]),
    "transient-then-success": Story(
        {1: "exit:75:upstream timeout", 2: "commit"},
        "Succeeded",
        [("Failed", "initial"), ("Succeeded", "retry:transient")],
        [1, 2],
    ),
    "lease-lost-then-success": Story(
        {1: "hang", 2: "commit"},
        "Succeeded",
        [("LeaseLost", "initial"), ("Succeeded", "lease_expired")],
        [1, 2],
    ),
    "same-error-twice": Story(
        {1: "exit:75:timeout after 3012ms", 2: "exit:75:timeout after 2990ms"},
        "Failed",
        [("Failed", "initial"), ("Failed", "retry:transient")],
        [1, 2],
        "RepeatedFailure",
    ),
    "budget-exhausted": Story(
        {1: "exit:137", 2: "exit:75", 3: "exit:143"},
        "Failed",
        [("Failed", "initial"), ("Failed", "retry:infrastructure"), ("Failed", "retry:transient")],
        [1, 2, 3],
        "RetryBudgetExhausted",
    ),
    "deterministic": Story({1: "exit:1:KeyError"}, "Failed", [("Failed", "initial")], [1], "NotRetryable"),
    "deadline": Story(
        {1: "forever"},
        "Failed",
        [("Aborted", "initial")],
        [1, 2],
        "DeadlineExceeded",
        {"deadlineSeconds": 100},
    ),
    "cancel": Story({1: "cancel"}, "Cancelled", [("Aborted", "initial")], [1]),
}


def check_story(story: Story, crash: tuple[int, int] | None) -> None:
    cluster = Cluster(spec=copy.deepcopy(story.spec), fates=story.fates)
    cluster.drive(crash)
    status = cluster.status or {}
    attempts = sorted(cluster.attempts.values(), key=lambda a: a["spec"]["number"])

    assert status["phase"] == story.phase
    assert (status.get("failure") or {}).get("reason") == story.stop_reason
    assert [(a["status"]["phase"], a["spec"]["reason"]) for a in attempts] == story.attempts
    assert [a["spec"]["leaseEpoch"] for a in attempts] == list(range(1, len(attempts) + 1))
    assert cluster.lease_epochs == story.lease_epochs
    assert status["leaseEpoch"] == story.lease_epochs[-1]
    assert status["currentAttempt"] == status["attempts"] == len(attempts)
    assert sorted(cluster.pods_created) == [a["metadata"]["name"] for a in attempts]  # one Pod per Attempt
    if story.phase == "Succeeded":
        assert status["committedBy"]["attempt"] == attempts[-1]["metadata"]["name"]


@pytest.mark.parametrize("story", STORIES.values(), ids=STORIES.keys())
def test_story(story: Story) -> None:
    check_story(story, crash=None)


def crash_points() -> dict[str, tuple[Story, tuple[int, int]]]:
    """Every place an operator can die in every story: after n writes of decision `step` (n < all)."""
    points = {}
    for name, story in STORIES.items():
        plans = Cluster(spec=copy.deepcopy(story.spec), fates=story.fates).drive()
        for step, plan in enumerate(plans):
            for n in range(len(plan.actions)):
                if n and isinstance(plan.actions[n - 1], RecordEvent):
                    continue  # an Event changes nothing: same as dying before it
                done = "+".join(type(a).__name__ for a in plan.actions[:n] if not isinstance(a, RecordEvent))
                points[f"{name}-decision{step}-after-{done or 'nothing'}"] = (story, (step, n))
    return points


CRASH_POINTS = crash_points()


@pytest.mark.parametrize(("story", "crash"), CRASH_POINTS.values(), ids=CRASH_POINTS.keys())
def test_operator_killed_between_writes(story: Story, crash: tuple[int, int]) -> None:
    check_story(story, crash)
