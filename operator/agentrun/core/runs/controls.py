"""Requests from outside the Run: resume, retry, cancel, pause and compensate, each judged and recorded
once per key (status.spentKeys). Each judge returns the Transition of a request it judged, or None."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agentrun.api import FINISHED_ATTEMPT_PHASES, AttemptReason, ControlOp, Run, RunPhase
from agentrun.core import compensation, controls, report
from agentrun.core.controls import KeyUse
from agentrun.core.plan import PatchRunStatus
from agentrun.core.runs.compensation import returned
from agentrun.core.runs.grants import grant
from agentrun.core.runs.transition import Transition, event, set_phase, writes
from agentrun.core.runs.world import World


def judge_requests(w: World, current: int) -> Transition | None:
    """Judges the first control request not processed yet (one record per idempotency key, every key
    spent once); None when there is none, else its Transition: the Run waits for that write before
    anything else."""
    for judge in (_judge_retry, _judge_cancel, _judge_pause, _judge_compensate, _judge_resume):
        if (judged := judge(w, current)) is not None:
            return judged
    return None


def recorded(w: World, record: dict[str, Any], spent: list[dict[str, Any]] | None = None) -> Transition:
    """A refused (or merely noted) control request: recorded (its key spent, when `spent` is the new
    status.spentKeys), and nothing else changes."""
    patch: dict[str, Any] = {
        "controls": controls.with_record(w.run, record),
        "observedGeneration": w.run.metadata.generation,
    }
    if spent is not None:
        patch["spentKeys"] = spent
    return writes(PatchRunStatus(patch))


def _judge_retry(w: World, current: int) -> Transition | None:
    run = w.run
    if run.spec.retry_request is None:
        return None
    key, digest = run.spec.retry_request.idempotency_key, controls.retry_digest(run)
    use = controls.key_use(run, key, ControlOp.RETRY, digest)
    if use == KeyUse.NEW:
        return retry_run(w, current)
    if use != KeyUse.REPEAT:
        return refuse_key(w, ControlOp.RETRY, key, digest, use)
    return None


def _judge_cancel(w: World, current: int) -> Transition | None:
    request = w.run.spec.cancel_request
    if request is None:
        return None
    digest = controls.cancel_digest(w.run)
    return _judge_recorded(w, ControlOp.CANCEL, request.idempotency_key, digest, controls.judge_cancel)


def _judge_pause(w: World, current: int) -> Transition | None:
    pause = w.run.spec.pause
    if pause is None:
        return None
    digest = controls.pause_digest(w.run)
    return _judge_recorded(w, ControlOp.PAUSE, pause.request_id, digest, controls.judge_pause)


def _judge_recorded(
    w: World, op: ControlOp, key: str, digest: str, judge: Callable[[Run], controls.Verdict | None]
) -> Transition | None:
    """A request whose outcome is only recorded (cancel, pause: what it asks is done by other rules);
    `judge` may leave a new one unjudged (None) until the Run can tell."""
    use = controls.key_use(w.run, key, op, digest)
    if use == KeyUse.REPEAT:
        return None
    verdict = judge(w.run) if use == KeyUse.NEW else controls.key_refusal(use, key)
    if verdict is None:
        return None
    return record(w, op, key, digest, verdict, spend=use == KeyUse.NEW)


def _judge_compensate(w: World, current: int) -> Transition | None:
    """spec.compensateRequest, once per key: Compensating (status.compensating says what and where to
    return), or the incomplete compensation found complete, or recorded only."""
    run = w.run
    request = run.spec.compensate_request
    if request is None:
        return None
    key, digest = request.idempotency_key, compensation.request_digest(request.effects)
    use = controls.key_use(run, key, ControlOp.COMPENSATE, digest)
    if use == KeyUse.REPEAT:
        return None
    if use == KeyUse.NEW:
        verdict, started = compensation.judge(run, w.side_effects)
    else:
        verdict, started = controls.key_refusal(use, key), None
    entry = controls.control_record(ControlOp.COMPENSATE, key, digest, verdict, w.now)
    spent = controls.with_spent(run, key, ControlOp.COMPENSATE, digest) if use == KeyUse.NEW else None
    progress = run.status.compensating
    if started is None and verdict.accepted and progress is not None and compensation.is_incomplete(run):
        # An incomplete compensation with nothing left to settle or undo (a person resolved the records,
        # or the last Attempt finished its work but not its exit): it is complete, the Run goes back.
        return returned(w, progress, controls=controls.with_record(run, entry), spentKeys=spent)
    if started is None:
        noted = recorded(w, entry, spent=spent)
        if not verdict.accepted:
            noted = noted.then(event("Warning", "CompensateRejected", f"{verdict.reason}: {verdict.message}"))
        return noted
    return set_phase(
        RunPhase.COMPENSATING,
        "CompensateRequested",
        verdict.message,
        controls=controls.with_record(run, entry),
        spentKeys=spent,
        compensating=started,
        nextAttemptTime=None,
    ).then(event("Normal", "CompensateRequested", verdict.message))


def _judge_resume(w: World, current: int) -> Transition | None:
    resume = w.run.spec.resume
    if resume is None:
        return None
    key, digest = resume.idempotency_key, controls.resume_digest(resume)
    use = controls.key_use(w.run, key, ControlOp.RESUME, digest)
    if use == KeyUse.NEW:
        return resume_run(w, current)
    if use != KeyUse.REPEAT:
        return refuse_key(w, ControlOp.RESUME, key, digest, use)
    return None


def record(
    w: World, op: ControlOp, key: str, digest: str, verdict: controls.Verdict, *, spend: bool
) -> Transition:
    """Records how a request ended, spending its key unless the key memory refused it."""
    noted = recorded(
        w,
        controls.control_record(op, key, digest, verdict, w.now),
        spent=controls.with_spent(w.run, key, op, digest) if spend else None,
    )
    if not verdict.accepted:
        noted = noted.then(event("Warning", f"{op.value}Rejected", f"{verdict.reason}: {verdict.message}"))
    return noted


def refuse_key(w: World, op: ControlOp, key: str, digest: str, use: KeyUse) -> Transition:
    return record(w, op, key, digest, controls.key_refusal(use, key), spend=False)


def resume_run(w: World, current: int) -> Transition:
    run, now = w.run, w.now
    resume = run.spec.resume
    assert resume is not None
    verdict = controls.judge_resume(run, now)
    digest = controls.resume_digest(resume)
    if not verdict.accepted:
        return record(w, ControlOp.RESUME, resume.idempotency_key, digest, verdict, spend=True)
    pending = run.status.pending_request
    assert pending is not None
    accepted: dict[str, Any] = {
        "inputs": controls.with_input(run, resume, now, pending.reason),
        "acceptedInput": controls.accepted_input(resume),
        "spentKeys": controls.with_spent(run, resume.idempotency_key, ControlOp.RESUME, digest),
        "pendingRequest": None,
    }
    holder = holding_attempt(w, current)
    if holder is not None:
        # The Attempt that asked still holds the request: this write (preconditioned, like the worker's
        # release) decides; if it lands, that Attempt continues with the answer, no new Pod.
        message = f"answer to {pending.request_id} accepted; {holder} continues with it"
        hold = controls.Verdict(True, controls.ACCEPTED_IN_HOLD, message)
        entry = controls.control_record(ControlOp.RESUME, resume.idempotency_key, digest, hold, now)
        accepted["controls"] = controls.with_record(run, entry)
        return set_phase(RunPhase.RUNNING, "AttemptRunning", message, **accepted).then(
            event("Normal", "ResumeAccepted", message, holder)
        )
    entry = controls.control_record(ControlOp.RESUME, resume.idempotency_key, digest, verdict, now)
    accepted["controls"] = controls.with_record(run, entry)
    return event("Normal", "ResumeAccepted", verdict.message).then(
        grant(w, current + 1, AttemptReason.resume(resume.request_id), resume.value, **accepted)
    )


def holding_attempt(w: World, current: int) -> str | None:
    """The current Attempt, when it holds the pending request and is alive to take the answer."""
    pending, attempt = w.run.status.pending_request, w.attempts.get(current)
    if pending is None or attempt is None or pending.held_by != attempt.metadata.name:
        return None
    pod = w.pods.get(str(attempt.metadata.name))
    if attempt.status.phase in FINISHED_ATTEMPT_PHASES or pod is None or pod.finished:
        return None
    return str(attempt.metadata.name)


def retry_run(w: World, current: int) -> Transition:
    run, now = w.run, w.now
    request = run.spec.retry_request
    assert request is not None
    verdict = controls.judge_retry(
        run,
        {c.spec.id for c in w.checkpoints},
        [str(e.metadata.name) for e in report.unresolved(w.side_effects)],
    )
    digest = controls.retry_digest(run)
    if not verdict.accepted:
        return record(w, ControlOp.RETRY, request.idempotency_key, digest, verdict, spend=True)
    entry = controls.control_record(ControlOp.RETRY, request.idempotency_key, digest, verdict, now)
    # A request left over from before (one that expired, or a deadline while waiting) is not the new
    # Attempt's: were it kept, that Attempt ending without a result would pass for an interrupt.
    fields: dict[str, Any] = {
        "controls": controls.with_record(run, entry),
        "spentKeys": controls.with_spent(run, request.idempotency_key, ControlOp.RETRY, digest),
        "failure": None,
        "pendingRequest": None,
    }
    if request.from_checkpoint:
        fields["latestCheckpoint"] = request.from_checkpoint
    return event("Normal", "ManualRetry", verdict.message).then(
        grant(w, current + 1, AttemptReason.MANUAL_RETRY, None, request.from_checkpoint, **fields)
    )


def fail_expired_request(w: World) -> Transition:
    request = w.run.status.pending_request
    assert request is not None
    message = f"nobody answered request {request.request_id} before {request.expires_at}"
    return set_phase(
        RunPhase.FAILED,
        "RequestExpired",
        message,
        failure={"class": "input_expired", "reason": "RequestExpired", "message": message},
    ).then(event("Warning", "RequestExpired", message))
