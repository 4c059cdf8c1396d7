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
    Checkpoint,
    FailureClass,
    RunPhase,
    SideEffect,
    json_digest,
)
from agentrun.api.budgets import POD_SPEC_BUDGET, RUN_INPUT_BUDGET
from agentrun.core import controls, failures, report
from agentrun.core.conditions import conditions_for
from agentrun.core.failures import fingerprint
from agentrun.core.lease import LeaseView, Sighting, seconds_until_expiry, sight
from agentrun.core.plan import (
    Action,
    CreateAttempt,
    CreatePod,
    DeleteCheckpoint,
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
    NO_SIDE_EFFECTS,
    NOW,
    RUN,
    RUN_UID,
    TRACE_ID,
    attempt_patches,
    committed_by,
    ended_pod,
    events,
    failed_attempt,
    failure_of,
    held_by,
    kinds,
    make_attempt,
    make_checkpoint,
    make_lease,
    make_run,
    make_side_effect,
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

GRANT = ["WriteLease", "PatchRunStatus", "CreateAttempt", "CreatePod"]
# The Attempt is marked, the Lease revoked at once (a new epoch), its Pod killed, then the Run moves on.
LEASE_LOST = ["WriteLease", "PatchRunStatus", "DeletePod", "PatchAttemptStatus"]
ADOPTED_GRANT = ["PatchRunStatus", "CreateAttempt", "CreatePod"]
# A grant after an earlier Attempt first deletes that Attempt's Pod, whose token could still write.
SUCCESSOR_GRANT = ["DeletePod", *GRANT]
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
ONE_IRREVERSIBLE = {"confirmed": 1, "compensated": 0, "unknown": 0, "irreversible": 1}
WAITING = pending_request("input_required")
LOST = make_attempt(1, phase="LeaseLost", failure=failure_of(FailureClass.LEASE_LOST))
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
    lease_check: float | None = None  # when to look again unless the Lease was renewed meanwhile
    # The exact fields of a Run status patch that sets no phase (a control record, a report refresh).
    status_fields: frozenset[str] | None = None


TRANSITIONS: dict[str, Transition] = {
    # ---- start
    # The reconcile that first sees a Run grants its first Attempt: no Queued write before it.
    "new-run-grants-attempt-1": Transition(make_world(make_run()), GRANT, "Running"),
    "created-with-a-cancel-epoch-is-not-a-cancel": Transition(
        make_world(make_run(spec={"cancelEpoch": 2})), GRANT, "Running"
    ),
    "new-run-grant-interrupted-after-the-lease": Transition(
        make_world(make_run(), lease=held_by(1)), ADOPTED_GRANT, "Running"
    ),
    # A Run an earlier operator version left Queued.
    "queued-grants-attempt-1": Transition(queued(), GRANT, "Running"),
    "queued-grant-interrupted-after-the-lease": Transition(
        make_world(make_run(run_status("Queued")), lease=held_by(1)), ADOPTED_GRANT, "Running"
    ),
    # ---- supervising a live Attempt
    "running-healthy": Transition(supervising(), [], lease_check=30.05),
    "running-pod-started": Transition(
        supervising(attempt=NOT_STARTED), ["PatchAttemptStatus"], attempts={1: "Running"}, lease_check=30.05
    ),
    # The lease is judged once the agent runs: scheduling and image pulls do not count against it.
    "running-pod-not-started-yet": Transition(
        supervising(pod="pending", attempt=NOT_STARTED), [], requeue=RECHECK_SECONDS
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
        LEASE_LOST,
        "RetryBackoff",
        {1: "LeaseLost"},
        requeue="backoff",
    ),
    "running-lease-not-judged-before-the-pod-started": Transition(
        supervising(pod="pending", attempt=NOT_STARTED, expires_in=-5.0), [], requeue=RECHECK_SECONDS
    ),
    "running-lease-not-judged-before-the-pod-is-seen": Transition(
        supervising(pod=None, attempt=NOT_STARTED, expires_in=-5.0), ["CreatePod"]
    ),
    "running-lease-expired-pod-being-deleted": Transition(
        supervising(pod=running_pod(1, deleting=True), expires_in=-1.0),
        LEASE_LOST,
        "RetryBackoff",
        {1: "LeaseLost"},
        requeue="backoff",
    ),
    "running-lease-expired-after-a-resume": Transition(
        supervising(
            2,
            attempt=make_attempt(2, reason="resume:req-1", input_value={"answer": 42}),
            history=(make_attempt(1, phase="Interrupted"),),
            expires_in=-1.0,
            spec={"retry": {"maxAttempts": 1}},
        ),
        LEASE_LOST,
        "Failed",
        {2: "LeaseLost"},
        stop_reason="RetryBudgetExhausted",
    ),
    "running-lease-expired-lease-lost-not-retried": Transition(
        supervising(expires_in=-1.0, spec={"retry": {"retryOn": ["transient"]}}),
        LEASE_LOST,
        "Failed",
        {1: "LeaseLost"},
        stop_reason="NotRetryable",
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
        LEASE_LOST,
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
        ["CreateAttempt", "CreatePod"],
    ),
    "attempt-2-missing": Transition(
        make_world(
            make_run(run_status("Running", current=2, lease_epoch=2)),
            attempts=[failed_attempt(1, FailureClass.TRANSIENT)],
            lease=held_by(2),
        ),
        ["CreateAttempt", "CreatePod"],
    ),
    "attempt-created-pod-missing": Transition(
        supervising(pod=None, attempt=make_attempt(1, phase=None, started=False)),
        ["CreatePod"],
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
    # ---- crash recovery: the takeover interrupted after it revoked the Lease, or after it wrote the Run
    "lease-revoked-run-not-written": Transition(
        supervising(pod="running", lease=make_lease(None, 2), expires_in=None),
        ["PatchRunStatus", "DeletePod", "PatchAttemptStatus"],
        "RetryBackoff",
        {1: "LeaseLost"},
        requeue="backoff",
    ),
    "backoff-with-its-lost-attempt-unfinished": Transition(
        backing_off(previous=make_attempt(1), lease=make_lease(None, 2), leaseEpoch=2),
        ["PatchAttemptStatus"],
        attempts={1: "LeaseLost"},
        requeue=0.0,
    ),
    # ---- crash recovery: the lease loss was recorded first (by an operator before the takeover wrote
    # the Run first), the takeover not (all) done
    **{
        f"lease-loss-recorded-{case}": Transition(
            supervising(attempt=LOST, pod=pod, lease=lease, expires_in=None),
            writes,
            "RetryBackoff",
            requeue="backoff",
        )
        for case, pod, lease, writes in [
            ("lease-and-pod-left", running_pod(1), held_by(1), LEASE_LOST[:3]),
            ("lease-left-pod-gone", None, held_by(1), ["WriteLease", "PatchRunStatus"]),
            ("lease-left-pod-ended", ended(1, 137), held_by(1), ["WriteLease", "PatchRunStatus"]),
            ("pod-left", running_pod(1), make_lease(None, 2), ["PatchRunStatus", "DeletePod"]),
            (
                "pod-being-deleted",
                running_pod(1, deleting=True),
                make_lease(None, 2),
                ["PatchRunStatus", "DeletePod"],
            ),
            ("only-the-run-left", None, make_lease(None, 2), ["PatchRunStatus"]),
        ]
    },
    # ---- backoff
    "backoff-not-due-yet": Transition(backing_off(due=NOW + timedelta(seconds=40)), [], requeue=40.0),
    "backoff-due": Transition(backing_off(), SUCCESSOR_GRANT, "Running"),
    "backoff-due-exactly-now": Transition(backing_off(due=NOW), SUCCESSOR_GRANT, "Running"),
    "backoff-without-next-attempt-time": Transition(backing_off(due=None), SUCCESSOR_GRANT, "Running"),
    "backoff-grant-interrupted-after-the-lease": Transition(
        backing_off(lease=held_by(2)), ["DeletePod", *ADOPTED_GRANT], "Running"
    ),
    "backoff-after-lease-loss": Transition(
        backing_off(previous=make_attempt(1, phase="LeaseLost", failure=failure_of(FailureClass.LEASE_LOST))),
        SUCCESSOR_GRANT,
        "Running",
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
        supervising(spec={"deadlineSeconds": 620}), [], requeue=20.0, lease_check=30.05
    ),
    "deadline-ahead-lease-first": Transition(
        supervising(spec={"deadlineSeconds": 900}), [], requeue=300.0, lease_check=30.05
    ),
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
    # ---- nothing to do (the report of a stopped Run is up to date)
    "succeeded-is-final": Transition(
        at_rest("Succeeded", committedBy=committed_by(1, 1), sideEffects=NO_SIDE_EFFECTS), []
    ),
    "cancelled-is-final": Transition(at_rest("Cancelled", cancel_epoch=1, sideEffects=NO_SIDE_EFFECTS), []),
    "failed-waits-for-a-manual-retry": Transition(at_rest("Failed", sideEffects=NO_SIDE_EFFECTS), []),
    "failed-ignores-the-deadline": Transition(
        make_world(
            make_run(
                run_status("Failed", current=1, lease_epoch=1, sideEffects=NO_SIDE_EFFECTS), spec=DEADLINE
            )
        ),
        [],
    ),
    "needs-reconciliation-waits-for-a-person": Transition(
        at_rest("NeedsReconciliation", sideEffects=NO_SIDE_EFFECTS), []
    ),
    # ---- a stopped Run keeps its report in step with its SideEffects, and nothing else
    **{
        f"{case}-refreshes-its-report": Transition(
            world, ["PatchRunStatus"], status_fields=frozenset({"sideEffects", "report"})
        )
        for case, world in [
            ("succeeded", at_rest("Succeeded", committedBy=committed_by(1, 1))),
            ("cancelled", at_rest("Cancelled", cancel_epoch=1)),
            ("failed", at_rest("Failed")),
            ("needs-reconciliation", at_rest("NeedsReconciliation")),
            (
                "succeeded-after-a-compensation",
                replace(
                    at_rest("Succeeded", committedBy=committed_by(1, 1), sideEffects=ONE_IRREVERSIBLE),
                    side_effects=(make_side_effect("k1", "Compensated", reversible=True),),
                ),
            ),
            (
                "needs-reconciliation-after-a-person-resolved-the-effect",
                replace(
                    at_rest("NeedsReconciliation", sideEffects={**NO_SIDE_EFFECTS, "unknown": 1}),
                    side_effects=(make_side_effect("k1", "Confirmed"),),
                ),
            ),
            (
                "failed-with-a-deadline",
                make_world(make_run(run_status("Failed", current=1, lease_epoch=1), spec=DEADLINE)),
            ),
        ]
    },
    "succeeded-report-in-step": Transition(
        replace(
            at_rest("Succeeded", committedBy=committed_by(1, 1), sideEffects=ONE_IRREVERSIBLE),
            side_effects=(make_side_effect("k1", "Confirmed"),),
        ),
        [],
    ),
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


# ---- control requests, commits, reports and retention: worlds ----------------------------------------------

CHECKPOINT = "ckpt-2"  # where WAITING's request waits
SCHEMA = {"type": "object", "required": ["choice"], "properties": {"choice": {"enum": ["a", "b"]}}}
PAUSED = pending_request("paused", "pause-1")


def request_digest(key: str, op: str) -> str:
    """The digest of the request that spec builders below send with `key` (resume, retry_spec, ...)."""
    spec = {
        "Resume": lambda: resume(key=key),
        "Retry": lambda: retry_spec(key),
        "Pause": lambda: pause_spec(key),
    }
    run = make_run(run_status("Running"), spec=spec[op]())
    if op == "Resume":
        assert run.spec.resume is not None
        return controls.resume_digest(run.spec.resume)
    return controls.retry_digest(run) if op == "Retry" else controls.pause_digest(run)


def record(key: str, op: str, outcome: str = "Accepted", reason: str = "Accepted") -> dict[str, Any]:
    """An entry of status.controls, for the request the spec builders below send with `key`."""
    return {
        "idempotencyKey": key,
        "op": op,
        "digest": request_digest(key, op),
        "outcome": outcome,
        "reason": reason,
        "time": ts(EARLIER),
    }


def resume(
    value: Any = None, *, request_id: str = "req-1", checkpoint: str = CHECKPOINT, key: str = "answer-1"
) -> dict[str, Any]:
    """spec fields answering a request."""
    value = {"choice": "a"} if value is None else value
    return {
        "resume": {"requestId": request_id, "checkpointId": checkpoint, "value": value, "idempotencyKey": key}
    }


def retry_spec(key: str = "retry-1", from_checkpoint: str | None = None) -> dict[str, Any]:
    request: dict[str, Any] = {"idempotencyKey": key, "reason": "fixed the credentials"}
    if from_checkpoint:
        request["fromCheckpoint"] = from_checkpoint
    return {"retryRequest": request}


def pause_spec(request_id: str = "pause-1") -> dict[str, Any]:
    return {"pause": {"requestId": request_id, "reason": "maintenance window"}}


def waiting(
    phase: str = "InputRequired",
    *,
    request: dict[str, Any] | None = None,
    spec: dict[str, Any] | None = None,
    **status: Any,
) -> World:
    """A Run waiting in `phase` for `request` (WAITING) at CHECKPOINT after Attempt 1 was interrupted."""
    fields = {"latestCheckpoint": CHECKPOINT, "sideEffects": NO_SIDE_EFFECTS, **status}
    run = make_run(
        run_status(phase, current=1, lease_epoch=1, pendingRequest=request or WAITING, **fields), spec=spec
    )
    return make_world(run, attempts=[make_attempt(1, phase="Interrupted")], lease=held_by(1))


def stopped(
    phase: str = "Failed",
    *,
    spec: dict[str, Any] | None = None,
    side_effects: tuple[SideEffect, ...] = (),
    checkpoints: tuple[Checkpoint, ...] = (),
    **status: Any,
) -> World:
    """A Run that stopped in `phase` (Failed, NeedsReconciliation...) after Attempt 1 failed, its report up
    to date, the Lease still held by Attempt 1."""
    status.setdefault("sideEffects", report.side_effect_counts(side_effects))
    status.setdefault("latestCheckpoint", CHECKPOINT)
    run = make_run(run_status(phase, current=1, lease_epoch=1, **status), spec=spec)
    return make_world(
        run,
        attempts=[failed_attempt(1, FailureClass.DETERMINISTIC)],
        lease=held_by(1),
        side_effects=side_effects,
        checkpoints=checkpoints,
    )


def expiring_at(moment: datetime, request: dict[str, Any] = WAITING) -> dict[str, Any]:
    return {**request, "expiresAt": ts(moment)}


def with_checkpoints(world: World, *checkpoints: Checkpoint, retention: int | None = None) -> World:
    run = world.run
    if retention is not None:
        run = run.model_copy(update={"spec": run.spec.model_copy(update={"checkpoint_retention": retention})})
    return replace(world, run=run, checkpoints=checkpoints)


CHAIN = tuple(make_checkpoint(f"ckpt-{n}", n) for n in range(1, 6))  # ckpt-1 .. ckpt-5, sequences 1..5
UNKNOWN_EFFECT = make_side_effect("ticket-1", "Unknown")
COMMITTED: dict[str, Any] = {"committedBy": committed_by(1, 1), "result": {"ticket": "T-1"}}
# A control request recorded (refused, or a pause noted): its record and observedGeneration, nothing else.
CONTROLS = RECORD = frozenset({"controls", "observedGeneration", "spentKeys"})


TRANSITIONS.update(
    {
        # ---- a committed result stands: it passed the fence before any cancel or deadline
        "commit-seen-while-the-pod-still-runs": Transition(
            supervising(**COMMITTED), ["PatchAttemptStatus", "PatchRunStatus"], "Succeeded", {1: "Succeeded"}
        ),
        "commit-wins-over-a-later-cancel": Transition(
            cancelled(supervising(**COMMITTED)),
            ["PatchAttemptStatus", "PatchRunStatus"],
            "Succeeded",
            {1: "Succeeded"},
        ),
        "commit-wins-over-a-later-cancel-pod-ended": Transition(
            cancelled(supervising(pod=ended(1, 0), **COMMITTED)),
            ["PatchAttemptStatus", "PatchRunStatus"],
            "Succeeded",
            {1: "Succeeded"},
        ),
        "commit-wins-over-the-deadline": Transition(
            supervising(spec=DEADLINE, **COMMITTED),
            ["PatchAttemptStatus", "PatchRunStatus"],
            "Succeeded",
            {1: "Succeeded"},
        ),
        "commit-wins-while-cancel-requested": Transition(
            make_world(
                make_run(
                    run_status("CancelRequested", current=1, lease_epoch=1, cancel_epoch=1, **COMMITTED),
                    spec={"cancelEpoch": 1},
                ),
                attempts=[make_attempt(1)],
                pods=[running_pod(1, deleting=True)],
                lease=held_by(1),
            ),
            ["PatchAttemptStatus", "PatchRunStatus"],
            "Succeeded",
            {1: "Succeeded"},
        ),
        "commit-of-an-earlier-attempt-does-not-stop-a-cancel": Transition(
            cancelled(
                supervising(
                    2, history=(failed_attempt(1, FailureClass.TRANSIENT),), committedBy=committed_by(1, 1)
                )
            ),
            ["PatchRunStatus", "DeletePod"],
            "CancelRequested",
        ),
        "commit-recorded-attempt-succeeded-already": Transition(
            supervising(attempt=make_attempt(1, phase="Succeeded"), **COMMITTED),
            ["PatchRunStatus"],
            "Succeeded",
        ),
        # ---- the retry budget counts the Attempts since the last fresh start
        **{
            f"retry-budget-{case}": Transition(
                supervising(
                    3,
                    pod=ended(3, 75, "third"),
                    attempt=make_attempt(3, reason=reason),
                    history=(
                        failed_attempt(1, FailureClass.TRANSIENT, "first"),
                        failed_attempt(2, FailureClass.INFRASTRUCTURE, reason=second),
                    ),
                    spec={"retry": {"maxAttempts": max_attempts}},
                ),
                ["PatchAttemptStatus", "PatchRunStatus"],
                phase,
                {3: "Failed"},
                stop_reason="RetryBudgetExhausted" if phase == "Failed" else None,
                requeue="backoff" if phase == "RetryBackoff" else None,
            )
            for case, second, reason, max_attempts, phase in [
                ("renewed-by-a-resume", "retry:transient", "resume:req-1", 3, "RetryBackoff"),
                ("renewed-by-a-manual-retry", "retry:transient", "manual_retry", 3, "RetryBackoff"),
                ("counts-the-resumed-attempt", "resume:req-1", "retry:transient", 2, "Failed"),
                ("counts-the-manual-retry", "manual_retry", "retry:transient", 2, "Failed"),
                ("one-more-after-a-resume", "resume:req-1", "retry:transient", 3, "RetryBackoff"),
                ("counts-lease-expiries", "lease_expired", "retry:transient", 3, "Failed"),
                ("of-one-renewed-by-every-resume", "retry:transient", "resume:req-2", 1, "Failed"),
            ]
        },
        # ---- unknown side effects are never retried
        "unknown-side-effect-on-the-first-attempt-with-budget-left": Transition(
            supervising(
                pod=ended(1, 1, sdk("unknown_side_effect", "ticket may exist")),
                spec={"retry": {"maxAttempts": 10}},
            ),
            ["PatchAttemptStatus", "PatchRunStatus"],
            "NeedsReconciliation",
            {1: "Failed"},
            stop_reason="UnknownSideEffect",
        ),
        "unknown-side-effect-on-the-last-attempt": Transition(
            supervising(
                3,
                pod=ended(3, 1, sdk("unknown_side_effect", "ticket may exist")),
                history=(
                    failed_attempt(1, FailureClass.TRANSIENT, "one"),
                    failed_attempt(2, FailureClass.TRANSIENT),
                ),
            ),
            ["PatchAttemptStatus", "PatchRunStatus"],
            "NeedsReconciliation",
            {3: "Failed"},
            stop_reason="UnknownSideEffect",
        ),
        "unknown-side-effect-repeated": Transition(
            supervising(
                2,
                pod=ended(2, 1, sdk("unknown_side_effect", "ticket may exist")),
                history=(failed_attempt(1, FailureClass.UNKNOWN_SIDE_EFFECT, "ticket may exist"),),
            ),
            ["PatchAttemptStatus", "PatchRunStatus"],
            "NeedsReconciliation",
            {2: "Failed"},
            stop_reason="UnknownSideEffect",
        ),
        "run-catches-up-with-an-unknown-side-effect": Transition(
            supervising(attempt=failed_attempt(1, FailureClass.UNKNOWN_SIDE_EFFECT), pod=None),
            ["PatchRunStatus"],
            "NeedsReconciliation",
            stop_reason="UnknownSideEffect",
        ),
        # ---- resume
        **{
            f"resume-accepted-{phase.lower()}": Transition(
                waiting(phase, request=request, spec=resume(request_id=request["requestId"])),
                GRANT,
                "Running",
            )
            for phase, request in [
                ("InputRequired", WAITING),
                ("AuthRequired", pending_request("auth_required")),
                ("Paused", PAUSED),
            ]
        },
        "resume-accepted-matching-the-schema": Transition(
            waiting(request={**WAITING, "acceptedSchema": SCHEMA}, spec=resume({"choice": "b"})),
            GRANT,
            "Running",
        ),
        "resume-accepted-before-the-request-expires": Transition(
            waiting(request=expiring_at(NOW + timedelta(seconds=1)), spec=resume()),
            GRANT,
            "Running",
        ),
        "resume-accepted-after-an-earlier-refusal": Transition(
            waiting(
                spec=resume(key="answer-2"),
                controls=[record("answer-1", "Resume", "Rejected", "SchemaMismatch")],
            ),
            GRANT,
            "Running",
        ),
        **{
            f"resume-refused-{case}": Transition(
                world, ["PatchRunStatus"], status_fields=CONTROLS, requeue=requeue
            )
            for case, world, requeue in [
                (
                    "not-waiting-running",
                    replace(supervising(), run=make_run(supervising().run.status.to_api(), spec=resume())),
                    None,
                ),
                (
                    "not-waiting-backing-off",
                    backing_off(spec=resume(), due=NOW + timedelta(seconds=40)),
                    None,
                ),
                ("not-waiting-queued", make_world(make_run(run_status("Queued"), spec=resume())), None),
                ("unknown-request", waiting(spec=resume(request_id="req-0")), None),
                ("stale-checkpoint", waiting(spec=resume(checkpoint="ckpt-1")), None),
                (
                    "checkpoint-moved-on",
                    waiting(spec=resume(), latestCheckpoint="ckpt-3"),
                    None,
                ),
                ("request-expired", waiting(request=expiring_at(NOW), spec=resume()), None),
                (
                    "schema-mismatch",
                    waiting(request={**WAITING, "acceptedSchema": SCHEMA}, spec=resume({"choice": "z"})),
                    None,
                ),
                (
                    "schema-mismatch-missing-field",
                    waiting(request={**WAITING, "acceptedSchema": SCHEMA}, spec=resume({"pick": "a"})),
                    None,
                ),
                (
                    "invalid-schema",
                    waiting(request={**WAITING, "acceptedSchema": {"type": "no-such-type"}}, spec=resume()),
                    None,
                ),
            ]
        },
        "resume-processed-changes-nothing": Transition(
            waiting(spec=resume(), controls=[record("answer-1", "Resume", "Rejected", "SchemaMismatch")]), []
        ),
        "resume-processed-while-running-changes-nothing": Transition(
            replace(
                supervising(),
                run=make_run(
                    run_status("Running", current=2, lease_epoch=2, controls=[record("answer-1", "Resume")]),
                    spec=resume(),
                ),
                attempts={1: make_attempt(1, phase="Interrupted"), 2: make_attempt(2, reason="resume:req-1")},
                pods={name_of(2): running_pod(2)},
                lease=held_by(2),
            ),
            [],
            lease_check=30.05,
        ),
        "cancel-wins-over-a-resume": Transition(
            cancelled(waiting(spec=resume())), ["PatchRunStatus"], "Cancelled"
        ),
        "deadline-wins-over-a-resume": Transition(
            waiting(spec={**resume(), **DEADLINE}),
            ["WriteLease", "PatchRunStatus"],
            "Failed",
            stop_reason="DeadlineExceeded",
        ),
        # ---- requests that expire
        "request-expired": Transition(
            waiting(request=expiring_at(NOW - timedelta(seconds=1))),
            ["PatchRunStatus"],
            "Failed",
            stop_reason="RequestExpired",
        ),
        "request-expires-exactly-now": Transition(
            waiting(request=expiring_at(NOW)), ["PatchRunStatus"], "Failed", stop_reason="RequestExpired"
        ),
        "request-expires-later": Transition(
            waiting(request=expiring_at(NOW + timedelta(seconds=120))), [], requeue=120.0
        ),
        "request-expires-after-the-deadline": Transition(
            waiting(request=expiring_at(NOW + timedelta(seconds=4000)), spec={"deadlineSeconds": 3600}),
            [],
            requeue=3000.0,
        ),
        "paused-request-expired": Transition(
            waiting("Paused", request=expiring_at(NOW - timedelta(hours=1), PAUSED)),
            ["PatchRunStatus"],
            "Failed",
            stop_reason="RequestExpired",
        ),
        # ---- manual retry
        "manual-retry-of-a-failed-run": Transition(stopped(spec=retry_spec()), GRANT, "Running"),
        "manual-retry-of-a-run-needing-reconciliation": Transition(
            stopped(
                "NeedsReconciliation",
                spec=retry_spec(),
                side_effects=(make_side_effect("ticket-1", "Confirmed"),),
            ),
            GRANT,
            "Running",
        ),
        "manual-retry-with-effects-failed-or-pending": Transition(
            stopped(
                "NeedsReconciliation",
                spec=retry_spec(),
                side_effects=(
                    make_side_effect("ticket-1", "Failed"),
                    make_side_effect("ticket-2", "Pending"),
                ),
            ),
            GRANT,
            "Running",
        ),
        "manual-retry-from-a-checkpoint": Transition(
            stopped(spec=retry_spec(from_checkpoint="ckpt-1"), checkpoints=CHAIN[:2]),
            GRANT,
            "Running",
        ),
        "manual-retry-after-the-deadline": Transition(
            replace(
                stopped(spec={**retry_spec(), **DEADLINE}, leaseEpoch=2),
                lease=make_lease(None, 2),
            ),
            GRANT,
            "Running",
        ),
        "manual-retry-after-an-expired-request": Transition(
            stopped(spec=retry_spec(), pendingRequest=expiring_at(NOW - timedelta(hours=1))),
            GRANT,
            "Running",
        ),
        **{
            f"manual-retry-refused-{case}": Transition(
                world, ["PatchRunStatus"], status_fields=RECORD, requeue=requeue
            )
            for case, world, requeue in [
                (
                    "running",
                    replace(
                        supervising(), run=make_run(supervising().run.status.to_api(), spec=retry_spec())
                    ),
                    None,
                ),
                ("waiting", waiting(spec=retry_spec()), None),
                ("backing-off", backing_off(spec=retry_spec(), due=NOW + timedelta(seconds=40)), None),
                ("queued", make_world(make_run(run_status("Queued"), spec=retry_spec())), None),
                (
                    "unresolved-side-effects",
                    stopped("NeedsReconciliation", spec=retry_spec(), side_effects=(UNKNOWN_EFFECT,)),
                    None,
                ),
                (
                    "failed-run-with-an-unknown-side-effect",
                    stopped(spec=retry_spec(), side_effects=(UNKNOWN_EFFECT,)),
                    None,
                ),
                (
                    "unknown-checkpoint",
                    stopped(spec=retry_spec(from_checkpoint="ckpt-9"), checkpoints=CHAIN[:2]),
                    None,
                ),
            ]
        },
        "manual-retry-processed-changes-nothing": Transition(
            stopped(
                spec=retry_spec(), controls=[record("retry-1", "Retry", "Rejected", "UnresolvedSideEffects")]
            ),
            [],
        ),
        "manual-retry-of-a-succeeded-run-is-refused-and-recorded": Transition(
            replace(
                at_rest("Succeeded", committedBy=committed_by(1, 1), sideEffects=NO_SIDE_EFFECTS),
                run=make_run(
                    run_status("Succeeded", current=1, lease_epoch=1, sideEffects=NO_SIDE_EFFECTS),
                    spec=retry_spec(),
                ),
            ),
            ["PatchRunStatus"],
            status_fields=RECORD,
        ),
        "cancel-wins-over-a-manual-retry": Transition(
            cancelled(stopped(spec=retry_spec())), ["PatchRunStatus"], "Cancelled"
        ),
        # ---- pause: the worker honours it at its next checkpoint; the record follows the outcome
        "pause-asked-while-running": Transition(
            replace(supervising(), run=make_run(supervising().run.status.to_api(), spec=pause_spec())),
            [],
            lease_check=30.05,
        ),
        "pause-asked-while-queued": Transition(
            make_world(make_run(run_status("Queued"), spec=pause_spec())), GRANT, "Running"
        ),
        "pause-asked-while-backing-off": Transition(
            backing_off(spec=pause_spec(), due=NOW + timedelta(seconds=40)), [], requeue=40.0
        ),
        "pause-honoured": Transition(
            waiting("Paused", request=PAUSED, spec=pause_spec()), ["PatchRunStatus"], status_fields=RECORD
        ),
        "pause-refused-while-waiting-for-input": Transition(
            waiting(spec=pause_spec()), ["PatchRunStatus"], status_fields=RECORD
        ),
        "pause-refused-paused-for-another-request": Transition(
            waiting("Paused", request=pending_request("paused", "pause-0"), spec=pause_spec()),
            ["PatchRunStatus"],
            status_fields=RECORD,
        ),
        "pause-processed-changes-nothing": Transition(
            waiting("Paused", request=PAUSED, spec=pause_spec(), controls=[record("pause-1", "Pause")]), []
        ),
        "pause-then-resume": Transition(
            waiting(
                "Paused",
                request=PAUSED,
                spec={**pause_spec(), **resume(request_id="pause-1")},
                controls=[record("pause-1", "Pause")],
            ),
            GRANT,
            "Running",
        ),
        "pause-recorded-before-the-resume": Transition(
            waiting("Paused", request=PAUSED, spec={**pause_spec(), **resume(request_id="pause-1")}),
            ["PatchRunStatus"],
            status_fields=RECORD,
        ),
        # ---- checkpoint retention
        "checkpoints-pruned-beyond-retention": Transition(
            with_checkpoints(supervising(latestCheckpoint="ckpt-5"), *CHAIN, retention=2),
            ["DeleteCheckpoint"] * 3,
            lease_check=30.05,
        ),
        "checkpoints-within-retention": Transition(
            with_checkpoints(supervising(latestCheckpoint="ckpt-5"), *CHAIN, retention=5),
            [],
            lease_check=30.05,
        ),
        "checkpoints-pruned-of-a-stopped-run": Transition(
            with_checkpoints(stopped(latestCheckpoint="ckpt-5"), *CHAIN, retention=1),
            ["DeleteCheckpoint"] * 4,
        ),
        "checkpoints-pruned-before-a-grant": Transition(
            with_checkpoints(queued(latestCheckpoint="ckpt-5"), *CHAIN, retention=3),
            ["DeleteCheckpoint", "DeleteCheckpoint", *GRANT],
            "Running",
        ),
        "checkpoints-of-a-run-being-deleted-are-left-to-the-gc": Transition(
            with_checkpoints(
                make_world(
                    make_run(
                        run_status("Failed", current=1, lease_epoch=1),
                        metadata={"deletionTimestamp": ts(NOW)},
                    )
                ),
                *CHAIN,
                retention=1,
            ),
            [],
        ),
    }
)


def next_attempt_time(plan: Plan) -> datetime:
    return datetime.fromisoformat(run_patch(plan)["nextAttemptTime"].replace("Z", "+00:00"))


@pytest.mark.parametrize("case", TRANSITIONS.values(), ids=TRANSITIONS.keys())
def test_transition(case: Transition) -> None:
    plan = decide(case.world)

    assert kinds(plan) == case.writes
    patches = of_type(plan, PatchRunStatus)
    assert [p.patch["phase"] for p in patches if "phase" in p.patch] == ([case.phase] if case.phase else [])
    assert [set(p.patch) for p in patches if "phase" not in p.patch] == (
        [set(case.status_fields)] if case.status_fields is not None else []
    )
    assert {name: p[-1]["phase"] for name, p in attempt_patches(plan).items()} == {
        name_of(n): phase for n, phase in case.attempts.items()
    }
    if case.stop_reason is not None:
        assert run_patch(plan)["failure"]["reason"] == case.stop_reason
    elif patches:
        assert run_patch(plan).get("failure") is None  # absent, or cleared by a manual retry
    if case.requeue == "backoff":
        delay = (next_attempt_time(plan) - case.world.now).total_seconds()
        assert plan.requeue_after == delay > 0
    else:
        assert plan.requeue_after == (pytest.approx(case.requeue) if case.requeue is not None else None)
    assert plan.lease_expires_in == (
        pytest.approx(case.lease_check) if case.lease_check is not None else None
    )


CASES_WITH_STATUS_PATCHES = {k: c for k, c in TRANSITIONS.items() if c.phase is not None}


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
    plan = decide(make_world(make_run()))
    lease, status, create, pod = plan.actions

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
def test_a_run_failed_at_first_sight_records_its_cancel_epoch(
    spec: dict[str, Any], refusal: str | None
) -> None:
    """Otherwise the cancelEpoch it was created with would later pass for a cancel of the Failed Run."""
    world = replace(make_world(make_run(spec=spec)), account_refusal=refusal)
    patch = run_patch(decide(world))

    assert (patch["phase"], patch["observedCancelEpoch"]) == ("Failed", 2)


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


def test_a_grant_gives_out_the_epoch_of_a_revoked_lease() -> None:
    """Attempt 1 lost its lease: the Lease was revoked at epoch 2 at once, and Attempt 2 gets epoch 2."""
    world = backing_off(
        previous=make_attempt(1, phase="LeaseLost", failure=failure_of(FailureClass.LEASE_LOST)),
        lease=make_lease(None, 2),
        leaseEpoch=2,
    )
    plan = decide(world)

    assert of_type(plan, WriteLease) == [WriteLease(name_of(2), 2, 60, LEASE_RESOURCE_VERSION)]
    assert run_patch(plan)["leaseEpoch"] == 2
    assert of_type(plan, CreateAttempt)[0].body["spec"]["leaseEpoch"] == 2
    assert of_type(plan, CreateAttempt)[0].body["spec"]["reason"] == "lease_expired"


def test_a_grant_after_a_revocation_the_run_did_not_record() -> None:
    """The operator revoked the Lease (epoch 2) and died before writing the Run (still at epoch 1): the
    grant adopts epoch 2 all the same, so no epoch is skipped."""
    world = backing_off(lease=make_lease(None, 2))
    plan = decide(world)

    assert of_type(plan, WriteLease) == [WriteLease(name_of(2), 2, 60, LEASE_RESOURCE_VERSION)]
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
        name_of(1): [
            {
                "phase": "Running",
                "startTime": running_pod(1).running_since,
                "podName": name_of(1),
                "traceId": TRACE_ID,  # the Run's trace, recorded with a write made anyway
            }
        ]
    }


# ---- lease expiry ------------------------------------------------------------------------------------------


def test_lease_expiry() -> None:
    plan = decide(supervising(expires_in=-0.5))
    lost = attempt_patches(plan)[name_of(1)]

    assert lost[0]["phase"] == "LeaseLost"
    assert lost[0]["failure"]["class"] == "lease_lost"
    assert "60s" in lost[0]["failure"]["message"]
    assert of_type(plan, DeletePod) == [DeletePod(name_of(1), grace_seconds=0)]
    # Revoked at once, not at the next grant: a frozen worker that wakes up in the backoff is stale.
    assert of_type(plan, WriteLease) == [WriteLease(None, 2, 60, LEASE_RESOURCE_VERSION)]
    patch = run_patch(plan)
    assert patch["phase"] == "RetryBackoff"
    assert patch["leaseEpoch"] == 2
    assert next(c for c in patch["conditions"] if c["type"] == "LeaseHeld")["status"] == "False"


@pytest.mark.parametrize(
    ("number", "lease_epoch", "expected"),
    [(1, 1, 2), (3, 3, 4), (2, 5, 6)],
    ids=["first", "third-attempt", "epochs-ahead-of-numbers"],
)
def test_lease_expiry_revokes_with_the_next_epoch(number: int, lease_epoch: int, expected: int) -> None:
    history = tuple(failed_attempt(n, FailureClass.TRANSIENT, f"error {'x' * n}") for n in range(1, number))
    world = supervising(
        number,
        attempt=make_attempt(number, lease_epoch=lease_epoch),
        lease=make_lease(name_of(number), lease_epoch, resource_version="999"),
        history=history,
        expires_in=-3.0,
        spec={"retry": {"maxAttempts": 10}},
    )
    plan = decide(world)

    assert of_type(plan, WriteLease) == [WriteLease(None, expected, 60, "999")]
    assert run_patch(plan)["leaseEpoch"] == expected
    assert plan.actions.index(of_type(plan, WriteLease)[0]) < plan.actions.index(of_type(plan, DeletePod)[0])


def test_lease_expiry_on_the_last_attempt_revokes_too() -> None:
    """The Run fails, and the Lease is revoked all the same: no late write of the lost worker counts."""
    world = supervising(2, history=(failed_attempt(1, FailureClass.TRANSIENT),), expires_in=-1.0)
    plan = decide(replace(world, run=make_run(world.run.status.to_api(), spec={"retry": {"maxAttempts": 2}})))
    patch = run_patch(plan)

    assert patch["phase"] == "Failed"
    assert patch["leaseEpoch"] == 3
    assert of_type(plan, WriteLease) == [WriteLease(None, 3, 60, LEASE_RESOURCE_VERSION)]


@pytest.mark.parametrize("expires_in", [-100.0, 0.0, None])
def test_lease_is_not_judged_before_the_agent_runs(expires_in: float | None) -> None:
    plan = decide(supervising(pod="pending", attempt=NOT_STARTED, expires_in=expires_in))

    assert plan.actions == []
    assert plan.requeue_after == RECHECK_SECONDS


@pytest.mark.parametrize(
    ("lease", "writes"),
    [(held_by(1), [WriteLease(None, 2, 60, LEASE_RESOURCE_VERSION)]), (make_lease(None, 2), [])],
    ids=["not-revoked-yet", "revoked-already"],
)
def test_a_recorded_lease_loss_finishes_its_takeover(lease: LeaseView, writes: list[WriteLease]) -> None:
    """The operator marked the Attempt LeaseLost and died: the next decision revokes the Lease (or adopts
    the revocation it finds), stops the hung Pod at once, and records the new epoch on the Run."""
    plan = decide(supervising(attempt=LOST, lease=lease, expires_in=None))

    assert of_type(plan, WriteLease) == writes
    assert of_type(plan, DeletePod) == [DeletePod(name_of(1), grace_seconds=0)]
    assert run_patch(plan)["leaseEpoch"] == 2
    assert name_of(1) not in attempt_patches(plan), "the Attempt is left as it is"


@pytest.mark.parametrize(
    "world",
    [
        supervising(expires_in=-1.0),  # finished as LeaseLost
        supervising(pod=ended(1, 1)),  # finished as Failed
        supervising(attempt=make_attempt(1, phase="Pending")),  # recorded as Running
    ],
    ids=["lease-lost", "failed", "started"],
)
def test_attempt_writes_carry_the_version_they_were_decided_on(world: World) -> None:
    """A decision made on a stale view of an Attempt (the SDK may have ended it meanwhile) must not
    rewrite it: each write names the resourceVersion it was decided on, and the API server checks it."""
    [patch] = of_type(decide(world), PatchAttemptStatus)

    assert patch.expected_resource_version == world.attempts[1].metadata.resource_version == "201"


def test_lease_about_to_expire_wakes_just_after() -> None:
    plan = decide(supervising(expires_in=0.2))

    assert plan.lease_expires_in == pytest.approx(0.25)
    assert plan.requeue_after is None  # renewals must not cost a reconcile each


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


# ---- a committed result wins -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("world", "too_late"),
    [
        (cancelled(supervising(**COMMITTED)), True),
        (cancelled(supervising(pod=ended(1, 0), **COMMITTED), epoch=4), True),
        (supervising(**COMMITTED), False),
        (supervising(spec=DEADLINE, **COMMITTED), False),
    ],
    ids=["cancel-after-the-commit", "cancel-after-the-commit-pod-ended", "no-cancel", "deadline"],
)
def test_a_committed_result_wins(world: World, too_late: bool) -> None:
    plan = decide(world)
    patch = run_patch(plan)

    assert patch["phase"] == "Succeeded"
    assert attempt_patches(plan) == {name_of(1): [{"phase": "Succeeded", "completionTime": ts(NOW)}]}
    assert of_type(plan, WriteLease) == [] and of_type(plan, DeletePod) == []
    assert (("Normal", "CancelTooLate") in events(plan)) == too_late
    assert "observedCancelEpoch" not in patch, "the cancel was not acted on"


# ---- side effects in the status ----------------------------------------------------------------------------

REPORTING = frozenset(
    {RunPhase.SUCCEEDED, RunPhase.FAILED, RunPhase.CANCELLED, RunPhase.NEEDS_RECONCILIATION}
)
EFFECTS = (
    make_side_effect("ticket-1", "Confirmed", reference="T-1", created=EARLIER),
    make_side_effect(
        "mail-1", "Compensated", tool="send_mail", reversible=True, created=EARLIER + timedelta(seconds=5)
    ),
    make_side_effect(
        "refund-1", "Unknown", tool="refund", target="order-7", created=EARLIER + timedelta(seconds=9)
    ),
)
EFFECT_COUNTS = {"confirmed": 1, "compensated": 1, "unknown": 1, "irreversible": 1}


@pytest.mark.parametrize("case", CASES_WITH_STATUS_PATCHES.values(), ids=CASES_WITH_STATUS_PATCHES.keys())
def test_every_phase_change_carries_the_side_effects(case: Transition) -> None:
    """Counts with every phase; the report too once the Run stopped (or waits for reconciliation)."""
    # A Pending record (it counts as unknown) rather than an Unknown one, which would block manual retries.
    effects = (*EFFECTS[:2], make_side_effect("refund-1", None, tool="refund"))
    world = replace(case.world, side_effects=effects)
    patch = next(p.patch for p in of_type(decide(world), PatchRunStatus) if "phase" in p.patch)

    assert patch["sideEffects"] == EFFECT_COUNTS
    if RunPhase(patch["phase"]) in REPORTING:
        assert patch["report"] == report.run_report(effects)
    else:
        assert "report" not in patch


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

    assert of_type(plan, WriteLease) == [WriteLease(name_of(2), 2, 60, LEASE_RESOURCE_VERSION)]
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
    assert patch["report"] == {"effects": [], "omitted": 0}
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

    assert of_type(plan, WriteLease) == [WriteLease(name_of(2), 2, 60, LEASE_RESOURCE_VERSION)]
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
    "after-a-resume-whose-spec-changed-since": (
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


# What a person (or another system) does to a resting Run: in the phase given, a spec merge patch (or a
# function of the Run's status returning one), or "resolve" (settle every Unknown SideEffect as Confirmed).
UserAction = dict[str, Any] | Callable[[dict[str, Any]], dict[str, Any]] | str
UserStep = tuple[str, UserAction]
REPORTED_PHASES = ("Succeeded", "Failed", "Cancelled", "NeedsReconciliation")


def answer(value: Any, key: str, request_id: str | None = None) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """spec.resume answering the pending request (or `request_id`) with `value`."""

    def build(status: dict[str, Any]) -> dict[str, Any]:
        pending = status["pendingRequest"]
        return {
            "resume": {
                "requestId": request_id or pending["requestId"],
                "checkpointId": pending["checkpointId"],
                "value": value,
                "idempotencyKey": key,
            }
        }

    return build


def retry_request(key: str) -> dict[str, Any]:
    return {"retryRequest": {"idempotencyKey": key, "reason": "fixed"}}


@dataclass
class Cluster:
    """An API server, a kubelet, the workers and a user, in memory: enough to carry out Plans like the
    executor.

    Writes are checked as the API server would (resourceVersion preconditions, idempotent creates by
    name, an ended Attempt keeps its phase, a Succeeded or Cancelled Run keeps everything but its
    report) plus the promises of restart safety (a lease epoch only ever moves by one, an Attempt is never
    created with another spec than the first time, a Checkpoint still pointed at is never pruned).

    Each attempt's fate is scripted: "exit:<code>[:<message>]" ends it after it ran one tick, "commit"
    commits a result and exits 0, "ticket" records a Confirmed irreversible SideEffect then commits,
    "unknown" records an Unknown SideEffect and exits with class unknown_side_effect, "interrupt" saves a
    Checkpoint and an input request and exits 0, "hang" keeps it running without renewing its lease,
    "forever" keeps it running and renewing, "pausable" does so until spec.pause asks it to pause,
    "cancel" makes the user raise spec.cancelEpoch while it runs, "commit-then-cancel" commits and exits
    just before the user raises spec.cancelEpoch. A worker that runs first saves `saves` Checkpoints.
    """

    spec: dict[str, Any]
    fates: dict[int, str]
    user: list[UserStep] = field(default_factory=list)
    saves: int = 0
    clock: float = 1.0  # seconds since the Run was created, also the operator's monotonic clock
    status: dict[str, Any] | None = None
    attempts: dict[str, dict[str, Any]] = field(default_factory=dict)
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    checkpoints: dict[str, dict[str, Any]] = field(default_factory=dict)
    side_effects: dict[str, dict[str, Any]] = field(default_factory=dict)
    lease: dict[str, Any] | None = None
    sighting: Sighting | None = None
    resource_version: int = 100
    lease_epochs: list[int] = field(default_factory=list)  # every epoch written, in order
    pods_created: list[str] = field(default_factory=list)
    checkpoints_pruned: list[str] = field(default_factory=list)
    saved: set[str] = field(default_factory=set)  # attempts whose worker saved its Checkpoints

    @property
    def now(self) -> datetime:
        return CREATED + timedelta(seconds=self.clock)

    def _next_rv(self) -> str:
        self.resource_version += 1
        return str(self.resource_version)

    def world(self) -> World:
        lease = expires_in = None
        run = make_run(self.status, spec=self.spec)
        if self.lease is not None:
            lease = LeaseView(self.lease["holder"], self.lease["epoch"], self.lease["rv"])
            self.sighting = sight(self.sighting, lease.resource_version, self.clock)
            expires_in = seconds_until_expiry(self.sighting, run.spec.lease.duration_seconds, self.clock)
        parsed = (Attempt.model_validate(body) for body in self.attempts.values())
        views = (pod_view(body) for body in self.pods.values())
        return World(
            run=run,
            attempts={a.spec.number: a for a in parsed},
            pods={v.name: v for v in views},
            lease=lease,
            now=self.now,
            lease_expires_in=expires_in,
            side_effects=[SideEffect.model_validate(b) for b in self.side_effects.values()],
            checkpoints=[Checkpoint.model_validate(b) for b in self.checkpoints.values()],
        )

    def protected_checkpoints(self) -> set[str]:
        status = self.status or {}
        protected = {status.get("latestCheckpoint"), (status.get("pendingRequest") or {}).get("checkpointId")}
        protected |= {a["spec"].get("resumeFrom") for a in self.attempts.values()}
        return {c for c in protected if c}

    # ---- the API server

    def apply(self, action: Action) -> None:
        match action:
            case PatchRunStatus(patch=patch):
                old = self.status or {}
                if old.get("phase") in ("Succeeded", "Cancelled") and set(patch) - {"sideEffects", "report"}:
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
                adopts_revoked = (
                    self.lease is not None and self.lease["holder"] is None and holder is not None
                )
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
                stored.setdefault("status", {})
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
            case DeleteCheckpoint(name=name):
                if name in self.protected_checkpoints():
                    raise Violation(f"Checkpoint {name} pruned while the Run or an Attempt points at it")
                if self.checkpoints.pop(name, None) is not None:
                    self.checkpoints_pruned.append(name)
            case RecordEvent():
                pass

    def check_after_decision(self) -> None:
        """After a complete decision: a Running Run's current Attempt holds the lease the Run records, the
        Run records the Lease's epoch, and an Attempt that lost its lease holds it no more."""
        status = self.status or {}
        if status.get("phase") == "Running":
            holder = name_of(status["currentAttempt"])
            assert self.lease is not None
            assert (self.lease["holder"], self.lease["epoch"]) == (holder, status["leaseEpoch"])
        if self.lease is not None and status.get("phase") not in ("Queued", "Cancelled"):
            assert status.get("leaseEpoch") == self.lease["epoch"], (status.get("leaseEpoch"), self.lease)
        for name, attempt in self.attempts.items():
            if attempt["status"].get("phase") == "LeaseLost":
                assert self.lease is not None and self.lease["holder"] != name, f"{name} still holds it"

    # ---- the kubelet, the workers and the user

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
            if name not in self.saved:
                self.saved.add(name)
                for _ in range(self.saves):
                    self._save_checkpoint(name)
                changed = changed or self.saves > 0
            if fate in ("forever", "cancel", "pausable"):
                if fate == "cancel" and not self.spec.get("cancelEpoch"):
                    self.spec["cancelEpoch"] = 1  # the user cancels; this agent ignores it
                    changed = True
                if fate == "pausable" and self._pause_asked():
                    self._interrupt(name, "paused", self.spec["pause"]["requestId"])
                    changed = True
                    continue
                if self.lease and self.lease["holder"] == name:
                    self.lease["rv"] = self._next_rv()
                continue
            if fate in ("commit", "ticket", "commit-then-cancel"):
                if fate == "ticket":
                    self._record_effect(name, "Confirmed")
                self._commit(name)
                self._end(name, 0, "")
                if fate == "commit-then-cancel":
                    self.spec["cancelEpoch"] = 1  # too late: the result is in
            elif fate == "unknown":
                self._record_effect(name, "Unknown")
                self._end(name, 1, sdk("unknown_side_effect", "the ticket may have been created"))
            elif fate == "interrupt":
                self._interrupt(name, "input_required", None)
            else:
                _, code, *message = fate.split(":", 2)
                self._end(name, int(code), message[0] if message else None)
            changed = True
        return changed

    def _fenced(self, name: str) -> None:
        spec, status = self.attempts[name]["spec"], self.status or {}
        if (spec["leaseEpoch"], spec["cancelEpoch"]) != (
            status.get("leaseEpoch"),
            self.spec.get("cancelEpoch", 0),
        ):
            raise Violation(f"{name} was fenced off while it was still the Run's current Attempt")

    def _commit(self, name: str) -> None:
        self._fenced(name)
        spec = self.attempts[name]["spec"]
        record = {"attempt": name, "leaseEpoch": spec["leaseEpoch"], "cancelEpoch": spec["cancelEpoch"]}
        self.status = merge(self.status or {}, {"result": {"done": True}, "committedBy": record})

    def _save_checkpoint(self, name: str) -> str:
        """As the SDK does: a new Checkpoint after the latest, then status.latestCheckpoint (fenced)."""
        self._fenced(name)
        latest = self.checkpoints.get((self.status or {}).get("latestCheckpoint") or "")
        sequence = latest["spec"]["sequence"] + 1 if latest else 1
        checkpoint_id = f"{name}-s{sequence}"
        self.checkpoints[checkpoint_id] = {
            "metadata": {"name": checkpoint_id},
            "spec": {
                "runName": RUN,
                "id": checkpoint_id,
                "sequence": sequence,
                "attempt": name,
                "leaseEpoch": self.attempts[name]["spec"]["leaseEpoch"],
                "state": {"sequence": sequence},
            },
        }
        self.status = merge(self.status or {}, {"latestCheckpoint": checkpoint_id})
        return checkpoint_id

    def _interrupt(self, name: str, reason: str, request_id: str | None) -> None:
        checkpoint_id = self._save_checkpoint(name)
        request_id = request_id or f"{RUN}-r{self.checkpoints[checkpoint_id]['spec']['sequence']}"
        pending = {"requestId": request_id, "reason": reason, "checkpointId": checkpoint_id}
        self.status = merge(self.status or {}, {"pendingRequest": pending})
        self._end(name, 0, "")

    def _pause_asked(self) -> bool:
        pause = self.spec.get("pause")
        answered = {i["requestId"] for i in (self.status or {}).get("inputs") or []}
        return pause is not None and pause["requestId"] not in answered

    def _record_effect(self, name: str, state: str) -> None:
        effect = make_side_effect(f"ticket-{name}", state, created=self.now).to_api()
        self.side_effects[effect["metadata"]["name"]] = effect

    def _end(self, name: str, code: int, message: str | None) -> None:
        terminated: dict[str, Any] = {"exitCode": code, "reason": "Completed" if code == 0 else "Error"}
        if message is not None:
            terminated["message"] = message
        self.pods[name]["status"] = {
            "phase": "Succeeded" if code == 0 else "Failed",
            "containerStatuses": [{"name": "agent", "state": {"terminated": terminated}}],
        }

    def act(self) -> bool:
        """The user takes the next step of the script if the Run is in its phase; True if they did."""
        if not self.user or (self.status or {}).get("phase") != self.user[0][0]:
            return False
        _, action = self.user.pop(0)
        if action == "resolve":
            for effect in self.side_effects.values():
                if effect["status"]["state"] == "Unknown":
                    effect["status"] = {**effect["status"], "state": "Confirmed", "resolvedBy": "alice"}
        else:
            patch = action(self.status or {}) if callable(action) else action
            assert isinstance(patch, dict)
            self.spec = merge(self.spec, patch)
        return True

    # ---- the operator

    def drive(self, crash: tuple[int, int] | None = None, max_steps: int = 80) -> list[Plan]:
        """Decide and write until the Run rests; with crash=(step, n) the operator dies after the first
        n writes of decision `step`, and a new one (whose lease clock starts afresh) takes over.

        The user acts only on a Run the operator left alone (a decision without writes). Time moves 1 s
        after any change the operator would be told about (its own writes, a Pod moving on, a user's
        request, a restart), otherwise as far as the decision asked to be woken."""
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
                self.check_after_decision()
            phase = (self.status or {}).get("phase")
            acted = not plan.actions and self.act()
            # The lease check wakes the operator at the expiry too (it skips that when the worker renewed:
            # a reconcile more here changes nothing, decide being level-based).
            wakes = [t for t in (plan.requeue_after, plan.lease_expires_in) if t is not None]
            wake = min(wakes) if wakes else None
            if not acted and not plan.actions and wake is None and phase in REPORTED_PHASES:
                return plans
            changed = self.kubelet() or restarted or acted
            changed = changed or any(not isinstance(a, RecordEvent) for a in actions)
            self.clock += 1.0 if changed or wake is None else wake
        raise AssertionError(f"the Run did not come to rest: {self.status}")


@dataclass(frozen=True)
class Story:
    fates: dict[int, str]
    phase: str
    attempts: list[tuple[str, str]]  # (phase, reason) of each Attempt, in order
    lease_epochs: list[int]
    stop_reason: str | None = None
    spec: dict[str, Any] = field(default_factory=dict)
    user: tuple[UserStep, ...] = ()
    controls: list[tuple[str, str, str]] = field(default_factory=list)  # (op, outcome, reason) in order
    inputs: dict[int, Any] = field(default_factory=dict)  # spec.input of the Attempts that resumed
    saves: int = 0  # Checkpoints each worker saves when it starts
    side_effects: dict[str, int] = field(default_factory=lambda: dict(NO_SIDE_EFFECTS))


STORIES = {
    "first-try": Story({1: "commit"}, "Succeeded", [("Succeeded", "initial")], [1]),
    "transient-then-success": Story(
        {1: "exit:75:upstream timeout", 2: "commit"},
        "Succeeded",
        [("Failed", "initial"), ("Succeeded", "retry:transient")],
        [1, 2],
    ),
    # The Lease is revoked at epoch 2 when Attempt 1 loses it; Attempt 2 is granted that same epoch.
    "lease-lost-then-success": Story(
        {1: "hang", 2: "commit"},
        "Succeeded",
        [("LeaseLost", "initial"), ("Succeeded", "lease_expired")],
        [1, 2],
    ),
    "lease-lost-twice": Story(
        {1: "hang", 2: "hang"},
        "Failed",
        [("LeaseLost", "initial"), ("LeaseLost", "lease_expired")],
        [1, 2, 3],
        "RepeatedFailure",
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
    "commit-wins-over-a-late-cancel": Story(
        {1: "commit-then-cancel"}, "Succeeded", [("Succeeded", "initial")], [1]
    ),
    "ticket-then-success": Story(
        {1: "ticket"},
        "Succeeded",
        [("Succeeded", "initial")],
        [1],
        side_effects={**NO_SIDE_EFFECTS, "confirmed": 1, "irreversible": 1},
    ),
    "resume-then-success": Story(
        {1: "interrupt", 2: "commit"},
        "Succeeded",
        [("Interrupted", "initial"), ("Succeeded", f"resume:{RUN}-r1")],
        [1, 2],
        user=(("InputRequired", answer({"choice": "b"}, "answer-1")),),
        controls=[("Resume", "Accepted", "Accepted")],
        inputs={2: {"choice": "b"}},
    ),
    "resume-refused-then-accepted": Story(
        {1: "interrupt", 2: "commit"},
        "Succeeded",
        [("Interrupted", "initial"), ("Succeeded", f"resume:{RUN}-r1")],
        [1, 2],
        user=(
            ("InputRequired", answer("a", "answer-1", request_id="someone-else")),
            ("InputRequired", answer("b", "answer-2")),
        ),
        controls=[("Resume", "Rejected", "UnknownRequest"), ("Resume", "Accepted", "Accepted")],
        inputs={2: "b"},
    ),
    "pause-then-resume": Story(
        {1: "pausable", 2: "commit"},
        "Succeeded",
        [("Interrupted", "initial"), ("Succeeded", "resume:pause-1")],
        [1, 2],
        user=(
            ("Running", {"pause": {"requestId": "pause-1", "reason": "maintenance"}}),
            ("Paused", answer({"go": True}, "go-1")),
        ),
        controls=[("Pause", "Accepted", "Accepted"), ("Resume", "Accepted", "Accepted")],
        inputs={2: {"go": True}},
    ),
    "manual-retry-then-success": Story(
        {1: "exit:1:KeyError", 2: "commit"},
        "Succeeded",
        [("Failed", "initial"), ("Succeeded", "manual_retry")],
        [1, 2],
        user=(("Failed", retry_request("retry-1")),),
        controls=[("Retry", "Accepted", "Accepted")],
    ),
    "unknown-side-effect-resolved-then-retried": Story(
        {1: "unknown", 2: "commit"},
        "Succeeded",
        [("Failed", "initial"), ("Succeeded", "manual_retry")],
        [1, 2],
        user=(
            ("NeedsReconciliation", retry_request("retry-1")),
            ("NeedsReconciliation", "resolve"),
            ("NeedsReconciliation", retry_request("retry-2")),
        ),
        controls=[("Retry", "Rejected", "UnresolvedSideEffects"), ("Retry", "Accepted", "Accepted")],
        side_effects={**NO_SIDE_EFFECTS, "confirmed": 1, "irreversible": 1},
    ),
    # maxAttempts 2 counts the Attempts since the resume: Attempt 3 is the first of a new series.
    "a-resume-renews-the-retry-budget": Story(
        {1: "exit:75:upstream reset", 2: "interrupt", 3: "exit:75:disk full", 4: "exit:75:dns failure"},
        "Failed",
        [
            ("Failed", "initial"),
            ("Interrupted", "retry:transient"),
            ("Failed", f"resume:{RUN}-r1"),
            ("Failed", "retry:transient"),
        ],
        [1, 2, 3, 4],
        "RetryBudgetExhausted",
        {"retry": {"maxAttempts": 2}},
        user=(("InputRequired", answer("yes", "answer-1")),),
        controls=[("Resume", "Accepted", "Accepted")],
        # Attempt 3 failed before saving a Checkpoint after the answer: its retry carries the answer on.
        inputs={3: "yes", 4: "yes"},
    ),
    # Lease loss is not retried here: the Run fails with the Lease revoked at epoch 2, and the manual
    # retry's Attempt 2 is granted that same epoch.
    "lease-lost-then-manual-retry": Story(
        {1: "hang", 2: "commit"},
        "Succeeded",
        [("LeaseLost", "initial"), ("Succeeded", "manual_retry")],
        [1, 2],
        spec={"retry": {"retryOn": ["transient"]}},
        user=(("Failed", retry_request("retry-1")),),
        controls=[("Retry", "Accepted", "Accepted")],
    ),
    "checkpoints-pruned-beyond-retention": Story(
        {1: "interrupt", 2: "interrupt", 3: "commit"},
        "Succeeded",
        [("Interrupted", "initial"), ("Interrupted", f"resume:{RUN}-r4"), ("Succeeded", f"resume:{RUN}-r8")],
        [1, 2, 3],
        spec={"checkpointRetention": 1},
        user=(("InputRequired", answer(1, "answer-1")), ("InputRequired", answer(2, "answer-2"))),
        controls=[("Resume", "Accepted", "Accepted"), ("Resume", "Accepted", "Accepted")],
        inputs={2: 1, 3: 2},
        saves=3,
    ),
}


def check_story(story: Story, crash: tuple[int, int] | None) -> None:
    cluster = Cluster(
        spec=copy.deepcopy(story.spec), fates=story.fates, user=list(story.user), saves=story.saves
    )
    cluster.drive(crash)
    status = cluster.status or {}
    attempts = sorted(cluster.attempts.values(), key=lambda a: a["spec"]["number"])

    assert status["phase"] == story.phase
    assert (status.get("failure") or {}).get("reason") == story.stop_reason
    assert [(a["status"]["phase"], a["spec"]["reason"]) for a in attempts] == story.attempts
    assert {a["spec"]["number"]: a["spec"]["input"] for a in attempts if "input" in a["spec"]} == story.inputs
    assert [a["spec"]["leaseEpoch"] for a in attempts] == list(range(1, len(attempts) + 1))
    assert cluster.lease_epochs == story.lease_epochs
    assert status["leaseEpoch"] == story.lease_epochs[-1]
    assert status["currentAttempt"] == status["attempts"] == len(attempts)
    assert sorted(cluster.pods_created) == [a["metadata"]["name"] for a in attempts]  # one Pod per Attempt
    assert all(p["status"]["phase"] in ("Succeeded", "Failed") for p in cluster.pods.values()), "a Pod left"
    assert [(c["op"], c["outcome"], c["reason"]) for c in status.get("controls") or []] == story.controls
    assert status["sideEffects"] == story.side_effects
    assert len(status["report"]["effects"]) == len(cluster.side_effects)
    if story.phase == "Succeeded":
        assert status["committedBy"]["attempt"] == attempts[-1]["metadata"]["name"]
    retention = story.spec.get("checkpointRetention", 20)
    assert cluster.protected_checkpoints() <= set(cluster.checkpoints)
    assert len(set(cluster.checkpoints) - cluster.protected_checkpoints()) <= retention
    if story.saves:
        assert cluster.checkpoints_pruned, "the story saves more Checkpoints than it keeps"


@pytest.mark.parametrize("story", STORIES.values(), ids=STORIES.keys())
def test_story(story: Story) -> None:
    check_story(story, crash=None)


def crash_points() -> dict[str, tuple[Story, tuple[int, int]]]:
    """Every place an operator can die in every story: after n writes of decision `step` (n < all)."""
    points = {}
    for name, story in STORIES.items():
        cluster = Cluster(
            spec=copy.deepcopy(story.spec), fates=story.fates, user=list(story.user), saves=story.saves
        )
        for step, plan in enumerate(cluster.drive()):
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
