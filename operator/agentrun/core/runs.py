"""The Run state machine: from what the operator observes now to the writes that move the Run on.

`decide(world)` is a pure function. It is level-based: it looks only at the current objects, never at
what happened in memory before, so an operator restart at any line simply calls it again. Every write
it asks for is idempotent (deterministic names) or preconditioned (resourceVersion), and each write
sequence is ordered so that a crash between two writes leaves a state this function continues from.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from agentrun.api import (
    RUN_LABEL,
    Attempt,
    AttemptFailure,
    AttemptPhase,
    AttemptReason,
    Checkpoint,
    ControlOp,
    ControlOutcome,
    FailureClass,
    Run,
    RunPhase,
    SideEffect,
    attempt_name,
)
from agentrun.core import controls, failures, report, retention
from agentrun.core.conditions import TERMINAL_PHASES, conditions_for
from agentrun.core.lease import LeaseView, epoch_for_grant
from agentrun.core.plan import (
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
from agentrun.core.pods import PodView, attempt_pod, owner_reference
from agentrun.core.retry import decide_retry

FINISHED_ATTEMPT = frozenset(
    {
        AttemptPhase.SUCCEEDED,
        AttemptPhase.FAILED,
        AttemptPhase.INTERRUPTED,
        AttemptPhase.ABORTED,
        AttemptPhase.LEASE_LOST,
        AttemptPhase.REJECTED,
    }
)
# Without a sighting of the Lease yet (operator just started), look again this soon.
RECHECK_SECONDS = 5.0


@dataclass(frozen=True)
class World:
    """Everything the decision needs, as observed now."""

    run: Run
    attempts: Mapping[int, Attempt]
    pods: Mapping[str, PodView]
    lease: LeaseView | None
    now: datetime
    # Seconds before the current holder's lease expires on the operator's clock (<= 0: expired),
    # None while the operator has not seen the Lease yet.
    lease_expires_in: float | None = None
    side_effects: Sequence[SideEffect] = ()
    checkpoints: Sequence[Checkpoint] = ()

    def failure_of(self, number: int) -> AttemptFailure | None:
        attempt = self.attempts.get(number)
        return attempt.status.failure if attempt else None


def rfc3339(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


class _Decision:
    """Builds one Plan; helpers for the status patch every transition writes."""

    def __init__(self, world: World) -> None:
        self.w = world
        self.run = world.run
        self.status = world.run.status
        self.plan = Plan()

    # ---- writes --------------------------------------------------------------------------------------

    def set_phase(self, phase: RunPhase, reason: str, message: str, **fields: Any) -> None:
        patch: dict[str, Any] = {
            "phase": phase.value,
            "message": message[:1024],
            "observedGeneration": self.run.metadata.generation,
            "conditions": conditions_for(
                phase,
                reason,
                message,
                generation=self.run.metadata.generation,
                previous=self.status.conditions,
                now=self.w.now,
            ),
            "sideEffects": report.side_effect_counts(self.w.side_effects),
            **fields,
        }
        if phase in TERMINAL_PHASES or phase == RunPhase.NEEDS_RECONCILIATION:
            patch["report"] = report.run_report(self.w.side_effects)
        self.plan.add(PatchRunStatus(patch))

    def record_control(self, record: dict[str, Any]) -> None:
        """A refused (or merely noted) control request: recorded, and nothing else changes."""
        patch = {
            "controls": controls.with_record(self.run, record),
            "observedGeneration": self.run.metadata.generation,
        }
        self.plan.add(PatchRunStatus(patch))

    def event(self, type_: str, reason: str, message: str, attempt: str | None = None) -> None:
        assert type_ in ("Normal", "Warning")
        self.plan.add(RecordEvent(type_, reason, message, attempt))  # type: ignore[arg-type]

    def finish_attempt(self, attempt: Attempt, phase: AttemptPhase, failure: AttemptFailure | None) -> None:
        if attempt.status.phase in FINISHED_ATTEMPT:
            return  # history is never rewritten
        patch: dict[str, Any] = {"phase": phase.value, "completionTime": rfc3339(self.w.now)}
        if failure is not None:
            patch["failure"] = failure.to_api()
        self.plan.add(PatchAttemptStatus(str(attempt.metadata.name), patch))

    # ---- transitions ---------------------------------------------------------------------------------

    def grant(self, number: int, reason: str, input_value: Any = None, **status_fields: Any) -> None:
        """Lease to the new Attempt, then Run.status.leaseEpoch, then the Attempt, then its Pod."""
        run = self.run
        name = attempt_name(str(run.metadata.name), number)
        epoch, write = epoch_for_grant(self.w.lease, name)
        if write:
            rv = self.w.lease.resource_version if self.w.lease else None
            self.plan.add(WriteLease(name, epoch, run.spec.lease.duration_seconds, rv))
        message = f"Attempt {number} ({reason}) holds lease epoch {epoch}"
        self.set_phase(
            RunPhase.RUNNING,
            "AttemptRunning",
            message,
            currentAttempt=number,
            attempts=max(number, self.status.attempts or 0),
            leaseEpoch=epoch,
            observedCancelEpoch=run.spec.cancel_epoch,
            nextAttemptTime=None,
            **status_fields,
        )
        attempt = self.attempt_object(number, epoch, reason, input_value)
        self.plan.add(CreateAttempt(attempt.to_api()))
        self.ensure_pod(attempt)
        self.event("Normal", "AttemptStarted", message, name)

    def attempt_object(self, number: int, epoch: int, reason: str, input_value: Any) -> Attempt:
        run = self.run
        name = attempt_name(str(run.metadata.name), number)
        spec: dict[str, Any] = {
            "runName": run.metadata.name,
            "number": number,
            "leaseEpoch": epoch,
            "cancelEpoch": run.spec.cancel_epoch,
            "reason": reason,
        }
        if self.status.latest_checkpoint:
            spec["resumeFrom"] = self.status.latest_checkpoint
        if input_value is not None:
            spec["input"] = input_value
        return Attempt.model_validate(
            {
                "metadata": {
                    "name": name,
                    "namespace": run.metadata.namespace,
                    "labels": {RUN_LABEL: run.metadata.name},
                    "ownerReferences": [owner_reference(run, controller=True)],
                },
                "spec": spec,
            }
        )

    def ensure_pod(self, attempt: Attempt) -> None:
        # The Pod is owned by the Attempt too; an Attempt about to be created has no uid yet, so the
        # I/O layer fills in the uid the create returned (it is the same object either way).
        self.plan.add(CreatePod(attempt_pod(self.run, attempt)))
        if attempt.status.phase is None:
            self.plan.add(
                PatchAttemptStatus(
                    str(attempt.metadata.name), {"phase": "Pending", "podName": attempt.metadata.name}
                )
            )

    def after_failure(self, number: int, failure: AttemptFailure, phase: AttemptPhase, **fields: Any) -> None:
        """The current Attempt failed: back off and retry, or fail the Run."""
        history = [*(self.w.failure_of(n) for n in range(1, number)), failure]
        decision = decide_retry(
            self.run.spec.retry, self.attempts_in_series(number), history, seed=str(self.run.metadata.uid)
        )
        name = attempt_name(str(self.run.metadata.name), number)
        self.event("Warning", "AttemptFailed", f"{failure.failure_class}: {failure.message}", name)
        if failure.failure_class == FailureClass.UNKNOWN_SIDE_EFFECT:
            # Never retried automatically: a retry could repeat an action that may have happened.
            message = f"{failure.message}; resolve the SideEffect, then ask for a retry (spec.retryRequest)"
            self.set_phase(
                RunPhase.NEEDS_RECONCILIATION,
                "UnknownSideEffect",
                message,
                failure={
                    "class": failure.failure_class.value,
                    "reason": "UnknownSideEffect",
                    "message": (failure.message or "")[:1024],
                    "fingerprint": failure.fingerprint,
                },
                **fields,
            )
            self.event("Warning", "NeedsReconciliation", message)
            return
        if decision.retry:
            at = self.w.now + timedelta(seconds=decision.delay_seconds)
            if at.microsecond:  # status holds whole seconds: round up, so the retry never starts early
                at = at.replace(microsecond=0) + timedelta(seconds=1)
            self.set_phase(
                RunPhase.RETRY_BACKOFF,
                "RetryScheduled",
                f"Attempt {number} ended {phase.value} ({failure.failure_class}: {failure.message}); "
                f"Attempt {number + 1} starts at {rfc3339(at)}",
                nextAttemptTime=rfc3339(at),
                **fields,
            )
            self.event("Normal", "RetryScheduled", decision.message)
            self.plan.wake_in((at - self.w.now).total_seconds())
            return
        self.set_phase(
            RunPhase.FAILED,
            decision.reason,
            f"{decision.message}; last failure: {failure.message}",
            failure={
                "class": failure.failure_class.value,
                "reason": decision.reason,
                "message": (failure.message or "")[:1024],
                "fingerprint": failure.fingerprint,
            },
            **fields,
        )
        self.event("Warning", decision.reason, decision.message)

    def attempts_in_series(self, number: int) -> int:
        """Attempts counted against spec.retry.maxAttempts: those since the Run last started afresh
        (its first Attempt, a resume, a manual retry), so answering a question renews the budget."""
        fresh = (AttemptReason.INITIAL, AttemptReason.MANUAL_RETRY)
        first = 1
        for n in range(number, 0, -1):
            attempt = self.w.attempts.get(n)
            if attempt is not None and (
                attempt.spec.reason in fresh or attempt.spec.reason.startswith("resume:")
            ):
                first = n
                break
        return number - first + 1


def decide(world: World) -> Plan:
    d = _Decision(world)
    run, status, spec = world.run, world.run.status, world.run.spec
    if run.metadata.deletion_timestamp is not None:
        return d.plan  # the garbage collector removes what the Run owns
    phase = status.phase
    if phase is None:
        d.set_phase(
            RunPhase.QUEUED,
            "Queued",
            "Waiting for its first Attempt",
            attempts=0,
            leaseEpoch=0,
            observedCancelEpoch=spec.cancel_epoch,
        )
        d.event("Normal", "Queued", "Run accepted; starting Attempt 1")
        return d.plan.wake_in(0)
    _prune_checkpoints(d)
    current = status.current_attempt
    attempt = world.attempts.get(current) if current else None
    pod = world.pods.get(str(attempt.metadata.name)) if attempt else None

    committed_by = status.committed_by
    if (
        attempt is not None
        and committed_by is not None
        and committed_by.attempt == attempt.metadata.name
        and phase in (RunPhase.RUNNING, RunPhase.CANCEL_REQUESTED)
    ):
        # The commit passed the fence, so it came before any cancel or deadline: it stands.
        d.finish_attempt(attempt, AttemptPhase.SUCCEEDED, None)
        _after_attempt(d, attempt, None, phase=AttemptPhase.SUCCEEDED)
        if spec.cancel_epoch > committed_by.cancel_epoch:
            d.event("Normal", "CancelTooLate", "the result was committed before the cancel arrived")
        return d.plan
    cancelable = phase not in (RunPhase.SUCCEEDED, RunPhase.CANCELLED, RunPhase.CANCEL_REQUESTED)
    if cancelable and spec.cancel_epoch > (status.observed_cancel_epoch or 0):
        _cancel(d, attempt, pod)
        return d.plan
    stopped = phase in TERMINAL_PHASES or phase == RunPhase.NEEDS_RECONCILIATION
    if not stopped and _deadline_passed(world):
        _stop_for_deadline(d, attempt, pod)
        return d.plan
    if _control_requests(d, current or 0):
        return d.plan
    if stopped:
        _refresh_report(d)
        return d.plan  # only a manual retry (spec.retryRequest) moves a Failed Run on

    if phase in controls.WAITING and status.pending_request and status.pending_request.expires_at:
        expires_at = status.pending_request.expires_at
        if world.now >= expires_at:
            _input_expired(d)
            return d.plan
        d.plan.wake_in((expires_at - world.now).total_seconds())

    if phase == RunPhase.QUEUED:
        d.grant(1, AttemptReason.INITIAL)
    elif phase == RunPhase.RETRY_BACKOFF:
        due = status.next_attempt_time
        if due is None or world.now >= due:
            number = (current or 0) + 1
            d.grant(number, _reason_after(world.attempts.get(number - 1), world))
        else:
            d.plan.wake_in((due - world.now).total_seconds())
    elif phase == RunPhase.RUNNING and current:
        _supervise(d, current, attempt, pod)
    elif phase == RunPhase.CANCEL_REQUESTED:
        _finish_cancel(d, attempt, pod)
    if spec.deadline_seconds and run.metadata.creation_timestamp and phase not in TERMINAL_PHASES:
        deadline = run.metadata.creation_timestamp + timedelta(seconds=spec.deadline_seconds)
        d.plan.wake_in((deadline - world.now).total_seconds())
    return d.plan


def _control_requests(d: _Decision, current: int) -> bool:
    """Judges the control requests not processed yet (one record per idempotency key); True when one
    was, so the Run waits for that write before anything else happens."""
    run, spec = d.run, d.run.spec
    if spec.retry_request is not None and controls.processed(run, spec.retry_request.idempotency_key) is None:
        _manual_retry(d, current)
        return True
    pause = spec.pause
    if pause is not None and controls.processed(run, pause.request_id) is None:
        verdict = controls.judge_pause(run)
        if verdict is not None:
            d.record_control(
                controls.control_record(
                    ControlOp.PAUSE, pause.request_id, controls.pause_digest(run), verdict, d.w.now
                )
            )
            if not verdict.accepted:
                d.event("Warning", "PauseRejected", f"{verdict.reason}: {verdict.message}")
            return True
    if spec.resume is not None and controls.processed(run, spec.resume.idempotency_key) is None:
        _resume(d, current)
        return True
    return False


def _resume(d: _Decision, current: int) -> None:
    run, now = d.run, d.w.now
    resume = run.spec.resume
    assert resume is not None
    verdict = controls.judge_resume(run, now)
    record = controls.control_record(
        ControlOp.RESUME, resume.idempotency_key, controls.resume_digest(resume), verdict, now
    )
    if not verdict.accepted:
        d.record_control(record)
        d.event("Warning", "ResumeRejected", f"{verdict.reason}: {verdict.message}")
        return
    d.event("Normal", "ResumeAccepted", verdict.message)
    d.grant(
        current + 1,
        AttemptReason.resume(resume.request_id),
        resume.value,
        controls=controls.with_record(run, record),
        inputs=controls.with_input(run, resume, now),
        pendingRequest=None,
    )


def _manual_retry(d: _Decision, current: int) -> None:
    run, now = d.run, d.w.now
    request = run.spec.retry_request
    assert request is not None
    verdict = controls.judge_retry(
        run,
        {c.spec.id for c in d.w.checkpoints},
        [str(e.metadata.name) for e in report.unresolved(d.w.side_effects)],
    )
    record = controls.control_record(
        ControlOp.RETRY, request.idempotency_key, controls.retry_digest(run), verdict, now
    )
    if not verdict.accepted:
        d.record_control(record)
        d.event("Warning", "RetryRejected", f"{verdict.reason}: {verdict.message}")
        return
    d.event("Normal", "ManualRetry", verdict.message)
    # A request left over from before (one that expired, or a deadline while waiting) is not the new
    # Attempt's: were it kept, that Attempt ending without a result would pass for an interrupt.
    fields: dict[str, Any] = {
        "controls": controls.with_record(run, record),
        "failure": None,
        "pendingRequest": None,
    }
    if request.from_checkpoint:
        fields["latestCheckpoint"] = request.from_checkpoint
        d.status = d.status.model_copy(update={"latest_checkpoint": request.from_checkpoint})
    d.grant(current + 1, AttemptReason.MANUAL_RETRY, None, **fields)


def _refresh_report(d: _Decision) -> None:
    """A stopped Run keeps its report in step with its SideEffects (e.g. one resolved by a person)."""
    counts = report.side_effect_counts(d.w.side_effects)
    current = d.status.side_effects.to_api() if d.status.side_effects else None
    if current != counts:
        d.plan.add(PatchRunStatus({"sideEffects": counts, "report": report.run_report(d.w.side_effects)}))


def _prune_checkpoints(d: _Decision) -> None:
    for name in retention.prunable(d.run, d.w.checkpoints, d.w.attempts.values()):
        d.plan.add(DeleteCheckpoint(name))


def _input_expired(d: _Decision) -> None:
    request = d.status.pending_request
    assert request is not None
    message = f"nobody answered request {request.request_id} before {request.expires_at}"
    d.set_phase(
        RunPhase.FAILED,
        "RequestExpired",
        message,
        failure={"class": "input_expired", "reason": "RequestExpired", "message": message},
    )
    d.event("Warning", "RequestExpired", message)


def _reason_after(previous: Attempt | None, world: World) -> str:
    """Why the next Attempt starts, from how the previous one ended."""
    if previous is None:
        return AttemptReason.INITIAL
    if previous.status.phase == AttemptPhase.LEASE_LOST:
        return AttemptReason.LEASE_EXPIRED
    failure = previous.status.failure
    if failure is not None:
        return AttemptReason.retry(failure.failure_class)
    return AttemptReason.retry(FailureClass.INFRASTRUCTURE)


def _supervise(d: _Decision, number: int, attempt: Attempt | None, pod: PodView | None) -> None:
    w = d.w
    if attempt is None:
        # A grant interrupted after the Run's status was written: create the Attempt it promised.
        reason, input_value = _promised(w, number)
        recovered = d.attempt_object(number, w.run.status.lease_epoch or 0, reason, input_value)
        d.plan.add(CreateAttempt(recovered.to_api()))
        d.ensure_pod(recovered)
        return
    name = str(attempt.metadata.name)
    if attempt.status.phase in FINISHED_ATTEMPT:
        if attempt.status.phase == AttemptPhase.LEASE_LOST and w.lease is not None:
            # The loss was recorded and the operator stopped before the takeover: finish it first.
            failure = attempt.status.failure or failures.lease_lost(w.lease.duration_seconds)
            _take_over(d, attempt, pod, failure)
            return
        _after_attempt(d, attempt, attempt.status.failure)
        return
    if pod is None:
        if attempt.status.start_time is None:
            d.ensure_pod(attempt)  # not created yet, or not in the cache yet: creating is idempotent
        else:
            failure = failures.pod_lost()
            d.finish_attempt(attempt, AttemptPhase.FAILED, failure)
            d.after_failure(number, failure, AttemptPhase.FAILED)
        return
    if pod.finished:
        _conclude(d, attempt, pod)
        return
    if pod.running_since and attempt.status.phase != AttemptPhase.RUNNING:
        d.plan.add(
            PatchAttemptStatus(
                name, {"phase": "Running", "startTime": pod.running_since, "podName": pod.name}
            )
        )
    lease = w.lease
    holds_lease = lease is not None and lease.holder == name and lease.epoch == attempt.spec.lease_epoch
    if not holds_lease or w.lease_expires_in is None or not pod.running_since:
        # The lease is judged once the agent runs: image pulls and scheduling do not count against it.
        d.plan.wake_in(RECHECK_SECONDS)
    elif w.lease_expires_in <= 0:
        failure = failures.lease_lost(lease.duration_seconds if lease else 0)
        d.finish_attempt(attempt, AttemptPhase.LEASE_LOST, failure)
        _take_over(d, attempt, pod, failure)
    else:
        d.plan.wake_in(w.lease_expires_in + 0.05)


def _take_over(d: _Decision, attempt: Attempt, pod: PodView | None, failure: AttemptFailure) -> None:
    """The Attempt lost its lease. Take the lease over now, not at the next grant: a frozen worker that
    wakes up during the backoff must already find its epoch stale. Then stop its Pod, move the Run on."""
    epoch = _revoke_lease(d)
    if pod is not None and not pod.finished:
        d.plan.add(DeletePod(pod.name, grace_seconds=0))
    d.after_failure(attempt.spec.number, failure, AttemptPhase.LEASE_LOST, leaseEpoch=epoch)


def _promised(world: World, number: int) -> tuple[str, Any]:
    """(reason, input) of Attempt `number`, whose grant was interrupted before the Attempt was created.

    The grant of a resume or a manual retry writes its Accepted control record in the same status write,
    so one Accepted record more than the Attempts started for that op names the missing Attempt (exact
    while status.controls holds the whole history: it drops its oldest records beyond 50). Otherwise the
    grant was an automatic retry, whose reason follows from how the previous Attempt ended.
    """
    status, resume = world.run.status, world.run.spec.resume
    accepted = [c.op for c in status.controls or [] if c.outcome == ControlOutcome.ACCEPTED]
    reasons = [a.spec.reason for a in world.attempts.values()]
    if accepted.count(ControlOp.RETRY) > reasons.count(AttemptReason.MANUAL_RETRY):
        return AttemptReason.MANUAL_RETRY, None
    resumed = sum(reason.startswith("resume:") for reason in reasons)
    if accepted.count(ControlOp.RESUME) > resumed and status.inputs:
        answer = status.inputs[-1]  # the newest accepted input
        same = resume is not None and resume.idempotency_key == answer.idempotency_key
        return AttemptReason.resume(answer.request_id), resume.value if same and resume else None
    return _reason_after(world.attempts.get(number - 1), world), None


def _conclude(d: _Decision, attempt: Attempt, pod: PodView) -> None:
    """The agent container ended: what did the Attempt achieve?"""
    status = d.status
    name = str(attempt.metadata.name)
    assert pod.exit is not None or pod.phase in ("Succeeded", "Failed")
    end = pod.exit or failures.ContainerExit(exit_code=0 if pod.phase == "Succeeded" else 1)
    failure = failures.classify_exit(end)
    if failure is None:
        committed = status.committed_by is not None and status.committed_by.attempt == name
        if committed:
            d.finish_attempt(attempt, AttemptPhase.SUCCEEDED, None)
            _after_attempt(d, attempt, None, phase=AttemptPhase.SUCCEEDED)
            return
        if status.pending_request is not None:
            d.finish_attempt(attempt, AttemptPhase.INTERRUPTED, None)
            _after_attempt(d, attempt, None, phase=AttemptPhase.INTERRUPTED)
            return
        failure = failures.failure(
            FailureClass.DETERMINISTIC,
            "the agent exited 0 without committing a result or an input request (use agentrun.worker)",
            0,
        )
    d.finish_attempt(attempt, AttemptPhase.FAILED, failure)
    d.after_failure(attempt.spec.number, failure, AttemptPhase.FAILED)


def _after_attempt(
    d: _Decision, attempt: Attempt, failure: AttemptFailure | None, phase: AttemptPhase | None = None
) -> None:
    """Moves the Run on from an Attempt whose end is already recorded (or being recorded now)."""
    phase = phase or attempt.status.phase
    name = str(attempt.metadata.name)
    if phase == AttemptPhase.SUCCEEDED:
        d.set_phase(RunPhase.SUCCEEDED, "Succeeded", f"{name} committed the result")
        d.event("Normal", "Succeeded", f"{name} committed the result", name)
    elif phase == AttemptPhase.INTERRUPTED:
        request = d.status.pending_request
        assert request is not None
        waiting = {
            "input_required": RunPhase.INPUT_REQUIRED,
            "auth_required": RunPhase.AUTH_REQUIRED,
            "paused": RunPhase.PAUSED,
        }[request.reason.value]
        message = f"waiting for request {request.request_id} ({request.reason.value})"
        d.set_phase(waiting, waiting.value, message)
        d.event("Normal", "Interrupted", message, name)
    elif failure is not None:
        d.after_failure(attempt.spec.number, failure, phase or AttemptPhase.FAILED)
    else:
        d.after_failure(attempt.spec.number, failures.pod_lost(), AttemptPhase.FAILED)


def _deadline_passed(world: World) -> bool:
    created, limit = world.run.metadata.creation_timestamp, world.run.spec.deadline_seconds
    return bool(limit and created and world.now >= created + timedelta(seconds=limit))


def _revoke_lease(d: _Decision) -> int:
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


def _stop_for_deadline(d: _Decision, attempt: Attempt | None, pod: PodView | None) -> None:
    limit = d.run.spec.deadline_seconds
    message = f"the Run exceeded its deadline of {limit}s"
    epoch = _revoke_lease(d)
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


def _cancel(d: _Decision, attempt: Attempt | None, pod: PodView | None) -> None:
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
    _cancelled(d, attempt)


def _finish_cancel(d: _Decision, attempt: Attempt | None, pod: PodView | None) -> None:
    if pod is not None and not pod.finished:
        if not pod.deleting:  # the stop was lost (an operator restart between the two writes of _cancel)
            d.plan.add(DeletePod(pod.name))
        d.plan.wake_in(RECHECK_SECONDS)  # the Pod's deletion will wake us sooner
        return
    _cancelled(d, attempt)


def _cancelled(d: _Decision, attempt: Attempt | None) -> None:
    epoch = d.run.spec.cancel_epoch
    if attempt is not None:
        d.finish_attempt(attempt, AttemptPhase.ABORTED, failures.failure(FailureClass.CANCELLED, "cancelled"))
    message = f"cancelled (cancel epoch {epoch})"
    d.set_phase(RunPhase.CANCELLED, "Cancelled", message, observedCancelEpoch=epoch, nextAttemptTime=None)
    d.event("Normal", "Cancelled", message)
