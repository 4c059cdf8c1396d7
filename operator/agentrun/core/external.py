"""Requests from outside the Run: resume, retry and pause, each judged and recorded once per key."""

from __future__ import annotations

from typing import Any

from agentrun.api import (
    AttemptReason,
    ControlOp,
    RunPhase,
)
from agentrun.core import controls, report
from agentrun.core.decision import Decision


def judge_requests(d: Decision, current: int) -> bool:
    """Judges the control requests not processed yet (one record per idempotency key); True when one
    was, so the Run waits for that write before anything else happens."""
    run, spec = d.run, d.run.spec
    if spec.retry_request is not None and controls.processed(run, spec.retry_request.idempotency_key) is None:
        retry_run(d, current)
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
        resume_run(d, current)
        return True
    return False


def resume_run(d: Decision, current: int) -> None:
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


def retry_run(d: Decision, current: int) -> None:
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
