"""Control requests from outside (spec.resume, ...): validated, recorded once per idempotency key."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import jsonschema

from agentrun.api import ControlOp, ControlRecord, ResumeRequest, Run, RunPhase, json_digest

MAX_RECORDS = 50
WAITING = frozenset({RunPhase.INPUT_REQUIRED, RunPhase.AUTH_REQUIRED, RunPhase.PAUSED})


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
        "message": verdict.message[:1024],
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
