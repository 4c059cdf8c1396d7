"""Requests from outside the Run: resume, retry and pause, each judged and recorded once per key."""

from __future__ import annotations

from typing import Any

from agentrun.api import (
    AttemptReason,
    ControlOp,
    RunPhase,
)
from agentrun.core import compensation, controls, report
from agentrun.core.controls import KeyUse
from agentrun.core.decision import FINISHED_ATTEMPT, Decision


def judge_requests(d: Decision, current: int) -> bool:
    """Judges the control requests not processed yet (one record per idempotency key, every key spent
    once: status.spentKeys); True when one was, so the Run waits for that write before anything else."""
    run, spec = d.run, d.run.spec
    if spec.retry_request is not None:
        key, digest = spec.retry_request.idempotency_key, controls.retry_digest(run)
        if (use := controls.key_use(run, key, ControlOp.RETRY, digest)) != KeyUse.REPEAT:
            if use == KeyUse.NEW:
                retry_run(d, current)
            else:
                refuse_key(d, ControlOp.RETRY, key, digest, use)
            return True
    if spec.cancel_request is not None:
        key, digest = spec.cancel_request.idempotency_key, controls.cancel_digest(run)
        if (use := controls.key_use(run, key, ControlOp.CANCEL, digest)) != KeyUse.REPEAT:
            verdict = controls.judge_cancel(run) if use == KeyUse.NEW else controls.key_refusal(use, key)
            if verdict is not None:
                record(d, ControlOp.CANCEL, key, digest, verdict, spend=use == KeyUse.NEW)
                return True
    pause = spec.pause
    if pause is not None:
        key, digest = pause.request_id, controls.pause_digest(run)
        if (use := controls.key_use(run, key, ControlOp.PAUSE, digest)) != KeyUse.REPEAT:
            verdict = controls.judge_pause(run) if use == KeyUse.NEW else controls.key_refusal(use, key)
            if verdict is not None:
                record(d, ControlOp.PAUSE, key, digest, verdict, spend=use == KeyUse.NEW)
                return True
    if compensation.judge_request(d):
        return True
    if spec.resume is not None:
        key, digest = spec.resume.idempotency_key, controls.resume_digest(spec.resume)
        if (use := controls.key_use(run, key, ControlOp.RESUME, digest)) != KeyUse.REPEAT:
            if use == KeyUse.NEW:
                resume_run(d, current)
            else:
                refuse_key(d, ControlOp.RESUME, key, digest, use)
            return True
    return False


def record(
    d: Decision, op: ControlOp, key: str, digest: str, verdict: controls.Verdict, *, spend: bool
) -> None:
    """Records how a request ended, spending its key unless the key memory refused it."""
    d.record_control(
        controls.control_record(op, key, digest, verdict, d.w.now),
        spent=controls.with_spent(d.run, key, op, digest) if spend else None,
    )
    if not verdict.accepted:
        d.event("Warning", f"{op.value}Rejected", f"{verdict.reason}: {verdict.message}")


def refuse_key(d: Decision, op: ControlOp, key: str, digest: str, use: KeyUse) -> None:
    record(d, op, key, digest, controls.key_refusal(use, key), spend=False)


def resume_run(d: Decision, current: int) -> None:
    run, now = d.run, d.w.now
    resume = run.spec.resume
    assert resume is not None
    verdict = controls.judge_resume(run, now)
    digest = controls.resume_digest(resume)
    if not verdict.accepted:
        record(d, ControlOp.RESUME, resume.idempotency_key, digest, verdict, spend=True)
        return
    pending = run.status.pending_request
    assert pending is not None
    spent = controls.with_spent(run, resume.idempotency_key, ControlOp.RESUME, digest)
    inputs = controls.with_input(run, resume, now, pending.reason)
    holder = holding_attempt(d, current)
    if holder is not None:
        # The Attempt that asked still holds the request: this write (preconditioned, like the worker's
        # release) decides; if it lands, that Attempt continues with the answer, no new Pod.
        message = f"answer to {pending.request_id} accepted; {holder} continues with it"
        hold = controls.Verdict(True, controls.ACCEPTED_IN_HOLD, message)
        d.set_phase(
            RunPhase.RUNNING,
            "AttemptRunning",
            message,
            controls=controls.with_record(
                run, controls.control_record(ControlOp.RESUME, resume.idempotency_key, digest, hold, now)
            ),
            inputs=inputs,
            spentKeys=spent,
            pendingRequest=None,
        )
        d.event("Normal", "ResumeAccepted", message, holder)
        return
    record_ = controls.control_record(ControlOp.RESUME, resume.idempotency_key, digest, verdict, now)
    d.event("Normal", "ResumeAccepted", verdict.message)
    d.grant(
        current + 1,
        AttemptReason.resume(resume.request_id),
        resume.value,
        controls=controls.with_record(run, record_),
        inputs=inputs,
        spentKeys=spent,
        pendingRequest=None,
    )


def holding_attempt(d: Decision, current: int) -> str | None:
    """The current Attempt, when it holds the pending request and is alive to take the answer."""
    pending, attempt = d.status.pending_request, d.w.attempts.get(current)
    if pending is None or attempt is None or pending.held_by != attempt.metadata.name:
        return None
    pod = d.w.pods.get(str(attempt.metadata.name))
    if attempt.status.phase in FINISHED_ATTEMPT or pod is None or pod.finished:
        return None
    return str(attempt.metadata.name)


def retry_run(d: Decision, current: int) -> None:
    run, now = d.run, d.w.now
    request = run.spec.retry_request
    assert request is not None
    verdict = controls.judge_retry(
        run,
        {c.spec.id for c in d.w.checkpoints},
        [str(e.metadata.name) for e in report.unresolved(d.w.side_effects)],
    )
    digest = controls.retry_digest(run)
    if not verdict.accepted:
        record(d, ControlOp.RETRY, request.idempotency_key, digest, verdict, spend=True)
        return
    entry = controls.control_record(ControlOp.RETRY, request.idempotency_key, digest, verdict, now)
    d.event("Normal", "ManualRetry", verdict.message)
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
        d.status = d.status.model_copy(update={"latest_checkpoint": request.from_checkpoint})
    d.grant(current + 1, AttemptReason.MANUAL_RETRY, None, **fields)


def fail_expired_request(d: Decision) -> None:
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
