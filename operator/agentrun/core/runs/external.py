"""Requests from outside the Run: resume, retry, cancel and pause, each judged and recorded once per key."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agentrun.api import FINISHED_ATTEMPT_PHASES, AttemptReason, ControlOp, Run, RunPhase
from agentrun.core import controls, report
from agentrun.core.controls import KeyUse
from agentrun.core.runs import compensating
from agentrun.core.runs.builder import Builder


def judge_requests(b: Builder, current: int) -> bool:
    """Judges the control requests not processed yet (one record per idempotency key, every key spent
    once: status.spentKeys); True when one was, so the Run waits for that write before anything else."""
    return (
        _judge_retry(b, current)
        or _judge_cancel(b)
        or _judge_pause(b)
        or compensating.judge_request(b)
        or _judge_resume(b, current)
    )


def _judge_retry(b: Builder, current: int) -> bool:
    run = b.run
    if run.spec.retry_request is None:
        return False
    key, digest = run.spec.retry_request.idempotency_key, controls.retry_digest(run)
    use = controls.key_use(run, key, ControlOp.RETRY, digest)
    if use == KeyUse.NEW:
        retry_run(b, current)
    elif use != KeyUse.REPEAT:
        refuse_key(b, ControlOp.RETRY, key, digest, use)
    return use != KeyUse.REPEAT


def _judge_cancel(b: Builder) -> bool:
    request = b.run.spec.cancel_request
    if request is None:
        return False
    digest = controls.cancel_digest(b.run)
    return _judge_recorded(b, ControlOp.CANCEL, request.idempotency_key, digest, controls.judge_cancel)


def _judge_pause(b: Builder) -> bool:
    pause = b.run.spec.pause
    if pause is None:
        return False
    digest = controls.pause_digest(b.run)
    return _judge_recorded(b, ControlOp.PAUSE, pause.request_id, digest, controls.judge_pause)


def _judge_recorded(
    b: Builder, op: ControlOp, key: str, digest: str, judge: Callable[[Run], controls.Verdict | None]
) -> bool:
    """A request whose outcome is only recorded (cancel, pause: what it asks is done by other rules);
    `judge` may leave a new one unjudged (None) until the Run can tell."""
    use = controls.key_use(b.run, key, op, digest)
    if use == KeyUse.REPEAT:
        return False
    verdict = judge(b.run) if use == KeyUse.NEW else controls.key_refusal(use, key)
    if verdict is None:
        return False
    record(b, op, key, digest, verdict, spend=use == KeyUse.NEW)
    return True


def _judge_resume(b: Builder, current: int) -> bool:
    resume = b.run.spec.resume
    if resume is None:
        return False
    key, digest = resume.idempotency_key, controls.resume_digest(resume)
    use = controls.key_use(b.run, key, ControlOp.RESUME, digest)
    if use == KeyUse.NEW:
        resume_run(b, current)
    elif use != KeyUse.REPEAT:
        refuse_key(b, ControlOp.RESUME, key, digest, use)
    return use != KeyUse.REPEAT


def record(
    b: Builder, op: ControlOp, key: str, digest: str, verdict: controls.Verdict, *, spend: bool
) -> None:
    """Records how a request ended, spending its key unless the key memory refused it."""
    b.record_control(
        controls.control_record(op, key, digest, verdict, b.w.now),
        spent=controls.with_spent(b.run, key, op, digest) if spend else None,
    )
    if not verdict.accepted:
        b.event("Warning", f"{op.value}Rejected", f"{verdict.reason}: {verdict.message}")


def refuse_key(b: Builder, op: ControlOp, key: str, digest: str, use: KeyUse) -> None:
    record(b, op, key, digest, controls.key_refusal(use, key), spend=False)


def resume_run(b: Builder, current: int) -> None:
    run, now = b.run, b.w.now
    resume = run.spec.resume
    assert resume is not None
    verdict = controls.judge_resume(run, now)
    digest = controls.resume_digest(resume)
    if not verdict.accepted:
        record(b, ControlOp.RESUME, resume.idempotency_key, digest, verdict, spend=True)
        return
    pending = run.status.pending_request
    assert pending is not None
    accepted: dict[str, Any] = {
        "inputs": controls.with_input(run, resume, now, pending.reason),
        "spentKeys": controls.with_spent(run, resume.idempotency_key, ControlOp.RESUME, digest),
        "pendingRequest": None,
    }
    holder = holding_attempt(b, current)
    if holder is not None:
        # The Attempt that asked still holds the request: this write (preconditioned, like the worker's
        # release) decides; if it lands, that Attempt continues with the answer, no new Pod.
        message = f"answer to {pending.request_id} accepted; {holder} continues with it"
        hold = controls.Verdict(True, controls.ACCEPTED_IN_HOLD, message)
        entry = controls.control_record(ControlOp.RESUME, resume.idempotency_key, digest, hold, now)
        accepted["controls"] = controls.with_record(run, entry)
        b.set_phase(RunPhase.RUNNING, "AttemptRunning", message, **accepted)
        b.event("Normal", "ResumeAccepted", message, holder)
        return
    entry = controls.control_record(ControlOp.RESUME, resume.idempotency_key, digest, verdict, now)
    b.event("Normal", "ResumeAccepted", verdict.message)
    accepted["controls"] = controls.with_record(run, entry)
    b.grant(current + 1, AttemptReason.resume(resume.request_id), resume.value, **accepted)


def holding_attempt(b: Builder, current: int) -> str | None:
    """The current Attempt, when it holds the pending request and is alive to take the answer."""
    pending, attempt = b.status.pending_request, b.w.attempts.get(current)
    if pending is None or attempt is None or pending.held_by != attempt.metadata.name:
        return None
    pod = b.w.pods.get(str(attempt.metadata.name))
    if attempt.status.phase in FINISHED_ATTEMPT_PHASES or pod is None or pod.finished:
        return None
    return str(attempt.metadata.name)


def retry_run(b: Builder, current: int) -> None:
    run, now = b.run, b.w.now
    request = run.spec.retry_request
    assert request is not None
    verdict = controls.judge_retry(
        run,
        {c.spec.id for c in b.w.checkpoints},
        [str(e.metadata.name) for e in report.unresolved(b.w.side_effects)],
    )
    digest = controls.retry_digest(run)
    if not verdict.accepted:
        record(b, ControlOp.RETRY, request.idempotency_key, digest, verdict, spend=True)
        return
    entry = controls.control_record(ControlOp.RETRY, request.idempotency_key, digest, verdict, now)
    b.event("Normal", "ManualRetry", verdict.message)
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
    b.grant(current + 1, AttemptReason.MANUAL_RETRY, None, request.from_checkpoint, **fields)


def fail_expired_request(b: Builder) -> None:
    request = b.status.pending_request
    assert request is not None
    message = f"nobody answered request {request.request_id} before {request.expires_at}"
    b.set_phase(
        RunPhase.FAILED,
        "RequestExpired",
        message,
        failure={"class": "input_expired", "reason": "RequestExpired", "message": message},
    )
    b.event("Warning", "RequestExpired", message)
