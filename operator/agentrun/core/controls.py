"""Control requests from outside (spec.resume, ...): validated, recorded once per idempotency key."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from agentrun.api import (
    WAITING_PHASES,
    ControlOp,
    ControlRecord,
    InterruptReason,
    PendingRequest,
    ResumeRequest,
    Run,
    RunPhase,
    SpentKey,
    json_digest,
)
from agentrun.api.budgets import RESUME_VALUE_BUDGET, over_budget
from agentrun.api.run import (
    MAX_CONTROL_MESSAGE_LENGTH,
    MAX_RECORDED_CONTROLS,
    MAX_REMEMBERED_KEY_LENGTH,
    MAX_SPENT_KEYS,
)

MAX_RECORDS = MAX_RECORDED_CONTROLS
# The reason of a resume accepted while its Attempt held the request: it continued, no Attempt started.
ACCEPTED_IN_HOLD = "AcceptedInHold"
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


# ---- keys stay spent ---------------------------------------------------------------------------------
# status.controls keeps only the newest records; status.spentKeys remembers every processed key (up to
# MAX_SPENT_KEYS), so a key is never processed twice with other parameters, however old it is.


class KeyUse(StrEnum):
    NEW = "new"  # judge it, record it, spend the key
    REPEAT = "repeat"  # processed already with these parameters: nothing changes
    REUSED = "reused"  # spent with other parameters: Rejected IdempotencyKeyReused
    FULL = "full"  # a new key, but the memory is full: Rejected KeyMemoryFull


def remembered_key(key: str) -> str:
    """How status.spentKeys writes `key`: as it is when short, else by a digest (the list's budget)."""
    if len(key) <= MAX_REMEMBERED_KEY_LENGTH:
        return key
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()[:32]


def short_digest(digest: str) -> str:
    """The first 128 bits of a sha256:<hex> digest, as spentKeys stores it."""
    return digest[: len("sha256:") + 32]


def _spent(run: Run, key: str) -> SpentKey | None:
    remembered = remembered_key(key)
    return next((k for k in run.status.spent_keys or [] if k.key == remembered), None)


def key_use(run: Run, key: str, op: ControlOp, digest: str) -> KeyUse:
    """What the request (key, op, digest) is to the operator's key memory."""
    record = processed(run, key)
    if record is not None and (record.op, record.digest) == (op, digest):
        return KeyUse.REPEAT  # whatever its outcome was (a refusal of a reuse, too), it was recorded
    spent = _spent(run, key)
    if spent is not None:
        same = (spent.op, spent.digest) == (op, short_digest(digest))
        return KeyUse.REPEAT if same else KeyUse.REUSED
    if record is not None:
        return KeyUse.REUSED  # recorded before spentKeys existed
    if len(run.status.spent_keys or []) >= MAX_SPENT_KEYS:
        return KeyUse.FULL
    return KeyUse.NEW


def key_refusal(use: KeyUse, key: str) -> Verdict:
    assert use in (KeyUse.REUSED, KeyUse.FULL)
    if use == KeyUse.REUSED:
        return Verdict(
            False,
            "IdempotencyKeyReused",
            f"idempotency key {key} was already processed with other parameters: use a new key",
        )
    return Verdict(
        False,
        "KeyMemoryFull",
        f"the Run remembers {MAX_SPENT_KEYS} processed idempotency keys, its bound: it takes no new key "
        "(create a new Run for more control requests)",
    )


def with_spent(run: Run, key: str, op: ControlOp, digest: str) -> list[dict[str, Any]]:
    """status.spentKeys with `key` spent on (op, digest); the caller checked key_use() is NEW."""
    kept = [k.to_api() for k in run.status.spent_keys or []]
    return [*kept, {"key": remembered_key(key), "op": op.value, "digest": short_digest(digest)}]


def judge_resume(run: Run, now: datetime) -> Verdict:
    """Whether spec.resume answers the request the Run waits for, exactly as asked."""
    resume, status = run.spec.resume, run.status
    assert resume is not None
    if status.phase not in WAITING_PHASES or status.pending_request is None:
        return Verdict(False, "NotWaiting", f"the Run is {status.phase}, not waiting for input")
    pending = status.pending_request
    refusal = _wrong_request(resume, pending, status.latest_checkpoint, now) or _wrong_value(resume, pending)
    return refusal or Verdict(True, "Accepted", f"answer to {pending.request_id} accepted")


def _wrong_request(
    resume: ResumeRequest, pending: PendingRequest, latest_checkpoint: str | None, now: datetime
) -> Verdict | None:
    """Why spec.resume does not answer the pending request, if it does not."""
    if resume.request_id != pending.request_id:
        return Verdict(
            False,
            "UnknownRequest",
            f"request {resume.request_id} is not the pending one ({pending.request_id})",
        )
    if resume.checkpoint_id != pending.checkpoint_id or resume.checkpoint_id != latest_checkpoint:
        return Verdict(
            False,
            "StaleCheckpoint",
            f"checkpoint {resume.checkpoint_id} is not where the Run waits ({pending.checkpoint_id})",
        )
    if pending.expires_at is not None and now >= pending.expires_at:
        return Verdict(
            False, "RequestExpired", f"request {pending.request_id} expired at {pending.expires_at}"
        )
    return None


def _wrong_value(resume: ResumeRequest, pending: PendingRequest) -> Verdict | None:
    """Why spec.resume's value is no answer to the pending request (too large, not its schema), if not."""
    # The new Attempt carries the answer in its spec.input: it must fit that object's budget.
    if too_large := over_budget("spec.resume.value", resume.value, RESUME_VALUE_BUDGET, SMALLER_ANSWER):
        return Verdict(False, "ValueTooLarge", too_large)
    if pending.accepted_schema is not None:
        import jsonschema  # noqa: PLC0415 (here: the worker SDK imports this module, and rarely needs it)

        try:
            jsonschema.validate(resume.value, pending.accepted_schema)
        except jsonschema.ValidationError as exc:
            where = "/".join(str(p) for p in exc.absolute_path) or "(root)"
            return Verdict(False, "SchemaMismatch", f"value at {where}: {exc.message}"[:1024])
        except jsonschema.SchemaError as exc:
            return Verdict(False, "SchemaMismatch", f"the request's schema is invalid: {exc.message}"[:1024])
    return None


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


def requester(run: Run, op: ControlOp, key: str) -> str | None:
    """Who sent the request of the spec that `op` and `key` name, as it names them (the API server
    checked that name against the user who wrote it): spec.resume.answeredBy, or the requestedBy of
    spec.cancelRequest, spec.retryRequest or spec.compensateRequest. A pause names nobody."""
    spec = run.spec
    if op == ControlOp.RESUME and spec.resume and spec.resume.idempotency_key == key:
        return spec.resume.answered_by
    requests = {
        ControlOp.CANCEL: spec.cancel_request,
        ControlOp.RETRY: spec.retry_request,
        ControlOp.COMPENSATE: spec.compensate_request,
    }
    request = requests.get(op)
    if request is not None and request.idempotency_key == key:
        return request.requested_by
    return None


def with_record(run: Run, record: dict[str, Any]) -> list[dict[str, Any]]:
    """status.controls with `record` appended (replacing the record of its key: one per key, and the
    newest says how the last request with that key ended); only the newest MAX_RECORDS are kept. The
    record names who sent the request, when the request names them."""
    key = record["idempotencyKey"]
    if "requestedBy" not in record and (by := requester(run, ControlOp(record["op"]), key)):
        record = {**record, "requestedBy": by}
    kept = [c.to_api() for c in run.status.controls or [] if c.idempotency_key != key]
    return [*kept, record][-MAX_RECORDS:]


def with_input(
    run: Run, resume: ResumeRequest, now: datetime, reason: InterruptReason | None = None
) -> list[dict[str, Any]]:
    entry = {
        "requestId": resume.request_id,
        "checkpointId": resume.checkpoint_id,
        "digest": json_digest(resume.value),
        "idempotencyKey": resume.idempotency_key,
        "time": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    if reason is not None:
        entry["reason"] = reason.value
    if resume.answered_by:
        entry["answeredBy"] = resume.answered_by
    kept = [i.to_api() for i in run.status.inputs or [] if i.request_id != resume.request_id]
    return [*kept, entry][-MAX_RECORDS:]


def accepted_input(resume: ResumeRequest) -> dict[str, Any]:
    """status.acceptedInput for an accepted resume: its value, kept where no later answer replaces it."""
    return {"requestId": resume.request_id, "idempotencyKey": resume.idempotency_key, "value": resume.value}


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
    if run.spec.fork_from is not None and run.status.fork is None:
        # Its source could not be used: a retry would start the agent from the beginning, not a fork.
        return Verdict(
            False,
            "ForkNotStarted",
            f"this fork never started (its source {run.spec.fork_from.run} could not be used): create a "
            "new Run with a usable spec.forkFrom",
        )
    if phase == RunPhase.NEEDS_RECONCILIATION and run.status.compensating is not None:
        # A retry would run the agent again over a half-undone world (core.compensation).
        return Verdict(
            False,
            "CompensationIncomplete",
            "the Run's compensation is incomplete: resolve its SideEffects, then spec.compensateRequest",
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


def cancel_digest(run: Run) -> str:
    """A cancel request's digest covers the epoch it raises the Run to and its reason."""
    request = run.spec.cancel_request
    assert request is not None
    return json_digest({"cancelEpoch": run.spec.cancel_epoch, "reason": request.reason})


def judge_cancel(run: Run) -> Verdict | None:
    """How the cancel that spec.cancelRequest explains ended, or None while it is still on its way."""
    status, target = run.status, run.spec.cancel_epoch
    if target == 0:
        return Verdict(
            False, "NoCancelEpoch", "spec.cancelRequest explains a cancel: raise spec.cancelEpoch with it"
        )
    if status.phase == RunPhase.SUCCEEDED:
        return Verdict(False, "CancelTooLate", "the result was committed before the cancel arrived")
    if (status.observed_cancel_epoch or 0) < target:
        return None
    if status.phase in (RunPhase.CANCEL_REQUESTED, RunPhase.CANCELLED):
        reason = run.spec.cancel_request.reason if run.spec.cancel_request else None
        return Verdict(True, "Accepted", f"cancel epoch {target}" + (f": {reason}" if reason else ""))
    return Verdict(False, "NotCancelled", f"the Run is {status.phase}, not cancelled")
