"""core.runs.decide, one transition per case: a World (what the operator observes) and the writes the
decision must ask for, in order.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from agentrun.api import (
    Attempt,
    FailureClass,
    RunPhase,
    StateStoreMode,
)
from agentrun.core import report
from agentrun.core.failures import ContainerWaiting
from agentrun.core.plan import (
    Action,
    CreateAttempt,
    CreatePod,
    DeleteCheckpoint,
    DeletePod,
    PatchRunStatus,
    Plan,
    RecordEvent,
    RefuseMove,
    WriteLease,
)
from agentrun.core.pods import PodView, StateStorePodEnv
from agentrun.core.runs import RECHECK_SECONDS, TABLE, World, attempts, decide
from agentrun.core.runs.chain import Chain, Rewrite, Rule
from agentrun.core.runs.transition import SetPhase, set_phase
from agentrun.core.runs.transition import Transition as RuleTransition
from unit.factories import (
    GENERATION,
    NO_SIDE_EFFECTS,
    NOW,
    RUN,
    attempt_patches,
    committed_by,
    failed_attempt,
    failure_of,
    held_by,
    kinds,
    make_attempt,
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
from unit.run_worlds import (
    ADOPTED_GRANT,
    CATCHING_UP,
    CHAIN,
    COMMITTED,
    CONDITION_FACTS,
    CONDITION_TYPES,
    CONTROLS,
    DEADLINE,
    EFFECT_COUNTS,
    EFFECTS,
    GRANT,
    LEASE_LOST,
    LOST,
    NOT_STARTED,
    ONE_IRREVERSIBLE,
    PAUSED,
    RECORD,
    REPORTING,
    SCHEMA,
    SUCCESSOR_GRANT,
    TIMEOUT_1,
    TIMEOUT_2,
    UNKNOWN_EFFECT,
    WAITING,
    Transition,
    at_rest,
    backing_off,
    cancelled,
    ended,
    expiring_at,
    next_attempt_time,
    pause_spec,
    queued,
    record,
    resume,
    retry_spec,
    sdk,
    stopped,
    supervising,
    waiting,
    with_checkpoints,
)

ROLE_DENIED = ("patch runs/status", "create checkpoints", "patch leases")
S3_STORE = StateStorePodEnv("s3://agentrun?endpoint=http://objects.example:7070", "agentrun-state-store")
# The Lease revoked, the Run moved on, the Pod stopped with its grace period, then the Attempt marked.
ATTEMPT_TIMED_OUT = ["WriteLease", "PatchRunStatus", "DeletePod", "PatchAttemptStatus"]


def timed_out_attempt(number: int) -> Attempt:
    failure = failure_of(FailureClass.INFRASTRUCTURE, "the Attempt ran 300s").model_copy(
        update={"reason": "AttemptTimeout"}
    )
    return make_attempt(number, phase="Failed", failure=failure)


KUBELET_SAYS = {
    "ErrImageNeverPull": 'Container image "agents/none:1" is not present with pull policy of Never',
    "InvalidImageName": 'Failed to apply default image tag "agents/NONE": couldn\'t parse image name',
    "ErrImagePull": 'failed to pull and unpack image "agents/none:1": failed to resolve reference',
    "ImagePullBackOff": 'Back-off pulling image "agents/none:1"',
    "CreateContainerConfigError": 'secret "model-keys" not found',
}


def blocked_pod(reason: str) -> PodView:
    """Attempt 1's Pod, created 60s before NOW, its agent container kept from starting for `reason`."""
    waiting = ContainerWaiting("agent", reason, KUBELET_SAYS[reason], "agents/none:1")
    return replace(pending_pod(1), waiting=waiting, created=ts(NOW - timedelta(seconds=60)))


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
    # Pre-flight: a ServiceAccount opted in but not bound to the attempt role fails the Run before any
    # Lease, Attempt or Pod (its agent would otherwise fail on a 403, as if deterministically).
    "new-run-attempt-role-not-bound": Transition(
        make_world(make_run(), attempt_role_denied=ROLE_DENIED),
        ["PatchRunStatus"],
        "Failed",
        stop_reason="AttemptRoleNotBound",
    ),
    "new-run-attempt-role-bound-grants-attempt-1": Transition(
        make_world(make_run(), attempt_role_denied=()), GRANT, "Running"
    ),
    "queued-attempt-role-not-bound": Transition(
        replace(queued(), attempt_role_denied=ROLE_DENIED),
        ["PatchRunStatus"],
        "Failed",
        stop_reason="AttemptRoleNotBound",
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
    # ---- spec.attemptTimeoutSeconds (the Attempt's agent started 300s before NOW)
    "running-attempt-timed-out": Transition(
        supervising(spec={"attemptTimeoutSeconds": 240}),
        ATTEMPT_TIMED_OUT,
        "RetryBackoff",
        {1: "Failed"},
        requeue="backoff",
    ),
    "running-attempt-timed-out-exactly-now": Transition(
        supervising(spec={"attemptTimeoutSeconds": 300}),
        ATTEMPT_TIMED_OUT,
        "RetryBackoff",
        {1: "Failed"},
        requeue="backoff",
    ),
    "running-attempt-timed-out-on-its-last-attempt": Transition(
        supervising(spec={"attemptTimeoutSeconds": 240, "retry": {"maxAttempts": 1}}),
        ATTEMPT_TIMED_OUT,
        "Failed",
        {1: "Failed"},
        stop_reason="AttemptTimeout",
    ),
    # ---- a Pod the kubelet keeps from starting (created 60s before NOW; startTimeoutSeconds 300 by default)
    "image-never-pulled-fails-at-once-not-retried": Transition(
        supervising(attempt=NOT_STARTED, pod=blocked_pod("ErrImageNeverPull")),
        ATTEMPT_TIMED_OUT,
        "Failed",
        {1: "Failed"},
        stop_reason="ImageNotFound",
    ),
    "invalid-image-name-fails-at-once": Transition(
        supervising(attempt=NOT_STARTED, pod=blocked_pod("InvalidImageName")),
        ATTEMPT_TIMED_OUT,
        "Failed",
        {1: "Failed"},
        stop_reason="ImageNotFound",
    ),
    "image-pull-backing-off-is-waited-for-until-the-start-timeout": Transition(
        supervising(attempt=NOT_STARTED, pod=blocked_pod("ImagePullBackOff")), [], requeue=240.05
    ),
    "image-pull-failing-past-the-start-timeout-fails": Transition(
        supervising(attempt=NOT_STARTED, pod=blocked_pod("ErrImagePull"), spec={"startTimeoutSeconds": 60}),
        ATTEMPT_TIMED_OUT,
        "Failed",
        {1: "Failed"},
        stop_reason="ImagePullFailed",
    ),
    "missing-secret-is-waited-for": Transition(
        supervising(
            attempt=NOT_STARTED,
            pod=blocked_pod("CreateContainerConfigError"),
            spec={"startTimeoutSeconds": 90},
        ),
        [],
        requeue=30.05,
    ),
    "missing-secret-past-the-start-timeout-fails": Transition(
        supervising(
            attempt=NOT_STARTED,
            pod=blocked_pod("CreateContainerConfigError"),
            spec={"startTimeoutSeconds": 59},
        ),
        ATTEMPT_TIMED_OUT,
        "Failed",
        {1: "Failed"},
        stop_reason="ConfigMissing",
    ),
    "running-attempt-timeout-not-due-wakes-when-due": Transition(
        supervising(spec={"attemptTimeoutSeconds": 320}), [], requeue=20.0, lease_check=30.05
    ),
    "running-attempt-timeout-counts-from-the-agent-start": Transition(
        supervising(attempt=NOT_STARTED, spec={"attemptTimeoutSeconds": 320}),
        ["PatchAttemptStatus"],
        attempts={1: "Running"},
        requeue=20.0,
        lease_check=30.05,
    ),
    "running-attempt-timeout-not-judged-before-the-pod-started": Transition(
        supervising(pod="pending", attempt=NOT_STARTED, spec={"attemptTimeoutSeconds": 1}),
        [],
        requeue=RECHECK_SECONDS,
    ),
    "backoff-due-after-an-attempt-timeout": Transition(
        backing_off(previous=timed_out_attempt(1), spec={"attemptTimeoutSeconds": 240}),
        SUCCESSOR_GRANT,
        "Running",
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
            (
                "sdk-pod-terminated",
                ended(1, 1, sdk("infrastructure", "the attempt Pod was stopped (SIGTERM)")),
            ),
            # an older SDK took its Pod's deletion for a cancel: the Run was not cancelled (CancelAsked first)
            ("older-sdk-cancelled-by-a-pod-deletion", ended(1, 1, sdk("cancelled", "stopped"))),
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
    # The binding was taken away since Attempt 1: no successor is granted, nothing of it is made.
    "backoff-due-attempt-role-not-bound": Transition(
        replace(backing_off(), attempt_role_denied=ROLE_DENIED),
        ["PatchRunStatus"],
        "Failed",
        stop_reason="AttemptRoleNotBound",
    ),
    # The namespace has no Secret of the state store's credentials: its Pods could not start.
    "new-run-store-credentials-missing": Transition(
        replace(make_world(make_run()), state_store=S3_STORE, store_credentials_missing=True),
        ["PatchRunStatus"],
        "Failed",
        stop_reason="StateStoreCredentialsMissing",
    ),
    "backoff-due-store-credentials-missing": Transition(
        replace(backing_off(), state_store=S3_STORE, store_credentials_missing=True),
        ["PatchRunStatus"],
        "Failed",
        stop_reason="StateStoreCredentialsMissing",
    ),
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
    # A Run that ended before its phase change cleared the request (an earlier operator) drops it.
    "cancelled-with-a-leftover-request-drops-it": Transition(
        stopped("Cancelled", pendingRequest=WAITING),
        ["PatchRunStatus"],
        status_fields=frozenset({"pendingRequest"}),
    ),
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
        # ---- a state that cannot be verified stops for a person, whatever the retry policy says
        "state-unverifiable-with-deterministic-in-retry-on": Transition(
            supervising(
                pod=ended(
                    1, 1, sdk("deterministic", "blob sha256:ab.. does not match", reason="StateUnverifiable")
                ),
                spec={"retry": {"maxAttempts": 10, "retryOn": ["deterministic", "transient"]}},
            ),
            ["PatchAttemptStatus", "PatchRunStatus"],
            "NeedsReconciliation",
            {1: "Failed"},
            stop_reason="StateUnverifiable",
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
            ["DeleteLease"],  # nothing but the finished Run's Lease released (no state store: compaction)
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
            ["DeleteCheckpoint"] * 4 + ["DeleteLease"],  # retention, then the Lease of a finished Run
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


@pytest.mark.parametrize("mode", list(StateStoreMode), ids=[m.value for m in StateStoreMode])
def test_every_phase_change_says_where_the_operator_keeps_agent_state(mode: StateStoreMode) -> None:
    for name, case in CASES_WITH_STATUS_PATCHES.items():
        plan = decide(replace(case.world, store_mode=mode))
        changes = [p.patch for p in of_type(plan, PatchRunStatus) if "phase" in p.patch]
        assert [c["stateStore"] for c in changes] == [mode.value] * len(changes), name
        others = [p.patch for p in of_type(plan, PatchRunStatus) if "phase" not in p.patch]
        assert all("stateStore" not in p for p in others), name


ENDS_WAITING = {
    k: c
    for k, c in TRANSITIONS.items()
    if c.phase in ("Succeeded", "Failed", "Cancelled") and c.world.run.status.pending_request is not None
}


@pytest.mark.parametrize("case", ENDS_WAITING.values(), ids=ENDS_WAITING.keys())
def test_a_run_that_ends_waits_for_nobody(case: Transition) -> None:
    """A Run that ends with a request pending (cancelled or expired while waiting) clears it in the same
    write: no console inbox and no WAITING FOR column shows it any more."""
    patch = next(p.patch for p in of_type(decide(case.world), PatchRunStatus) if "phase" in p.patch)

    assert "pendingRequest" in patch
    assert patch["pendingRequest"] is None


def test_the_ends_with_a_request_pending_are_in_the_table() -> None:
    assert {"cancel-while-waiting-for-input"} <= set(ENDS_WAITING)
    assert any(c.phase == "Failed" for c in ENDS_WAITING.values())


def test_a_timed_out_attempt_is_failed_as_infrastructure_and_its_pod_stopped_with_grace() -> None:
    world = TRANSITIONS["running-attempt-timed-out"].world
    plan = decide(world)

    assert attempts.RUNNING.decide(world).rule == "TimedOut"
    assert of_type(plan, WriteLease)[0].holder is None
    assert run_patch(plan)["leaseEpoch"] == 2
    assert of_type(plan, DeletePod) == [DeletePod(name_of(1))]  # its grace period, then the kubelet kills
    failure = attempt_patches(plan)[name_of(1)][-1]["failure"]
    assert (failure["class"], failure["reason"]) == ("infrastructure", "AttemptTimeout")
    assert failure["message"] == "the Attempt ran 300s, past its attemptTimeoutSeconds of 240s"


START_FAILURES = {
    "image-never-pulled-fails-at-once-not-retried": (
        "ImageNotFound",
        "the image agents/none:1 of container agent can never be pulled (ErrImageNeverPull: Container "
        'image "agents/none:1" is not present with pull policy of Never): set spec.agent.image to an image '
        "the node has, or let it be pulled",
    ),
    "image-pull-failing-past-the-start-timeout-fails": (
        "ImagePullFailed",
        "the image agents/none:1 of container agent was not pulled within startTimeoutSeconds (60s): "
        'ErrImagePull: failed to pull and unpack image "agents/none:1": failed to resolve reference',
    ),
    "missing-secret-past-the-start-timeout-fails": (
        "ConfigMissing",
        "container agent could not be created within startTimeoutSeconds (59s): CreateContainerConfigError: "
        "secret \"model-keys\" not found: create what it names in the Run's namespace, or change the Run's "
        "pod template",
    ),
}


@pytest.mark.parametrize(("case", "said"), START_FAILURES.items(), ids=START_FAILURES.keys())
def test_a_pod_that_cannot_start_fails_naming_what_to_fix(case: str, said: tuple[str, str]) -> None:
    """The Attempt fails deterministic (never retried on a configuration error), its Pod deleted, and the
    Run's failure says which image or which object."""
    world = TRANSITIONS[case].world
    plan = decide(world)

    assert attempts.RUNNING.decide(world).rule == "NotStarting"
    assert of_type(plan, DeletePod) == [DeletePod(name_of(1))]
    failure = attempt_patches(plan)[name_of(1)][-1]["failure"]
    assert (failure["class"], failure["reason"], failure["message"]) == ("deterministic", *said)
    assert run_patch(plan)["failure"]["message"] == said[1]


# ---- the table itself --------------------------------------------------------------------------------------


def test_the_table_reads_as_the_state_machine() -> None:
    """One line per rule, each named once, each saying its transition (`condition -> what happens`)."""
    assert len(set(TABLE.names)) == len(TABLE.names)
    for rule in TABLE.rules:
        assert rule.when.__doc__ is not None and " -> " in rule.when.__doc__, rule.name


DECIDED_BY = {
    "new-run-grants-attempt-1": "FirstAttempt",
    "new-run-attempt-role-not-bound": "FirstAttempt",
    "backoff-due-attempt-role-not-bound": "RetryDue",
    "new-run-store-credentials-missing": "StateStoreCredentialsMissing",
    "backoff-due-store-credentials-missing": "RetryDue",
    "being-deleted-before-queued": "Deleted",
    "running-healthy": "Running",
    "running-lease-expired": "Running",
    "running-attempt-timed-out": "Running",
    "backoff-due": "RetryDue",
    "backoff-not-due-yet": "BackingOff",
    "commit-wins-over-a-later-cancel": "Committed",
    "manual-retry-of-a-failed-run": "ControlRequest",
    "pause-honoured": "ControlRequest",
}


@pytest.mark.parametrize(("case", "rule"), DECIDED_BY.items(), ids=DECIDED_BY.keys())
def test_the_rule_that_decides(case: str, rule: str) -> None:
    decided_by, plan = TABLE.first(TRANSITIONS[case].world)

    assert decided_by.name == rule
    assert plan == decide(TRANSITIONS[case].world)


def test_a_chain_prepends_the_upkeep_only_to_the_rules_that_ask_for_it() -> None:
    kept, decided = DeleteCheckpoint("old"), DeletePod("p")

    def decides(world: World) -> RuleTransition | None:
        return RuleTransition(steps=(decided,), requeue_after=1.0)

    def upkeep(world: World) -> tuple[Action, ...]:
        return (kept,)

    world = make_world(make_run())
    assert Chain((Rule("Decides", decides),), upkeep).evaluate(world) == Plan([kept, decided], 1.0)
    assert Chain((Rule("Decides", decides, upkeep=False),), upkeep).evaluate(world) == Plan([decided], 1.0)
    with pytest.raises(LookupError):
        Chain((Rule("Never", lambda world: None),), upkeep).evaluate(world)


@pytest.mark.parametrize("case", TRANSITIONS.values(), ids=TRANSITIONS.keys())
def test_every_move_is_one_its_rule_declares(case: Transition) -> None:
    """The diagram of docs/state-machine.md is drawn from the rules' applies_in and moves_to: every
    decision of these cases keeps to them, rewrites (CompensateFirst) included."""
    world = case.world
    rule, transition = TABLE.transition(world)
    before = world.run.status.phase
    turns = {turn for rewrite in TABLE.rewrites for turn in rewrite.turns}

    assert before in rule.applies_in, rule.name
    for change in (s for s in transition.steps if isinstance(s, SetPhase)):
        declared = change.phase == before or (before, change.phase) in rule.moves
        rewritten = any(to == change.phase and (before, source) in rule.moves for source, to in turns)
        assert declared or rewritten, (rule.name, before, change.phase)


def _unused_upkeep(world: World) -> tuple[Action, ...]:
    return ()


def test_a_rule_is_not_evaluated_outside_the_phases_it_applies_in() -> None:
    """The chain, not the rule's body, keeps a rule to its phases: a rule for Queued Runs is never asked
    about a Running one."""

    def only_queued(world: World) -> RuleTransition | None:
        raise AssertionError(f"asked about a Run in {world.run.status.phase}")

    chain = Chain(
        (
            Rule("OnlyQueued", only_queued, applies_in=frozenset({RunPhase.QUEUED})),
            Rule("Rest", lambda world: RuleTransition()),
        ),
        _unused_upkeep,
    )
    rule, _ = chain.transition(make_world(make_run({"phase": "Running"})))
    assert rule.name == "Rest"


def test_an_undeclared_move_is_refused_and_named() -> None:
    """A rule that declares Queued -> Running but moves the Run to Failed: nothing of its transition is
    written (no status patch), the Run keeps its phase, and an Event and a RefuseMove name the rule."""

    def fails(world: World) -> RuleTransition | None:
        return set_phase(RunPhase.FAILED, "Oops", "a bug").then(RuleTransition(steps=(DeletePod("p"),)))

    planted = Rule(
        "Planted", fails, applies_in=frozenset({RunPhase.QUEUED}), moves_to=frozenset({RunPhase.RUNNING})
    )
    plan = Chain((planted,), _unused_upkeep).evaluate(make_world(make_run({"phase": "Queued"})))

    assert not plan.of(PatchRunStatus) and not plan.of(DeletePod)
    assert plan.of(RefuseMove) == [RefuseMove("Planted", "Queued", "Failed")]
    (warning,) = plan.of(RecordEvent)
    assert isinstance(warning, RecordEvent) and warning.reason == "UndeclaredMove"
    assert "Planted" in warning.message and "from Queued to Failed" in warning.message


def test_a_declared_move_and_a_phase_written_again_pass() -> None:
    def runs(world: World) -> RuleTransition | None:
        return set_phase(RunPhase.RUNNING, "Granted", "attempt 1")

    declared = Rule(
        "Declared", runs, applies_in=frozenset({RunPhase.QUEUED}), moves_to=frozenset({RunPhase.RUNNING})
    )
    again = Rule("Again", runs, applies_in=frozenset({RunPhase.RUNNING}))
    chain = Chain((declared, again), _unused_upkeep)

    assert chain.evaluate(make_world(make_run({"phase": "Queued"}))).of(PatchRunStatus)
    assert chain.evaluate(make_world(make_run({"phase": "Running"}))).of(PatchRunStatus)


def test_a_rewrite_may_only_make_the_turns_it_declares() -> None:
    """A rewrite that turns Failed into Succeeded, declaring only Failed -> Compensating, is refused."""

    def fails(world: World) -> RuleTransition | None:
        return set_phase(RunPhase.FAILED, "Failed", "it failed")

    def succeeds(world: World, t: RuleTransition) -> RuleTransition | None:
        return set_phase(RunPhase.SUCCEEDED, "Fine", "not really")

    rule = Rule(
        "Fails", fails, applies_in=frozenset({RunPhase.RUNNING}), moves_to=frozenset({RunPhase.FAILED})
    )
    turns = ((RunPhase.FAILED, RunPhase.COMPENSATING),)
    chain = Chain((rule,), _unused_upkeep, rewrites=(Rewrite("Sneaky", succeeds, turns=turns),))
    plan = chain.evaluate(make_world(make_run({"phase": "Running"})))

    assert plan.of(RefuseMove) == [RefuseMove("Fails+Sneaky", "Failed", "Succeeded")]
    assert not plan.of(PatchRunStatus)
