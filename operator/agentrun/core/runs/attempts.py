"""Watching the current Attempt: its Pod starts, holds a request, ends, or loses its lease."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from agentrun.api import (
    Attempt,
    AttemptFailure,
    AttemptPhase,
    FailureClass,
    PendingRequest,
    RunPhase,
)
from agentrun.core import failures
from agentrun.core.plan import DeletePod, PatchAttemptStatus, PatchRunStatus
from agentrun.core.pods import PodView
from agentrun.core.runs.builder import Builder
from agentrun.core.runs.failing import after_failure
from agentrun.core.runs.promises import create_promised
from agentrun.core.runs.stopping import finish_lost, lease_lost, revoke_lease
from agentrun.core.runs.world import RECHECK_SECONDS, World, rfc3339


def supervise(b: Builder, number: int, attempt: Attempt | None, pod: PodView | None) -> None:
    """A Running Run: follow its current Attempt `number` (seen as `attempt`, run by `pod`)."""
    if attempt is None:
        b.ensure_pod(create_promised(b, number))
    elif attempt.status.phase in (AttemptPhase.PENDING, AttemptPhase.RUNNING, None):
        if pod is None:
            _pod_missing(b, attempt)
        elif pod.finished:
            conclude(b, attempt, pod)
        else:
            _watch_live(b, attempt, pod)
    elif attempt.status.phase == AttemptPhase.LEASE_LOST and b.w.lease is not None:
        # The loss was recorded and the operator stopped before the takeover: finish it first.
        take_over(b, attempt, pod, attempt.status.failure or lease_lost(b))
    else:
        after_attempt(b, attempt, attempt.status.failure)


def _pod_missing(b: Builder, attempt: Attempt) -> None:
    if attempt.status.start_time is None:
        b.ensure_pod(attempt)  # not created yet, or not in the cache yet: creating is idempotent
        return
    failure = failures.pod_lost()
    b.finish_attempt(attempt, AttemptPhase.FAILED, failure)
    after_failure(b, attempt.spec.number, failure, AttemptPhase.FAILED)


def _watch_live(b: Builder, attempt: Attempt, pod: PodView) -> None:
    w, name = b.w, str(attempt.metadata.name)
    if pod.running_since and attempt.status.phase != AttemptPhase.RUNNING:
        started = {"phase": "Running", "startTime": pod.running_since, "podName": pod.name}
        started["traceId"] = b.trace_id
        b.plan.add(PatchAttemptStatus(name, started, attempt.metadata.resource_version))
    pending = b.status.pending_request
    if pending is not None and pending.held_by == name:
        # The worker saved its request and holds it (hold_seconds): the Run waits, the Attempt lives on.
        message = f"waiting for request {pending.request_id} ({pending.reason.value}); {name} holds it"
        b.set_phase(waiting_phase(pending), waiting_phase(pending).value, message, **expiry(b, pending))
        b.event("Normal", "Holding", message, name)
        return
    lease = w.lease
    if lease is not None and lease.holder is None and lease.epoch > attempt.spec.lease_epoch:
        # Revoked, and the operator stopped before writing the Run: finish the takeover.
        take_over(b, attempt, pod, lease_lost(b))
        return
    holds_lease = lease is not None and lease.holder == name and lease.epoch == attempt.spec.lease_epoch
    if not holds_lease or w.lease_expires_in is None or not pod.running_since:
        # The lease is judged once the agent runs: image pulls and scheduling do not count against it.
        b.plan.wake_in(RECHECK_SECONDS)
    elif w.lease_expires_in <= 0:
        take_over(b, attempt, pod, lease_lost(b))
    else:
        b.plan.wake_at_lease_expiry(w.lease_expires_in + 0.05)


def take_over(b: Builder, attempt: Attempt, pod: PodView | None, failure: AttemptFailure) -> None:
    """The Attempt lost its lease. Take the lease over now, not at the next grant: a frozen worker that
    wakes up during the backoff must already find its epoch stale. The Run's status write (the new
    epoch, preconditioned) is the point that decides between the takeover and a commit racing it: the
    Attempt is marked LeaseLost only after it, so an Attempt whose commit came first is never recorded
    as having lost. Then its Pod is stopped (a takeover interrupted after the Run's write is finished
    by the backoff)."""
    epoch = revoke_lease(b)
    after_failure(b, attempt.spec.number, failure, AttemptPhase.LEASE_LOST, leaseEpoch=epoch)
    finish_lost(b, attempt, pod, failure)


def conclude(b: Builder, attempt: Attempt, pod: PodView) -> None:
    """The agent container ended: what did the Attempt achieve?"""
    status, name = b.status, str(attempt.metadata.name)
    failure = failures.classify_exit(container_end(pod))
    if failure is None:
        if status.committed_by is not None and status.committed_by.attempt == name:
            b.finish_attempt(attempt, AttemptPhase.SUCCEEDED, None)
            after_attempt(b, attempt, None, phase=AttemptPhase.SUCCEEDED)
            return
        if status.pending_request is not None:
            b.finish_attempt(attempt, AttemptPhase.INTERRUPTED, None)
            after_attempt(b, attempt, None, phase=AttemptPhase.INTERRUPTED)
            return
        failure = failures.failure(
            FailureClass.DETERMINISTIC,
            "the agent exited 0 without committing a result or an input request (use agentrun.worker)",
            0,
        )
    b.finish_attempt(attempt, AttemptPhase.FAILED, failure)
    after_failure(b, attempt.spec.number, failure, AttemptPhase.FAILED)


def container_end(pod: PodView) -> failures.ContainerExit:
    assert pod.exit is not None or pod.phase in ("Succeeded", "Failed")
    return pod.exit or failures.ContainerExit(exit_code=0 if pod.phase == "Succeeded" else 1)


def after_attempt(
    b: Builder, attempt: Attempt, failure: AttemptFailure | None, phase: AttemptPhase | None = None
) -> None:
    """Moves the Run on from an Attempt whose end is already recorded (or being recorded now)."""
    phase = phase or attempt.status.phase
    name = str(attempt.metadata.name)
    if phase == AttemptPhase.SUCCEEDED:
        # No Event: a success asks nothing of a person, and the Run's phase, its Succeeded condition and
        # committedBy say it (an Event per Run would be an API request per Run for nobody).
        b.set_phase(RunPhase.SUCCEEDED, "Succeeded", f"{name} committed the result")
    elif phase == AttemptPhase.INTERRUPTED:
        request = b.status.pending_request
        assert request is not None
        waiting = waiting_phase(request)
        message = f"waiting for request {request.request_id} ({request.reason.value})"
        b.set_phase(waiting, waiting.value, message, **expiry(b, request))
        b.event("Normal", "Interrupted", message, name)
    elif failure is not None:
        after_failure(b, attempt.spec.number, failure, phase or AttemptPhase.FAILED)
    else:
        after_failure(b, attempt.spec.number, failures.pod_lost(), AttemptPhase.FAILED)


def waiting_phase(request: PendingRequest) -> RunPhase:
    return {
        "input_required": RunPhase.INPUT_REQUIRED,
        "auth_required": RunPhase.AUTH_REQUIRED,
        "paused": RunPhase.PAUSED,
    }[request.reason.value]


def expiry(b: Builder, request: PendingRequest) -> dict[str, Any]:
    """The request's expiresAt, on the operator's clock, from the expiresInSeconds its worker asked for
    (a worker's clock may be off by any amount; DESIGN: expiry is judged on the operator's own clock)."""
    if request.expires_in_seconds is None or request.expires_at is not None:
        return {}
    expires_at = b.w.now + timedelta(seconds=request.expires_in_seconds)
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


def end_of_hold(b: Builder, attempt: Attempt, pod: PodView | None) -> None:
    """The Attempt that held the request ended (or its lease ran out): recorded now; the request stands,
    so the Run keeps waiting for its answer, which then starts a new Attempt."""
    pending, name = b.status.pending_request, str(attempt.metadata.name)
    if pending is not None and pending.held_by == name:  # the hold ends with its Attempt
        b.plan.add(PatchRunStatus({"pendingRequest": {"heldBy": None}}))
    if hold_expired(b.w, attempt):
        if pod is not None and not pod.finished:
            b.plan.add(DeletePod(pod.name, grace_seconds=0))
        b.finish_attempt(attempt, AttemptPhase.LEASE_LOST, lease_lost(b))
    elif pod is None:
        b.finish_attempt(attempt, AttemptPhase.FAILED, failures.pod_lost())
    else:
        failure = failures.classify_exit(container_end(pod))
        phase = AttemptPhase.INTERRUPTED if failure is None else AttemptPhase.FAILED
        b.finish_attempt(attempt, phase, failure)
