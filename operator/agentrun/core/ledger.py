"""Ledger rules for external side effects: what a worker may do, given what the ledger says.

The ledger (SideEffect objects) is written before an action runs and confirmed after it, so after any
crash the record tells whether the action may have happened. The rules never execute an action whose
record says Confirmed, and never guess about one whose outcome is unknown.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from enum import StrEnum
from functools import cached_property
from typing import Any

from agentrun.api import (
    Attempt,
    AttemptReason,
    RecordedInput,
    Resend,
    Resolution,
    Send,
    SendOutcome,
    SideEffect,
    SideEffectState,
)
from agentrun.api.budgets import ACTION_REQUEST_BUDGET, stored_size
from agentrun.api.sideeffect import MAX_SENDS_KEPT


class Step(StrEnum):
    EXECUTE = "execute"  # nothing was sent, or what was sent surely did not take effect: send (again)
    REUSE = "reuse"  # it happened and its result is recorded (or found): never send it again
    LOOK_UP = "look_up"  # it may have happened: ask the external system by idempotency key
    RECONCILE = "reconcile"  # nobody can tell, or a bound is reached: stop until a person resolves it
    REFUSE = "refuse"  # it failed for good earlier, or the record belongs to another request


class StopReason(StrEnum):
    """Why the ledger stopped an action: the Run's status.failure.reason."""

    KEY_REUSED = "IdempotencyKeyReused"  # same key, another request: refused, never sent
    FAILED = "SideEffectFailed"  # a definite failure recorded earlier
    MAX_SENDS = "MaxSendsReached"  # spec.maxSends or spec.sendDeadlineSeconds reached
    LOOKUP_UNAVAILABLE = "LookupUnavailable"  # the lookup kept failing until the deadline
    CONFLICT = "ConflictingResults"  # answers disagree about the action
    IRREVERSIBLE = "IrreversibleUnknown"  # never re-sent automatically after an unknown outcome
    UNKNOWN = "UnknownSideEffect"  # no lookup, and the external system does not deduplicate by key
    INHERITED_UNKNOWN = "InheritedUnknown"  # a fork's inherited record whose outcome is open


class Answer(StrEnum):
    """What a send or a lookup told."""

    CONFIRMED = "confirmed"  # send: it happened
    FAILED = "failed"  # send: a definite failure that another send cannot mend
    RETRYABLE = "retryable"  # send: a definite transient or rate-limited failure (nothing happened)
    NO_ANSWER = "no_answer"  # send: timeout, lost connection, cancel: it may have happened
    FOUND = "found"  # lookup: it happened
    ABSENT = "absent"  # lookup: it did not happen
    CANNOT_TELL = "cannot_tell"  # lookup: raised, unavailable
    CONFLICT = "conflict"  # lookup: found something other than what was asked


@dataclass(frozen=True)
class Decision:
    step: Step
    reason: StopReason | None = None
    message: str = ""


EXECUTE = Decision(Step.EXECUTE)
REUSE = Decision(Step.REUSE)
LOOK_UP = Decision(Step.LOOK_UP)


def _stop(reason: StopReason, message: str) -> Decision:
    return Decision(Step.RECONCILE, reason, message)


def side_effect_name(run_name: str, idempotency_key: str) -> str:
    """SideEffect objects are named from a hash of the Run's name and the key: one record per external
    action of a Run. The ledger is the Run's: the same key in two Runs names two records (a NUL cannot
    occur in a Run's name, so no other pair hashes the same text)."""
    return "sfx-" + hashlib.sha256(f"{run_name}\0{idempotency_key}".encode()).hexdigest()[:32]


def foreign_record(record: Mapping[str, Any], run_name: str, run_uid: str | None) -> str | None:
    """Why an existing Checkpoint or SideEffect is not this Run's (None: it is): its spec.runName and its
    owner (the Run's UID) must both be the Run's, or it was put there by someone else."""
    metadata, spec = record.get("metadata") or {}, record.get("spec") or {}
    kind, name = record.get("kind") or "record", metadata.get("name")
    if spec.get("runName") != run_name:
        return f"{kind} {name} belongs to Run {spec.get('runName')!r}, not {run_name!r}: it is never used"
    owners = [ref.get("uid") for ref in metadata.get("ownerReferences") or [] if ref.get("kind") == "Run"]
    if not run_uid or run_uid not in owners:
        return f"{kind} {name} names Run {run_name} but is not owned by it (uid {run_uid}): it is never used"
    return None


# --- request digests: RFC 8785 (JSON Canonicalization Scheme) -------------------------------------------


def _jcs_number(value: float) -> str:
    """A number as ECMAScript prints it (RFC 8785 3.2.2.3): integers without a fraction, plain notation
    from 1e-6 up to 1e21, shortest round-trip digits."""
    if not math.isfinite(value):
        raise ValueError("a request digest cannot hold NaN or Infinity (not JSON)")
    if value == 0:
        return "0"
    if value.is_integer() and abs(value) < 1e21:
        return str(int(value))
    digits = repr(value)  # shortest round-trip, as ECMAScript's
    if "e" not in digits:
        return digits
    mantissa, exponent = digits.split("e")
    power = int(exponent)
    if -7 < power < 21:
        return format(Decimal(digits), "f")
    return f"{mantissa.removesuffix('.0')}e{'+' if power > 0 else '-'}{abs(power)}"


def canonical_json(value: Any) -> str:
    """RFC 8785 canonical JSON: keys sorted by UTF-16 code units, no whitespace, ECMAScript numbers,
    strings with only the mandatory escapes."""
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _jcs_number(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, Mapping):
        items = sorted(value.items(), key=lambda item: str(item[0]).encode("utf-16-be"))
        return "{" + ",".join(f"{canonical_json(str(k))}:{canonical_json(v)}" for k, v in items) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(canonical_json(v) for v in value) + "]"
    raise TypeError(f"a request must be JSON, not {type(value).__name__}")


def request_digest(tool: str, target: str | None, request: Any = None) -> str:
    """sha256 of the canonical JSON of {tool, target, request}: what the key was first used for."""
    canonical = canonical_json({"tool": tool, "target": target, "request": request})
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


# --- the recovery rule ---------------------------------------------------------------------------------
# Seed 2: "no success answer only means the result is invisible, not that the action did not happen".
# Every send is recorded before it goes out, so an in-flight send (no outcome) after a crash means
# "maybe": it is looked up, never re-sent blindly. The SDK applies these decisions; they do no I/O.


def state_of(record: SideEffect) -> SideEffectState:
    return record.status.state if record.status else SideEffectState.PENDING


def all_sends(record: SideEffect) -> list[Send]:
    return list(record.status.sends or []) if record.status else []


def round_sends(record: SideEffect) -> list[Send]:
    """The sends maxSends counts: those since a person last resolved the record Absent."""
    sends, status = all_sends(record), record.status
    if status and status.resolution == Resolution.ABSENT:
        return sends[status.resolved_sends or 0 :]
    return sends


def references_seen(record: SideEffect) -> set[str]:
    """External references that earlier answers (sends, lookups) named for this action."""
    seen = {s.reference for s in all_sends(record) if s.reference}
    if record.status and record.status.external_reference:
        seen.add(record.status.external_reference)
    return seen


def deadline_of(record: SideEffect) -> datetime | None:
    """No send nor lookup after this: sendDeadlineSeconds from the round's first send."""
    sends = round_sends(record)
    if not sends:
        return None
    return sends[0].time + timedelta(seconds=record.spec.send_deadline_seconds)


def send_again(record: SideEffect, now: datetime, wait: float = 0.0) -> Decision:
    """Whether one more send (after `wait` seconds) stays within maxSends and the deadline."""
    sent = len(round_sends(record))
    if sent >= record.spec.max_sends or len(all_sends(record)) >= MAX_SENDS_KEPT:
        return _stop(StopReason.MAX_SENDS, f"sent {sent} times (maxSends {record.spec.max_sends})")
    deadline = deadline_of(record)
    if deadline is not None and now + timedelta(seconds=wait) > deadline:
        return _stop(
            StopReason.MAX_SENDS,
            f"the send deadline ({record.spec.send_deadline_seconds}s after the first send) is reached",
        )
    return EXECUTE


@dataclass(frozen=True)
class Recorded:
    """What next_step decides from: an action's record, read before anything is sent."""

    record: SideEffect
    digest: str
    now: datetime

    # Derived once per decision: several rules ask, and round_sends copies the record's list.
    @cached_property
    def state(self) -> SideEffectState:
        return state_of(self.record)

    @cached_property
    def last_send(self) -> Send | None:
        sends = round_sends(self.record)
        return sends[-1] if sends else None


def _key_reused(r: Recorded) -> Decision | None:
    """The key was recorded for another request digest: refused, never sent."""
    if r.record.spec.request_digest and r.record.spec.request_digest != r.digest:
        key = r.record.spec.idempotency_key
        return Decision(
            Step.REFUSE, StopReason.KEY_REUSED, f"key {key} was used for another request: refused, never sent"
        )
    return None


def _took_effect(r: Recorded) -> Decision | None:
    """Confirmed (or since compensated): its result is reused, nothing is sent."""
    return REUSE if r.state in (SideEffectState.CONFIRMED, SideEffectState.COMPENSATED) else None


def _failed(r: Recorded) -> Decision | None:
    """Failed for good, unless a person said it did not happen and nothing was sent since: then a
    fresh round of sends."""
    if r.state != SideEffectState.FAILED:
        return None
    status = r.record.status
    if status and status.resolution == Resolution.ABSENT and r.last_send is None:
        return send_again(r.record, r.now)
    return Decision(Step.REFUSE, StopReason.FAILED, "it failed for good earlier")


def _inherited_open(r: Recorded) -> Decision | None:
    """A record a fork inherited from its source, whose outcome is open: the fork never looks it up or
    sends it (the source's Attempt may still be deciding it); a person resolves it first."""
    status = r.record.status
    if status is None or status.inherited_from is None:
        return None
    if r.state not in (SideEffectState.PENDING, SideEffectState.UNKNOWN):
        return None
    source = status.inherited_from
    return _stop(
        StopReason.INHERITED_UNKNOWN,
        f"inherited from Run {source.run} ({source.record}) with its outcome open: resolve it first",
    )


def _conflicting(r: Recorded) -> Decision | None:
    """Answers contradicted each other earlier: a person decides."""
    status = r.record.status
    return _stop(StopReason.CONFLICT, status.conflict.message) if status and status.conflict else None


def _nothing_sent(r: Recorded) -> Decision | None:
    """No send recorded this round. Pending with an operationId: recorded by this SDK, which records
    every send before it goes out, so nothing was sent. Without one (an older SDK, which recorded no
    sends), or Unknown (marked so from outside): it may have been sent, look it up."""
    if r.last_send is not None:
        return None
    if r.state == SideEffectState.PENDING and r.record.spec.operation_id:
        return send_again(r.record, r.now)
    return LOOK_UP


def _in_flight(r: Recorded) -> Decision | None:
    """The last send has no outcome (a crash) or an unknown one: look it up."""
    last = r.last_send
    return LOOK_UP if last is not None and last.outcome in (None, SendOutcome.UNKNOWN) else None


def _looked_up_absent(r: Recorded) -> Decision | None:
    """The last lookup found nothing: as after_lookup decides on an absent answer."""
    last = r.last_send
    if last is not None and last.outcome == SendOutcome.ABSENT:
        return after_lookup(Answer.ABSENT, r.record, r.now)
    return None


def _definite_transient(r: Recorded) -> Decision:
    """The last send failed definitely and retryably: sent again within the bounds."""
    return send_again(r.record, r.now)


# First match wins; the last rule applies to every record the others leave.
NEXT_STEP: tuple[Callable[[Recorded], Decision | None], ...] = (
    _key_reused,
    _took_effect,
    _failed,
    _inherited_open,
    _conflicting,
    _nothing_sent,
    _in_flight,
    _looked_up_absent,
    _definite_transient,
)


def next_step(record: SideEffect | None, digest: str, now: datetime) -> Decision:
    """What to do about an action, given its record (read before anything is sent): the first rule of
    NEXT_STEP that decides."""
    if record is None:
        return EXECUTE
    recorded = Recorded(record, digest, now)
    return next(d for rule in NEXT_STEP if (d := rule(recorded)) is not None)


def after_unknown(record: SideEffect, can_look_up: bool, now: datetime) -> Decision:
    """A send got no answer: look it up, or decide without a lookup."""
    if can_look_up:
        return LOOK_UP
    if not record.spec.reversible:
        return _stop(StopReason.IRREVERSIBLE, "irreversible, outcome unknown, no lookup: a person decides")
    if record.spec.resend == Resend.WITH_SAME_KEY:
        return send_again(record, now)  # the external system deduplicates by key
    return _stop(StopReason.UNKNOWN, "outcome unknown, no lookup and resend Never: a person decides")


def after_lookup(answer: Answer, record: SideEffect, now: datetime, reference: str | None = None) -> Decision:
    """What a lookup by key told, after a send without answer."""
    if answer == Answer.CONFLICT:
        return _stop(StopReason.CONFLICT, "the lookup found something other than what was asked")
    if answer == Answer.FOUND:
        return _found(record, reference)
    if answer == Answer.ABSENT:
        if not record.spec.reversible:
            return _stop(StopReason.IRREVERSIBLE, "irreversible: never re-sent after an unknown outcome")
        return send_again(record, now)
    deadline = deadline_of(record)
    if deadline is None or now >= deadline:
        return _stop(StopReason.LOOKUP_UNAVAILABLE, "the lookup could not tell until the send deadline")
    return LOOK_UP  # ask again, after a backoff


def _found(record: SideEffect, reference: str | None) -> Decision:
    """Found by its key: it took effect, unless the reference differs from what earlier answers named."""
    seen = references_seen(record)
    if reference and seen and reference not in seen:
        named = ", ".join(sorted(seen))
        return _stop(StopReason.CONFLICT, f"the lookup names {reference}, earlier answers named {named}")
    return REUSE


def after_send(answer: Answer, record: SideEffect, now: datetime, wait: float = 0.0) -> Decision:
    """What a send's answer means; `record` already holds the send with its outcome."""
    if answer == Answer.CONFIRMED:
        return REUSE
    if answer == Answer.FAILED:
        return Decision(Step.REFUSE, StopReason.FAILED, "a definite failure")
    if answer == Answer.RETRYABLE:
        return send_again(record, now, wait)  # nothing happened: the same key again, within the bounds
    return after_unknown(record, True, now)  # NO_ANSWER: the caller knows whether it can look up


def backoff(tries: int, retry_after: float | None = None, cap: float = 30.0) -> float:
    """Seconds before the next send or lookup: capped exponential, never sooner than retry_after."""
    delay: float = min(0.5 * 2.0 ** max(tries - 1, 0), cap)
    return max(delay, float(retry_after or 0.0))


CANCELLED_IN_FLIGHT = "in flight when the Run was cancelled: it may have happened (marked by the operator)"
CANCELLED_UNSENT = "the Run was cancelled with nothing in flight: it did not happen (marked by the operator)"
FAILED_IN_FLIGHT = "in flight when the Run failed: it may have happened (marked by the operator)"
FAILED_UNSENT = "the Run failed with nothing in flight: it did not happen (marked by the operator)"


def surely_unsent(record: SideEffect) -> bool:
    """Recorded by this SDK (operationId) and nothing in flight: never sent, or every send answered a
    definite failure (or was looked up absent). Anything else may have happened."""
    if not record.spec.operation_id:
        return False
    sends = all_sends(record)
    return not sends or sends[-1].outcome in (SendOutcome.FAILED, SendOutcome.ABSENT)


def settle_after_cancel(
    records: Iterable[SideEffect], now: str, max_history: int, *, failed: bool = False
) -> list[tuple[str, dict[str, Any], str | None]]:
    """(name, status patch, resourceVersion) for each Pending record of a Cancelled (or `failed`) Run,
    whose Attempt is gone: Unknown when a send may have taken effect, Failed when surely nothing did. A
    Run that ended never leaves a record Pending. Preconditioned on the record as read."""
    in_flight, unsent_note = (
        (FAILED_IN_FLIGHT, FAILED_UNSENT) if failed else (CANCELLED_IN_FLIGHT, CANCELLED_UNSENT)
    )
    patches = []
    for record in records:
        if state_of(record) != SideEffectState.PENDING:
            continue
        unsent = surely_unsent(record)
        state = SideEffectState.FAILED if unsent else SideEffectState.UNKNOWN
        history = [h.to_api() for h in (record.status.history or [])] if record.status else []
        entry = {
            "state": state.value,
            "time": now,
            "message": unsent_note if unsent else in_flight,
        }
        patch = {"state": state.value, "history": [*history, entry][-max_history:]}
        patches.append((str(record.metadata.name), patch, record.metadata.resource_version))
    return patches


def unknown_reason(records: Iterable[SideEffect]) -> StopReason:
    """The reason a Run whose records are unresolved needs reconciliation, read from the records (for a
    failure that did not name it: a crash, an older SDK)."""
    records = list(records)
    if any(r.status and r.status.conflict for r in records):
        return StopReason.CONFLICT
    if any(not r.spec.reversible and state_of(r) == SideEffectState.UNKNOWN for r in records):
        return StopReason.IRREVERSIBLE
    return StopReason.UNKNOWN


# --- approvals ------------------------------------------------------------------------------------------
# A gated action asks for approval with an interrupt whose request id names its SideEffect. The answer
# reaches the worker as the spec.input of the Attempt that resumes (written by the operator, immutable),
# and the operator, not the worker, records it on the SideEffect: a Pod may never write an approval.


def approval_request_id(side_effect: str, digest: str | None = None) -> str:
    """The id of the interrupt that asks to approve the action recorded as SideEffect `side_effect`, for
    the request of that digest: an approval of one request never approves another under the same key."""
    suffix = f"-{digest.removeprefix('sha256:')[:16]}" if digest else ""
    return f"approve-{side_effect}{suffix}"


def approval_action(  # noqa: PLR0917 (the action's fields, in their order)
    tool: str, target: str | None, key: str, request: Any, digest: str, reversible: bool
) -> dict[str, Any]:
    """pendingRequest.action: what the person approving is shown, so they approve what is sent. The
    request goes inline within its budget, else only its size (its digest still binds the approval)."""
    action: dict[str, Any] = {"tool": tool, "idempotencyKey": key, "requestDigest": digest}
    if target is not None:
        action["target"] = target
    size = stored_size(request)
    if size <= ACTION_REQUEST_BUDGET:
        action["request"] = request
    else:
        action["requestBytes"] = size
    action["reversible"] = reversible
    return action


def approval_answer(attempts: Iterable[Attempt], request_id: str) -> Any:
    """The accepted answer to approval request `request_id`: the input of the Attempt that resumed with
    it (None if it was not answered)."""
    reason = AttemptReason.resume(request_id)
    return next((a.spec.input for a in attempts if a.spec.reason == reason), None)


def approved(answer: Any) -> bool:
    return isinstance(answer, dict) and answer.get("approved") is True


def approval_holds(record: SideEffect | None, digest: str) -> bool:
    """Whether the record carries an approval of this very request."""
    approval = record.status.approval if record and record.status else None
    return approval is not None and approval.request_id == approval_request_id(
        str(record.metadata.name) if record else "", digest
    )


def needs_approval(requires_approval: bool, reversible: bool, irreversible_gated: bool) -> bool:
    """An action waits for a person if the agent asks, or if it is irreversible under
    spec.approvals.irreversible."""
    return requires_approval or (irreversible_gated and not reversible)


def approvals_to_record(
    side_effects: Iterable[SideEffect],
    attempts: Iterable[Attempt],
    now: str,
    inputs: Iterable[RecordedInput] | None = None,
) -> list[tuple[str, dict[str, Any]]]:
    """(SideEffect name, status.approval) for each approval given (an Attempt resumed with an approving
    answer to the request of the record's digest) but not yet recorded on it; `inputs` (the Run's
    status.inputs) name who approved."""
    attempts = list(attempts)
    approvers = {i.request_id: i.answered_by for i in inputs or [] if i.answered_by}
    found = []
    for effect in side_effects:
        if effect.status and effect.status.approval:
            continue
        name, digest = str(effect.metadata.name), effect.spec.request_digest
        request_id = approval_request_id(name, digest)
        if approved(approval_answer(attempts, request_id)):
            approval: dict[str, Any] = {"requestId": request_id, "time": now}
            if digest:
                approval["requestDigest"] = digest
            if request_id in approvers:
                approval["approvedBy"] = approvers[request_id]
            found.append((name, approval))
    return found


# --- compensation records -----------------------------------------------------------------------------
# A compensation is itself an external action, so it goes through the same ledger and recovery rule: one
# record per compensated effect, under the effect's key with this suffix and marked by its step.

COMPENSATE_SUFFIX = ":compensate"
COMPENSATION_STEP = "compensate"


def compensation_key(key: str) -> str:
    """The idempotency key of the compensation of the effect recorded under `key`."""
    return key + COMPENSATE_SUFFIX


def is_inherited(record: SideEffect) -> bool:
    """Whether a fork inherited the record from its source (written by the operator): its action is the
    source's, reused but never executed nor compensated by the fork."""
    return record.status is not None and record.status.inherited_from is not None


def is_compensation_record(record: SideEffect) -> bool:
    """Whether the record is the compensation of another record, not one of the agent's own effects."""
    return record.spec.step == COMPENSATION_STEP and record.spec.idempotency_key.endswith(COMPENSATE_SUFFIX)
