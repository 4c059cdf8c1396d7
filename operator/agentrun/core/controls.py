"""Control requests from outside (spec.resume, ...): validated, recorded once per idempotency key."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import jsonschema

from agentrun.api import ControlOp, ControlRecord, ResumeRequest, Run, RunPhase, json_digest
from agentrun.api.budgets import RESUME_VALUE_BUDGET, over_budget
from agentrun.api.run import MAX_CONTROL_MESSAGE_LENGTH

MAX_RECORDS = 50
WAITING = frozenset({RunPhase.INPUT_REQUIRED, RunPhase.AUTH_REQUIRED, RunPhase.PAUSED})
SMALLER_ANSWER = "answer with a reference (a URI and a digest) to large data instead of the data"


@dataclass(frozen=True)
class Verdict:
    accepted: bool
    reason: str  # CamelCase
    message: str


def resume_digest(resume: ResumeRequest) -> str:
    return json_digest(
        {"requestId": resume.request_id, "checkpointId": resume.checkpoint_id, "value": resume.value}
    )


def processed(run: Run, key: str) -> ControlRecord | None:
    return next((c for c in run.status.controls or [] if c.idempotency_key == key), None)


def judge_resume(run: Run, now: datetime) -> Verdict:
    """Whether spec.resume answers the request the Run waits for, exactly as asked."""
    resume, status = run.spec.resume, run.status
    assert resume is not None
    if status.phase not in WAITING or status.pending_request is None:
        return Verdict(False, "NotWaiting", f"the Run is {status.phase}, not waiting for input")
    pending = status.pending_request
    if resume.request_id != pending.request_id:
        return Verdict(
            False,
            "UnknownRequest",
            f"request {resume.request_id} is not the pending one ({pending.request_id})",
        )
    if resume.checkpoint_id != pending.checkpoint_id or resume.checkpoint_id != status.latest_checkpoint:
        return Verdict(
            False,
            "StaleCheckpoint",
            f"checkpoint {resume.checkpoint_id} is not where the Run waits ({pending.checkpoint_id})",
        )
    if pending.expires_at is not None and now >= pending.expires_at:
        return Verdict(
            False, "RequestExpired", f"request {pending.request_id} expired at {pending.expires_at}"
        )
    # The new Attempt carries the answer in its spec.input: it must fit that object's budget.
    if too_large := over_budget("spec.resume.value", resume.value, RESUME_VALUE_BUDGET, SMALLER_ANSWER):
        return Verdict(False, "ValueTooLarge", too_large)
    if pending.accepted_schema is not None:
        try:
            jsonschema.validate(resume.value, pending.accepted_schema)
        except jsonschema.ValidationError as exc:
            where = "/".join(str(p) for p in exc.absolute_path) or "(root)"
            return Verdict(False, "SchemaMismatch", f"value at {where}: {exc.message}"[:1024])
        except jsonschema.SchemaError as exc:
            return Verdict(False, "SchemaMismatch", f"the request's schema is invalid: {exc.message}"[:1024])
    return Verdict(True, "Accepted", f"answer to {pending.request_id} accepted")


def control_record(op: ControlOp, key: str, digest: str, verdict: Verdict, now: datetime) -> dict[str, Any]:
    return {
        "idempotencyKey": key,
        "op": op.value,
        "digest": digest,
        "outcome": "Accepted" if verdict.accepted else "Rejected",
        "reason": verdict.reason,
        "message": verdict.message[:MAX_CONTROL_MESSAGE_LENGTH],
        "time": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def with_record(run: Run, record: dict[str, Any]) -> list[dict[str, Any]]:
    """status.controls with `record` appended; only the newest MAX_RECORDS are kept."""
    kept = [c.to_api() for c in run.status.controls or []]
    return [*kept, record][-MAX_RECORDS:]


def with_input(run: Run, resume: ResumeRequest, now: datetime) -> list[dict[str, Any]]:
    entry = {
        "requestId": resume.request_id,
        "checkpointId": resume.checkpoint_id,
        "digest": json_digest(resume.value),
        "idempotencyKey": resume.idempotency_key,
        "time": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    kept = [i.to_api() for i in run.status.inputs or [] if i.request_id != resume.request_id]
    return [*kept, entry][-MAX_RECORDS:]


def retry_digest(run: Run) -> str:
    request = run.spec.retry_request
    assert request is not None
    return json_digest({"fromCheckpoint": request.from_checkpoint, "reason": request.reason})


def judge_retry(run: Run, checkpoint_ids: set[str], unresolved_effects: list[str]) -> Verdict:
    """A manual retry: only of a Failed or NeedsReconciliation Run, and only once nothing is unknown."""
    request, phase = run.spec.retry_request, run.status.phase
    assert request is not None
    if phase not in (RunPhase.FAILED, RunPhase.NEEDS_RECONCILIATION):
        return Verdict(
            False, "NotRetryable", f"the Run is {phase}: only Failed or NeedsReconciliation Runs retry"
        )
    if unresolved_effects:
        names = ", ".join(sorted(unresolved_effects)[:5])
        return Verdict(
            False,
            "UnresolvedSideEffects",
            f"resolve the side effects whose outcome is unknown first ({names}): "
            "kubectl agentrun resolve-effect",
        )
    if request.from_checkpoint and request.from_checkpoint not in checkpoint_ids:
        return Verdict(False, "UnknownCheckpoint", f"checkpoint {request.from_checkpoint} does not exist")
    start = request.from_checkpoint or run.status.latest_checkpoint or "the beginning"
    return Verdict(
        True, "Accepted", f"manual retry from {start}" + (f": {request.reason}" if request.reason else "")
    )


def pause_digest(run: Run) -> str:
    request = run.spec.pause
    assert request is not None
    return json_digest({"requestId": request.request_id, "reason": request.reason})


def judge_pause(run: Run) -> Verdict | None:
    """A pause is honoured by the worker at its next step boundary; this records how it ended, or None
    while the Run is still on its way to the boundary."""
    request, status = run.spec.pause, run.status
    assert request is not None
    pending = status.pending_request
    if status.phase == RunPhase.PAUSED and pending is not None and pending.request_id == request.request_id:
        return Verdict(True, "Accepted", f"paused at checkpoint {pending.checkpoint_id}")
    if status.phase in (RunPhase.RUNNING, RunPhase.QUEUED, RunPhase.RETRY_BACKOFF):
        return None
    return Verdict(False, "NotRunning", f"the Run is {status.phase}: only a running Run can pause")
