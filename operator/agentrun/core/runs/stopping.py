"""Stopping a Run: cancel (spec.cancelEpoch grew), the deadline (spec.deadlineSeconds), a squatted name,
and what a stopped Run still keeps in order."""

from __future__ import annotations

from datetime import timedelta

from agentrun.api import (
    FINISHED_ATTEMPT_PHASES,
    Attempt,
    AttemptFailure,
    AttemptPhase,
    FailureClass,
    RunPhase,
    RunReport,
)
from agentrun.api.sideeffect import MAX_HISTORY
from agentrun.core import failures, ledger, report
from agentrun.core.plan import DeletePod, PatchRunStatus, PatchSideEffectStatus, WriteLease
from agentrun.core.pods import PodView
from agentrun.core.runs.builder import Builder
from agentrun.core.runs.world import RECHECK_SECONDS, World, rfc3339


def deadline_passed(world: World) -> bool:
    created, limit = world.run.metadata.creation_timestamp, world.run.spec.deadline_seconds
    return bool(limit and created and world.now >= created + timedelta(seconds=limit))


def revoke_lease(b: Builder) -> int:
    """Takes the Lease from whoever holds it: a new epoch, so any late write of theirs is refused.

    A Lease that nobody holds was revoked already (a revocation interrupted before the Run's status
    was written): its epoch is adopted, never bumped again, so no epoch is skipped.
    """
    lease = b.w.lease
    if lease is not None and lease.holder is None:
        return lease.epoch
    epoch = (lease.epoch if lease else 0) + 1
    b.plan.add(
        WriteLease(None, epoch, b.run.spec.lease.duration_seconds, lease.resource_version if lease else None)
    )
    return epoch


def stop_for_deadline(b: Builder, attempt: Attempt | None, pod: PodView | None) -> None:
    limit = b.run.spec.deadline_seconds
    message = f"the Run exceeded its deadline of {limit}s"
    epoch = revoke_lease(b)
    failure = failures.failure(FailureClass.CANCELLED, message)
    if attempt is not None:
        b.finish_attempt(attempt, AttemptPhase.ABORTED, failure)
    if pod is not None and not pod.finished:
        b.plan.add(DeletePod(pod.name))
    b.set_phase(
        RunPhase.FAILED,
        "DeadlineExceeded",
        message,
        leaseEpoch=epoch,
        nextAttemptTime=None,
        failure={"class": "cancelled", "reason": "DeadlineExceeded", "message": message},
    )
    b.event("Warning", "DeadlineExceeded", message)


def request_cancel(b: Builder, attempt: Attempt | None, pod: PodView | None) -> None:
    epoch = b.run.spec.cancel_epoch
    if pod is not None and not pod.finished:
        message = f"cancel epoch {epoch}: stopping {pod.name}"
        b.set_phase(RunPhase.CANCEL_REQUESTED, "CancelRequested", message, observedCancelEpoch=epoch)
        b.plan.add(DeletePod(pod.name))
        b.event("Normal", "CancelRequested", message)
        return
    mark_cancelled(b, attempt)


def finish_cancel(b: Builder, attempt: Attempt | None, pod: PodView | None) -> None:
    if pod is not None and not pod.finished:
        if not pod.deleting:  # the stop was lost (an operator restart between the two writes of cancel)
            b.plan.add(DeletePod(pod.name))
        b.plan.wake_in(RECHECK_SECONDS)  # the Pod's deletion will wake us sooner
        return
    mark_cancelled(b, attempt)


def mark_cancelled(b: Builder, attempt: Attempt | None) -> None:
    epoch = b.run.spec.cancel_epoch
    if attempt is not None:
        b.finish_attempt(attempt, AttemptPhase.ABORTED, failures.failure(FailureClass.CANCELLED, "cancelled"))
    message = f"cancelled (cancel epoch {epoch})"
    b.set_phase(RunPhase.CANCELLED, "Cancelled", message, observedCancelEpoch=epoch, nextAttemptTime=None)
    b.event("Normal", "Cancelled", message)


def finish_lost(b: Builder, attempt: Attempt, pod: PodView | None, failure: AttemptFailure) -> None:
    """The Attempt lost its lease: its Pod stopped at once, the Attempt marked LeaseLost."""
    if pod is not None and not pod.finished:
        b.plan.add(DeletePod(pod.name, grace_seconds=0))
    b.finish_attempt(attempt, AttemptPhase.LEASE_LOST, failure)


def lease_lost(b: Builder) -> AttemptFailure:
    return failures.lease_lost(b.run.spec.lease.duration_seconds)


# ---- a stopped Run ----------------------------------------------------------------------------------


def abort_leftovers(b: Builder) -> None:
    """A stopped Run has no Attempt still going. One its stop did not see (its grant raced with a cancel,
    or the operator's cache did not hold it yet) is aborted now and its Pod stopped: its writes are
    fenced off already, and its history must not read as if it were still running."""
    status = b.status
    phase = status.phase.value if status.phase else "stopped"
    lost = status.failure is not None and status.failure.failure_class == FailureClass.LEASE_LOST
    for attempt in b.w.attempts.values():
        if attempt.status.phase in FINISHED_ATTEMPT_PHASES:
            continue
        pod = b.w.pods.get(str(attempt.metadata.name))
        if lost and attempt.spec.number == status.current_attempt:
            # The takeover that failed the Run was interrupted before it ended its Attempt.
            finish_lost(b, attempt, pod, lease_lost(b))
            continue
        message = f"the Run was {phase} before this Attempt finished"
        b.finish_attempt(attempt, AttemptPhase.ABORTED, failures.failure(FailureClass.CANCELLED, message))
        if pod is not None and not pod.finished and not pod.deleting:
            b.plan.add(DeletePod(pod.name))


def settle_after_cancel(b: Builder) -> None:
    """An ended Run (Cancelled or Failed) never leaves a record Pending: what was in flight may have
    happened. Once no Attempt of the Run may still write, its Pending SideEffects are marked Unknown."""
    phase = b.status.phase
    if phase not in (RunPhase.CANCELLED, RunPhase.FAILED) or live_attempts(b.w):
        return
    failed = phase == RunPhase.FAILED
    now = rfc3339(b.w.now)
    for effect, patch, version in ledger.settle_after_cancel(
        b.w.side_effects, now, MAX_HISTORY, failed=failed
    ):
        b.plan.add(PatchSideEffectStatus(effect, patch, version))


def live_attempts(world: World) -> bool:
    """Whether an Attempt of the Run may still write (not finished, or its Pod not yet gone)."""
    for attempt in world.attempts.values():
        pod = world.pods.get(str(attempt.metadata.name))
        if attempt.status.phase not in FINISHED_ATTEMPT_PHASES or (pod is not None and not pod.finished):
            return True
    return False


def refresh_report(b: Builder) -> None:
    """A stopped Run keeps its report in step with its SideEffects (e.g. one resolved by a person)."""
    counts = report.side_effect_counts(b.w.side_effects)
    current = b.status.side_effects.to_api() if b.status.side_effects else None
    listed = report.run_report(b.w.side_effects)
    # Compared as stored (normalised by the model): a Pending record marked Unknown changes no count.
    stored = b.status.report
    stale = stored is not None and stored.to_api() != RunReport.model_validate(listed).to_api()
    if current != counts or stale:
        b.plan.add(PatchRunStatus({"sideEffects": counts, "report": listed}))
