"""core.runs: failures and retries, lease expiry and takeover, cancel and deadline, a committed result."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from agentrun.api import (
    FailureClass,
)
from agentrun.core.failures import fingerprint
from agentrun.core.lease import LeaseView
from agentrun.core.plan import (
    DeletePod,
    PatchAttemptStatus,
    WriteLease,
)
from agentrun.core.retry import backoff_seconds
from agentrun.core.runs import RECHECK_SECONDS, World, decide
from unit.factories import (
    LEASE_RESOURCE_VERSION,
    LEASE_SECONDS,
    NOW,
    RUN_UID,
    TRACE_ID,
    attempt_patches,
    committed_by,
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
    pending_request,
    run_patch,
    run_status,
    running_pod,
    ts,
)
from unit.run_worlds import (
    COMMITTED,
    DEADLINE,
    LOST,
    NOT_STARTED,
    TIMEOUT_1,
    TIMEOUT_2,
    backing_off,
    cancelled,
    ended,
    next_attempt_time,
    sdk,
    supervising,
)

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
    assert events(plan) == []  # the Run's phase says it: no Event for nobody


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
    assert f"{LEASE_SECONDS}s" in lost[0]["failure"]["message"]
    assert of_type(plan, DeletePod) == [DeletePod(name_of(1), grace_seconds=0)]
    # Revoked at once, not at the next grant: a frozen worker that wakes up in the backoff is stale.
    assert of_type(plan, WriteLease) == [WriteLease(None, 2, LEASE_SECONDS, LEASE_RESOURCE_VERSION)]
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

    assert of_type(plan, WriteLease) == [WriteLease(None, expected, LEASE_SECONDS, "999")]
    assert run_patch(plan)["leaseEpoch"] == expected
    assert plan.actions.index(of_type(plan, WriteLease)[0]) < plan.actions.index(of_type(plan, DeletePod)[0])


def test_lease_expiry_on_the_last_attempt_revokes_too() -> None:
    """The Run fails, and the Lease is revoked all the same: no late write of the lost worker counts."""
    world = supervising(2, history=(failed_attempt(1, FailureClass.TRANSIENT),), expires_in=-1.0)
    plan = decide(replace(world, run=make_run(world.run.status.to_api(), spec={"retry": {"maxAttempts": 2}})))
    patch = run_patch(plan)

    assert patch["phase"] == "Failed"
    assert patch["leaseEpoch"] == 3
    assert of_type(plan, WriteLease) == [WriteLease(None, 3, LEASE_SECONDS, LEASE_RESOURCE_VERSION)]


@pytest.mark.parametrize("expires_in", [-100.0, 0.0, None])
def test_lease_is_not_judged_before_the_agent_runs(expires_in: float | None) -> None:
    plan = decide(supervising(pod="pending", attempt=NOT_STARTED, expires_in=expires_in))

    assert plan.actions == []
    assert plan.requeue_after == RECHECK_SECONDS


@pytest.mark.parametrize(
    ("lease", "writes"),
    [(held_by(1), [WriteLease(None, 2, LEASE_SECONDS, LEASE_RESOURCE_VERSION)]), (make_lease(None, 2), [])],
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

    assert of_type(plan, WriteLease) == [WriteLease(None, 5, LEASE_SECONDS, LEASE_RESOURCE_VERSION)]
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

    assert of_type(plan, WriteLease) == [WriteLease(None, 1, LEASE_SECONDS, None)]
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
