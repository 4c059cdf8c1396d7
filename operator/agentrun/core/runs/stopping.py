"""Stopping a Run: cancel (spec.cancelEpoch grew), the deadline (spec.deadlineSeconds), a squatted name,
and what a stopped Run still keeps in order."""

from __future__ import annotations

from datetime import timedelta

from agentrun.api import (
    FINISHED_ATTEMPT_PHASES,
    TERMINAL_PHASES,
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
from agentrun.core.runs.transition import (
    NOTHING,
    Transition,
    event,
    finish_attempt,
    set_phase,
    wake_in,
    writes,
)
from agentrun.core.runs.world import RECHECK_SECONDS, World, rfc3339


def deadline_passed(world: World) -> bool:
    created, limit = world.run.metadata.creation_timestamp, world.run.spec.deadline_seconds
    return bool(limit and created and world.now >= created + timedelta(seconds=limit))


def revoked(w: World) -> tuple[int, Transition]:
    """Takes the Lease from whoever holds it: (the new epoch, its write), so any late write of theirs is
    refused.

    A Lease that nobody holds was revoked already (a revocation interrupted before the Run's status
    was written): its epoch is adopted, never bumped again, so no epoch is skipped.
    """
    lease = w.lease
    if lease is not None and lease.holder is None:
        return lease.epoch, NOTHING
    # No Lease (a finished Run's was deleted): the epoch after the Run's recorded one, never an earlier.
    epoch = (lease.epoch if lease else (w.run.status.lease_epoch or 0)) + 1
    version = lease.resource_version if lease else None
    return epoch, writes(WriteLease(None, epoch, w.run.spec.lease.duration_seconds, version))


def stop_for_deadline(w: World, attempt: Attempt | None, pod: PodView | None) -> Transition:
    limit = w.run.spec.deadline_seconds
    message = f"the Run exceeded its deadline of {limit}s"
    epoch, t = revoked(w)
    failure = failures.failure(FailureClass.CANCELLED, message)
    if attempt is not None:
        t = t.then(finish_attempt(w, attempt, AttemptPhase.ABORTED, failure))
    if pod is not None and not pod.finished:
        t = t.then(DeletePod(pod.name))
    return t.then(
        set_phase(
            RunPhase.FAILED,
            "DeadlineExceeded",
            message,
            leaseEpoch=epoch,
            nextAttemptTime=None,
            failure={"class": "cancelled", "reason": "DeadlineExceeded", "message": message},
        ),
        event("Warning", "DeadlineExceeded", message),
    )


def request_cancel(w: World, attempt: Attempt | None, pod: PodView | None) -> Transition:
    epoch = w.run.spec.cancel_epoch
    if pod is not None and not pod.finished:
        message = f"cancel epoch {epoch}: stopping {pod.name}"
        return set_phase(
            RunPhase.CANCEL_REQUESTED, "CancelRequested", message, observedCancelEpoch=epoch
        ).then(DeletePod(pod.name), event("Normal", "CancelRequested", message))
    return mark_cancelled(w, attempt)


def finish_cancel(w: World, attempt: Attempt | None, pod: PodView | None) -> Transition:
    if pod is not None and not pod.finished:
        # The stop was lost if the Pod is not being deleted (an operator restart between the two writes
        # of cancel): repeated. The Pod's deletion will wake us sooner than the recheck.
        stop = NOTHING if pod.deleting else writes(DeletePod(pod.name))
        return stop.then(wake_in(RECHECK_SECONDS))
    return mark_cancelled(w, attempt)


def mark_cancelled(w: World, attempt: Attempt | None) -> Transition:
    epoch = w.run.spec.cancel_epoch
    t = NOTHING
    if attempt is not None:
        cancelled = failures.failure(FailureClass.CANCELLED, "cancelled")
        t = finish_attempt(w, attempt, AttemptPhase.ABORTED, cancelled)
    message = f"cancelled (cancel epoch {epoch})"
    return t.then(
        set_phase(RunPhase.CANCELLED, "Cancelled", message, observedCancelEpoch=epoch, nextAttemptTime=None),
        event("Normal", "Cancelled", message),
    )


def finish_lost(w: World, attempt: Attempt, pod: PodView | None, failure: AttemptFailure) -> Transition:
    """The Attempt lost its lease: its Pod stopped at once, the Attempt marked LeaseLost."""
    stop = writes(DeletePod(pod.name, grace_seconds=0)) if pod is not None and not pod.finished else NOTHING
    return stop.then(finish_attempt(w, attempt, AttemptPhase.LEASE_LOST, failure))


def lease_lost(w: World) -> AttemptFailure:
    return failures.lease_lost(w.run.spec.lease.duration_seconds)


# ---- a stopped Run ----------------------------------------------------------------------------------


def kept_in_order(w: World) -> Transition:
    """What a stopped Run still keeps in order: leftover Attempts aborted, a cancelled Run's Pending
    SideEffects settled, an ended Run's leftover pending request dropped, the report kept current."""
    return abort_leftovers(w).then(settle_after_cancel(w), drop_ended_request(w), refresh_report(w))


def at_rest(w: World) -> Transition | None:
    """A stopped Run with nothing to keep in order: kept_in_order's Transition (its look-again, no
    write); None when it writes."""
    kept = kept_in_order(w)
    return None if kept.steps else kept


def abort_leftovers(w: World) -> Transition:
    """A stopped Run has no Attempt still going. One its stop did not see (its grant raced with a cancel,
    or the operator's cache did not hold it yet) is aborted now and its Pod stopped: its writes are
    fenced off already, and its history must not read as if it were still running."""
    status = w.run.status
    phase = status.phase.value if status.phase else "stopped"
    lost = status.failure is not None and status.failure.failure_class == FailureClass.LEASE_LOST
    t = NOTHING
    for attempt in w.attempts.values():
        if attempt.status.phase in FINISHED_ATTEMPT_PHASES:
            continue
        pod = w.pods.get(str(attempt.metadata.name))
        if lost and attempt.spec.number == status.current_attempt:
            # The takeover that failed the Run was interrupted before it ended its Attempt.
            t = t.then(finish_lost(w, attempt, pod, lease_lost(w)))
            continue
        message = f"the Run was {phase} before this Attempt finished"
        aborted = failures.failure(FailureClass.CANCELLED, message)
        t = t.then(finish_attempt(w, attempt, AttemptPhase.ABORTED, aborted))
        if pod is not None and not pod.finished and not pod.deleting:
            t = t.then(DeletePod(pod.name))
    return t


def settle_after_cancel(w: World) -> Transition:
    """An ended Run (Cancelled or Failed) never leaves a record Pending: what was in flight may have
    happened. Once no Attempt of the Run may still write, its Pending SideEffects are marked Unknown."""
    phase = w.run.status.phase
    if phase not in (RunPhase.CANCELLED, RunPhase.FAILED) or live_attempts(w):
        return NOTHING
    failed = phase == RunPhase.FAILED
    settled = ledger.settle_after_cancel(w.side_effects, rfc3339(w.now), MAX_HISTORY, failed=failed)
    return writes(*(PatchSideEffectStatus(effect, patch, version) for effect, patch, version in settled))


def live_attempts(world: World) -> bool:
    """Whether an Attempt of the Run may still write (not finished, or its Pod not yet gone)."""
    for attempt in world.attempts.values():
        pod = world.pods.get(str(attempt.metadata.name))
        if attempt.status.phase not in FINISHED_ATTEMPT_PHASES or (pod is not None and not pod.finished):
            return True
    return False


def drop_ended_request(w: World) -> Transition:
    """An ended Run (Succeeded, Failed, Cancelled) still holding a pending request (one written before
    a phase change cleared it) drops it: it waits for nobody."""
    if w.run.status.phase in TERMINAL_PHASES and w.run.status.pending_request is not None:
        return writes(PatchRunStatus({"pendingRequest": None}))
    return NOTHING


def refresh_report(w: World) -> Transition:
    """A stopped Run keeps its report in step with its SideEffects (e.g. one resolved by a person)."""
    status = w.run.status
    counts = report.side_effect_counts(w.side_effects)
    current = status.side_effects.to_api() if status.side_effects else None
    listed = report.run_report(w.side_effects)
    # Compared as stored (normalised by the model): a Pending record marked Unknown changes no count.
    stored = status.report
    stale = stored is not None and stored.to_api() != RunReport.model_validate(listed).to_api()
    if current != counts or stale:
        return writes(PatchRunStatus({"sideEffects": counts, "report": listed}))
    return NOTHING
