"""Watching the current Attempt of a Running Run (the Running sub-table): its Pod starts, holds a
request, ends, or loses its lease; and how the Run moves on from an Attempt's end."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, Final

from agentrun.api import (
    Attempt,
    AttemptFailure,
    AttemptPhase,
    FailureClass,
    PendingRequest,
    RunPhase,
)
from agentrun.core import failures
from agentrun.core.plan import DeletePod, PatchRunStatus
from agentrun.core.pods import PodView
from agentrun.core.runs.chain import Rule, SubTable
from agentrun.core.runs.failures import after_failure
from agentrun.core.runs.following import Following, seen_running
from agentrun.core.runs.following import live_pod as _live_pod
from agentrun.core.runs.grants import reads_refs
from agentrun.core.runs.promises import create_promised
from agentrun.core.runs.stopping import finish_lost, lease_lost, revoked
from agentrun.core.runs.transition import (
    NOTHING,
    Transition,
    event,
    finish_attempt,
    set_phase,
    wake_in,
    writes,
)
from agentrun.core.runs.world import World, rfc3339

# The reason on an Attempt stopped for running past spec.attemptTimeoutSeconds.
ATTEMPT_TIMEOUT: Final = "AttemptTimeout"

# ---- the Running sub-table: one row per situation of the current Attempt, tried in order ---------------


class RunningFollowing(Following):
    """How the Running phase follows its Attempt: nothing comes before a row's writes; an Attempt's end
    moves the Run on as its retry policy says (after_attempt); a lease that ran out is taken over
    (take_over); a live Attempt is looked at again when its attemptTimeoutSeconds falls due."""

    def promised(self, w: World) -> tuple[Attempt, Transition]:
        return create_promised(w, w.run.status.current_attempt or 0)

    def end(
        self, w: World, attempt: Attempt, phase: AttemptPhase, failure: AttemptFailure | None
    ) -> Transition:
        return finish_attempt(w, attempt, phase, failure).then(
            after_attempt(w, attempt, failure, phase=phase)
        )

    def concluded(self, w: World, attempt: Attempt, pod: PodView) -> Transition:
        return conclude(w, attempt, pod)

    def taken_over(self, w: World, attempt: Attempt, pod: PodView) -> Transition:
        return take_over(w, attempt, pod, lease_lost(w))

    def ended(self, w: World, attempt: Attempt) -> Transition:
        return after_attempt(w, attempt, attempt.status.failure)

    def wakes(self, w: World, attempt: Attempt, pod: PodView) -> Transition:
        due = timeout_due(w, attempt, pod)
        return NOTHING if due is None else wake_in((due - w.now).total_seconds())


# The rows the Running sub-table shares with the Compensating one (core.runs.following).
FOLLOWING: Final = RunningFollowing()
attempt_promised, pod_refused, pod_not_created = (
    FOLLOWING.attempt_promised,
    FOLLOWING.pod_refused,
    FOLLOWING.pod_not_created,
)
pod_lost, pod_ended, lease_expired = FOLLOWING.pod_lost, FOLLOWING.pod_ended, FOLLOWING.lease_expired
live, attempt_ended = FOLLOWING.live, FOLLOWING.attempt_ended


def holding(w: World) -> Transition | None:
    """Its Pod runs and holds the pending request (hold_seconds) -> the Run waits, the Attempt lives on."""
    live = _live_pod(w)
    pending = w.run.status.pending_request
    if live is None or pending is None or pending.held_by != live[0].metadata.name:
        return None
    name = str(live[0].metadata.name)
    message = f"waiting for request {pending.request_id} ({pending.reason.value}); {name} holds it"
    return seen_running(w, *live).then(
        set_phase(waiting_phase(pending), waiting_phase(pending).value, message, **expiry(w, pending)),
        event("Normal", "Holding", message, name),
    )


def revoked_unfinished(w: World) -> Transition | None:
    """Its Lease revoked (nobody holds it, a newer epoch) but the Run not written -> the takeover finished."""
    live, lease = _live_pod(w), w.lease
    if live is None or lease is None or lease.holder is not None or lease.epoch <= live[0].spec.lease_epoch:
        return None
    return seen_running(w, *live).then(take_over(w, live[0], live[1], lease_lost(w)))


def timed_out(w: World) -> Transition | None:
    """Its agent has run spec.attemptTimeoutSeconds (from its startTime) -> stopped: the Lease revoked,
    the Attempt Failed (infrastructure, AttemptTimeout), its Pod deleted (grace, then kill); the retry
    policy decides."""
    live = _live_pod(w)
    if live is None or (due := timeout_due(w, live[0])) is None or w.now < due:
        return None
    attempt, pod = live
    limit = w.run.spec.attempt_timeout_seconds
    elapsed = int((w.now - due).total_seconds()) + (limit or 0)
    failure = failures.failure(
        FailureClass.INFRASTRUCTURE,
        f"the Attempt ran {elapsed}s, past its attemptTimeoutSeconds of {limit}s",
    ).model_copy(update={"reason": ATTEMPT_TIMEOUT})
    return stop_attempt(w, attempt, pod, failure)


def not_starting(w: World) -> Transition | None:
    """Its Pod's containers are kept from starting (an image that cannot be pulled, a Secret or ConfigMap
    missing) -> at once for an image that can never be pulled, else once spec.startTimeoutSeconds have
    passed since the Pod's creation: stopped as a timed-out Attempt is, and Failed (deterministic, with a
    reason naming what is missing: not retried); until then, look again when that bound runs out."""
    live = _live_pod(w)
    if live is None or (waiting := live[1].waiting) is None:
        return None
    attempt, pod = live
    limit = w.run.spec.start_timeout_seconds
    created = datetime.fromisoformat(pod.created) if pod.created else w.now
    waited = max((w.now - created).total_seconds(), 0.0)
    if (failure := failures.start_failure(waiting, waited, limit)) is None:
        return wake_in(limit - waited + 0.05)
    return stop_attempt(w, attempt, pod, failure)


def lost_unfinished(w: World) -> Transition | None:
    """Recorded LeaseLost, and the operator stopped before the takeover -> the takeover finished first."""
    attempt = w.current
    if attempt is None or attempt.status.phase != AttemptPhase.LEASE_LOST or w.lease is None:
        return None
    return take_over(w, attempt, w.current_pod, attempt.status.failure or lease_lost(w))


def timeout_due(w: World, attempt: Attempt, pod: PodView | None = None) -> datetime | None:
    """When the Attempt's spec.attemptTimeoutSeconds runs out: counted from its agent's start (recorded,
    or seen on its Pod now), so scheduling and image pulls do not count; None without a limit or a
    start."""
    limit = w.run.spec.attempt_timeout_seconds
    started = attempt.status.start_time
    if started is None and pod is not None and pod.running_since:
        started = datetime.fromisoformat(pod.running_since)
    if not limit or started is None:
        return None
    return started + timedelta(seconds=limit)


def stop_attempt(w: World, attempt: Attempt, pod: PodView, failure: AttemptFailure) -> Transition:
    """An Attempt the operator stops (timed out, or its Pod unable to start), as a takeover (take_over):
    the Lease revoked and the Run written first, so a commit that raced it either came first (and stands)
    or is refused; then the Pod stopped with its grace period (the agent may still be alive enough to stop
    cleanly) and the Attempt marked Failed."""
    epoch, revoke = revoked(w)
    stop = NOTHING if pod.finished or pod.deleting else writes(DeletePod(pod.name))
    return revoke.then(
        after_failure(w, attempt.spec.number, failure, AttemptPhase.FAILED, leaseEpoch=epoch),
        stop,
        finish_attempt(w, attempt, AttemptPhase.FAILED, failure),
    )


RUNNING: Final = SubTable(
    (
        Rule("AttemptPromised", attempt_promised),
        Rule("PodRefused", pod_refused),
        Rule("PodNotCreated", pod_not_created),
        Rule("PodLost", pod_lost),
        Rule("PodEnded", pod_ended),
        Rule("Holding", holding),
        Rule("RevokedUnfinished", revoked_unfinished),
        Rule("LeaseExpired", lease_expired),
        Rule("TimedOut", timed_out),
        Rule("NotStarting", not_starting),
        Rule("Live", live),
        Rule("LostUnfinished", lost_unfinished),
        Rule("AttemptEnded", attempt_ended),
    )
)


# ---- how the Run moves on from an Attempt -------------------------------------------------------------


def take_over(w: World, attempt: Attempt, pod: PodView | None, failure: AttemptFailure) -> Transition:
    """The Attempt lost its lease. Take the lease over now, not at the next grant: a frozen worker that
    wakes up during the backoff must already find its epoch stale. The Run's status write (the new
    epoch, preconditioned) is the point that decides between the takeover and a commit racing it: the
    Attempt is marked LeaseLost only after it, so an Attempt whose commit came first is never recorded
    as having lost. Then its Pod is stopped (a takeover interrupted after the Run's write is finished
    by the backoff)."""
    epoch, revoke = revoked(w)
    return revoke.then(
        after_failure(w, attempt.spec.number, failure, AttemptPhase.LEASE_LOST, leaseEpoch=epoch),
        finish_lost(w, attempt, pod, failure),
    )


def conclude(w: World, attempt: Attempt, pod: PodView) -> Transition:
    """The agent container ended: what did the Attempt achieve?"""
    status, name = w.run.status, str(attempt.metadata.name)
    end = container_end(pod)
    failure = failures.classify_exit(end)
    # it stopped on its own, no SDK reported why, and none stated that it reads references
    if (
        failure is not None
        and attempt.spec.state_in_store
        and not reads_refs(attempt)
        and failures.unreported_crash(end, failure)
    ):
        failure = failures.sdk_too_old(failure)
    # a Run that is cancelled never gets here (CancelAsked comes first): a Pod stopped from outside
    if failure is not None and failure.failure_class == FailureClass.CANCELLED:
        failure = failures.stopped_from_outside(failure)
    if failure is None:
        if status.committed_by is not None and status.committed_by.attempt == name:
            return finish_attempt(w, attempt, AttemptPhase.SUCCEEDED, None).then(
                after_attempt(w, attempt, None, phase=AttemptPhase.SUCCEEDED)
            )
        if status.pending_request is not None:
            return finish_attempt(w, attempt, AttemptPhase.INTERRUPTED, None).then(
                after_attempt(w, attempt, None, phase=AttemptPhase.INTERRUPTED)
            )
        failure = failures.failure(
            FailureClass.DETERMINISTIC,
            "the agent exited 0 without committing a result or an input request (use agentrun.worker)",
            0,
        )
    return finish_attempt(w, attempt, AttemptPhase.FAILED, failure).then(
        after_failure(w, attempt.spec.number, failure, AttemptPhase.FAILED)
    )


def container_end(pod: PodView) -> failures.ContainerExit:
    assert pod.exit is not None or pod.phase in ("Succeeded", "Failed")
    return pod.exit or failures.ContainerExit(exit_code=0 if pod.phase == "Succeeded" else 1)


def after_attempt(
    w: World, attempt: Attempt, failure: AttemptFailure | None, phase: AttemptPhase | None = None
) -> Transition:
    """Moves the Run on from an Attempt whose end is already recorded (or being recorded now)."""
    phase = phase or attempt.status.phase
    name = str(attempt.metadata.name)
    if phase == AttemptPhase.SUCCEEDED:
        # No Event: a success asks nothing of a person, and the Run's phase, its Succeeded condition and
        # committedBy say it (an Event per Run would be an API request per Run for nobody).
        return set_phase(RunPhase.SUCCEEDED, "Succeeded", f"{name} committed the result")
    if phase == AttemptPhase.INTERRUPTED:
        request = w.run.status.pending_request
        assert request is not None
        waiting = waiting_phase(request)
        message = f"waiting for request {request.request_id} ({request.reason.value})"
        return set_phase(waiting, waiting.value, message, **expiry(w, request)).then(
            event("Normal", "Interrupted", message, name)
        )
    if failure is not None:
        return after_failure(w, attempt.spec.number, failure, phase or AttemptPhase.FAILED)
    return after_failure(w, attempt.spec.number, failures.pod_lost(), AttemptPhase.FAILED)


def waiting_phase(request: PendingRequest) -> RunPhase:
    return {
        "input_required": RunPhase.INPUT_REQUIRED,
        "auth_required": RunPhase.AUTH_REQUIRED,
        "paused": RunPhase.PAUSED,
    }[request.reason.value]


def expiry(w: World, request: PendingRequest) -> dict[str, Any]:
    """The request's expiresAt, on the operator's clock, from the expiresInSeconds its worker asked for
    (a worker's clock may be off by any amount: expiry is judged on the operator's own, docs/runs.md)."""
    if request.expires_in_seconds is None or request.expires_at is not None:
        return {}
    expires_at = w.now + timedelta(seconds=request.expires_in_seconds)
    return {"pendingRequest": {"expiresAt": rfc3339(expires_at)}}


# ---- a waiting Run whose Attempt is still alive -------------------------------------------------------


def hold_expired(w: World, attempt: Attempt) -> bool:
    """The Attempt holds the Lease and it ran out."""
    name = str(attempt.metadata.name)
    lease = w.lease
    return (
        lease is not None
        and lease.holder == name
        and w.lease_expires_in is not None
        and w.lease_expires_in <= 0
    )


def end_of_hold(w: World, attempt: Attempt, pod: PodView | None) -> Transition:
    """The Attempt that held the request ended (or its lease ran out): recorded now; the request stands,
    so the Run keeps waiting for its answer, which then starts a new Attempt."""
    pending, name = w.run.status.pending_request, str(attempt.metadata.name)
    t = NOTHING
    if pending is not None and pending.held_by == name:  # the hold ends with its Attempt
        t = t.then(PatchRunStatus({"pendingRequest": {"heldBy": None}}))
    if hold_expired(w, attempt):
        if pod is not None and not pod.finished:
            t = t.then(DeletePod(pod.name, grace_seconds=0))
        return t.then(finish_attempt(w, attempt, AttemptPhase.LEASE_LOST, lease_lost(w)))
    if pod is None:
        return t.then(finish_attempt(w, attempt, AttemptPhase.FAILED, failures.pod_lost()))
    failure = failures.classify_exit(container_end(pod))
    phase = AttemptPhase.INTERRUPTED if failure is None else AttemptPhase.FAILED
    return t.then(finish_attempt(w, attempt, phase, failure))
