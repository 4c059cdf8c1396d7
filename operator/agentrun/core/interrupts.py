"""Interrupts, the worker's requests to a person (status.pendingRequest; not the control requests a
person sends, core.controls): which answer an Attempt carries, which call it answers, and when a pause is
due. Three sources of requests share one mechanism (the agent's own question, ctx.interrupt; the approval
gate; a pause from outside); an answer to one of them must never answer another.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from pydantic import JsonValue

from agentrun.api import (
    Attempt,
    InterruptReason,
    RecordedInput,
    Run,
    StartReason,
    attempt_name,
    json_digest,
)

APPROVAL_PREFIX = "approve-"  # core.ledger.approval_request_id


class RequestKind(StrEnum):
    QUESTION = "question"  # ctx.interrupt
    APPROVAL = "approval"  # the gate of ctx.side_effect
    PAUSE = "pause"  # spec.pause, honoured at a step boundary


@dataclass(frozen=True)
class Answered:
    """The request an Attempt brings the answer to, and what kind of request it was."""

    request_id: str
    kind: RequestKind


def request_kind(request_id: str, reason: InterruptReason | None, pause_id: str | None) -> RequestKind:
    """What asked `request_id`: from the reason the operator recorded with its input, or (an input recorded
    without one) from its id: approvals are named approve-<SideEffect>, a pause by spec.pause."""
    if reason == InterruptReason.PAUSED or (reason is None and request_id == pause_id):
        return RequestKind.PAUSE
    if request_id.startswith(APPROVAL_PREFIX) and reason in (InterruptReason.AUTH_REQUIRED, None):
        return RequestKind.APPROVAL
    return RequestKind.QUESTION


def _input_for(run: Run, request_id: str) -> RecordedInput | None:
    return next((i for i in run.status.inputs or [] if i.request_id == request_id), None)


def answered(run: Run, attempt: Attempt) -> Answered | None:
    """The request this Attempt brings the answer to: named by a resume's reason; for an automatic retry
    that carries the answer on (spec.input, same Checkpoint), the newest input accepted for that
    Checkpoint."""
    pause_id = run.spec.pause.request_id if run.spec.pause else None
    request_id: str | None = None
    if (resumed := StartReason.parse(attempt.spec.reason).answered_request) is not None:
        request_id = resumed
    elif attempt.spec.input is not None and attempt.spec.resume_from:
        carried = [i for i in run.status.inputs or [] if i.checkpoint_id == attempt.spec.resume_from]
        request_id = carried[-1].request_id if carried else None
    if request_id is None:
        return None
    recorded = _input_for(run, request_id)
    return Answered(request_id, request_kind(request_id, recorded.reason if recorded else None, pause_id))


def answers_question(answer: Answered | None) -> bool:
    """Whether ctx.interrupt returns `answer` instead of asking: only an answer to a question does; the
    answer to a pause or an approval never answers the agent's next question."""
    return answer is not None and answer.kind == RequestKind.QUESTION


def answers_approval(answer: Answered | None, request_id: str) -> bool:
    """Whether `answer` is the answer to the approval request `request_id` (exactly that one)."""
    return answer is not None and answer.kind == RequestKind.APPROVAL and answer.request_id == request_id


def pause_due(pause_id: str | None, answered_ids: frozenset[str], answering: Answered | None) -> bool:
    """Whether the agent pauses at this step boundary: spec.pause asks for it, and it was not answered
    already (by an earlier Attempt, or by the answer this Attempt carries)."""
    if pause_id is None or pause_id in answered_ids:
        return False
    return answering is None or answering.request_id != pause_id


def resume_reason(attempt: Attempt) -> str | None:
    """Why this Attempt continues from a Checkpoint (its spec.reason: resume:<request>, retry:<class>,
    lease_expired, manual_retry, compensate), or None when it starts from the beginning."""
    return attempt.spec.reason if attempt.spec.resume_from else None


# ---- the hold window -----------------------------------------------------------------------------------
# An Attempt that asked with hold_seconds waits for its answer. Exactly one of two preconditioned writes
# on the Run decides: the operator's acceptance (pendingRequest cleared, phase Running, input recorded)
# or the worker's release (heldBy cleared). The worker reads which one from the Run it observes.


class HoldState(StrEnum):
    WAITING = "waiting"  # the request is still ours to hold
    ANSWERED = "answered"  # the operator accepted an answer while we held it: continue
    ENDED = "ended"  # released, or the Run moved on without us (cancel, expiry, another Attempt)


def hold_state(run: Run, attempt: str, request_id: str) -> HoldState:
    status, pending = run.status, run.status.pending_request
    if pending is not None and pending.request_id == request_id:
        return HoldState.WAITING if pending.held_by == attempt else HoldState.ENDED
    current = status.current_attempt is not None and attempt == attempt_name(
        str(run.metadata.name), status.current_attempt
    )
    if current and status.phase == "Running" and _input_for(run, request_id) is not None:
        return HoldState.ANSWERED
    return HoldState.ENDED


def recorded_value(run: Run, recorded: RecordedInput) -> tuple[bool, JsonValue]:
    """(True, value) of an accepted input: from status.acceptedInput, where the operator kept the newest
    one, or from spec.resume while it still is that answer (a Run whose answer was accepted before
    acceptedInput existed); (False, None) when neither holds it (same request, key and digest)."""
    for held in (run.status.accepted_input, run.spec.resume):
        if (
            held is not None
            and held.request_id == recorded.request_id
            and held.idempotency_key == recorded.idempotency_key
            and json_digest(held.value) == recorded.digest
        ):
            return True, held.value
    return False, None


def held_answer(run: Run, request_id: str) -> tuple[bool, JsonValue]:
    recorded = _input_for(run, request_id)
    return recorded_value(run, recorded) if recorded is not None else (False, None)
