"""Stopping a Run: cancel (spec.cancelEpoch grew) and the deadline (spec.deadlineSeconds)."""

from __future__ import annotations

from datetime import timedelta

from agentrun.api import (
    Attempt,
    AttemptPhase,
    FailureClass,
    RunPhase,
)
from agentrun.core import failures
from agentrun.core.decision import RECHECK_SECONDS, Decision, World
from agentrun.core.plan import (
    DeletePod,
    WriteLease,
)
from agentrun.core.pods import PodView


def deadline_passed(world: World) -> bool:
    created, limit = world.run.metadata.creation_timestamp, world.run.spec.deadline_seconds
    return bool(limit and created and world.now >= created + timedelta(seconds=limit))


def revoke_lease(d: Decision) -> int:
    """Takes the Lease from whoever holds it: a new epoch, so any late write of theirs is refused.

    A Lease that nobody holds was revoked already (a revocation interrupted before the Run's status
    was written): its epoch is adopted, never bumped again, so no epoch is skipped.
    """
    lease = d.w.lease
    if lease is not None and lease.holder is None:
        return lease.epoch
    epoch = (lease.epoch if lease else 0) + 1
    d.plan.add(
        WriteLease(None, epoch, d.run.spec.lease.duration_seconds, lease.resource_version if lease else None)
    )
    return epoch


def stop_for_deadline(d: Decision, attempt: Attempt | None, pod: PodView | None) -> None:
    limit = d.run.spec.deadline_seconds
    message = f"the Run exceeded its deadline of {limit}s"
    epoch = revoke_lease(d)
    failure = failures.failure(FailureClass.CANCELLED, message)
    if attempt is not None:
        d.finish_attempt(attempt, AttemptPhase.ABORTED, failure)
    if pod is not None and not pod.finished:
        d.plan.add(DeletePod(pod.name))
    d.set_phase(
        RunPhase.FAILED,
        "DeadlineExceeded",
        message,
        leaseEpoch=epoch,
        nextAttemptTime=None,
        failure={"class": "cancelled", "reason": "DeadlineExceeded", "message": message},
    )
    d.event("Warning", "DeadlineExceeded", message)


def request_cancel(d: Decision, attempt: Attempt | None, pod: PodView | None) -> None:
    epoch = d.run.spec.cancel_epoch
    if pod is not None and not pod.finished:
        d.set_phase(
            RunPhase.CANCEL_REQUESTED,
            "CancelRequested",
            f"cancel epoch {epoch}: stopping {pod.name}",
            observedCancelEpoch=epoch,
        )
        d.plan.add(DeletePod(pod.name))
        d.event("Normal", "CancelRequested", f"cancel epoch {epoch}: stopping {pod.name}")
        return
    mark_cancelled(d, attempt)


def finish_cancel(d: Decision, attempt: Attempt | None, pod: PodView | None) -> None:
    if pod is not None and not pod.finished:
        if not pod.deleting:  # the stop was lost (an operator restart between the two writes of cancel)
            d.plan.add(DeletePod(pod.name))
        d.plan.wake_in(RECHECK_SECONDS)  # the Pod's deletion will wake us sooner
        return
    mark_cancelled(d, attempt)


def mark_cancelled(d: Decision, attempt: Attempt | None) -> None:
    epoch = d.run.spec.cancel_epoch
    if attempt is not None:
        d.finish_attempt(attempt, AttemptPhase.ABORTED, failures.failure(FailureClass.CANCELLED, "cancelled"))
    message = f"cancelled (cancel epoch {epoch})"
    d.set_phase(RunPhase.CANCELLED, "Cancelled", message, observedCancelEpoch=epoch, nextAttemptTime=None)
    d.event("Normal", "Cancelled", message)
