"""Compensation Attempts: undo what the Run did outside, through the same ledger, without the agent.

An Attempt with reason `compensate` first settles every record whose outcome is open (Pending, Unknown)
with the lookup registered for its tool, then runs the compensations of the confirmed reversible effects,
newest first. Each compensation is itself a ledger entry (key `<key>:compensate`, the recovery rule of
worker.effects), so a compensation Attempt killed midway and retried finds what it already did and never
does it twice; only then is the original record marked Compensated. It writes nothing on the Run.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from agentrun.api import Attempt, Resend, SendOutcome, SideEffect, SideEffectState
from agentrun.core import compensation as rules
from agentrun.core.ledger import (
    COMPENSATION_STEP,
    Answer,
    all_sends,
    compensation_key,
    state_of,
)
from agentrun.worker.effects import Effect, Ledger, _call
from agentrun.worker.errors import ConflictingResult, TransientError, UnknownSideEffect

log = logging.getLogger("agentrun.worker")
Lookup = Callable[[str], Any]


@dataclass(frozen=True)
class Compensation:
    """How to undo one kind of effect: `fn(effect)` undoes it (an Effect: reference, result, key);
    `lookup(effect)` returns the compensation's result if it already took effect, None if not, and
    raises when it cannot tell. Without a lookup an unknown outcome is sent again only with
    resend="WithSameKey" (the external system deduplicates); the other fields are the ledger's bounds."""

    fn: Callable[[Effect], Any]
    lookup: Callable[[Effect], Any] | None = None
    resend: str = "Never"
    unknown_on: tuple[type[BaseException], ...] = ()
    max_sends: int = 3
    send_deadline_seconds: int = 300


Registered = Compensation | Callable[[Effect], Any]


def registry(compensations: Mapping[str, Registered] | None) -> dict[str, Compensation]:
    """A bare callable is a Compensation without lookup."""
    return {
        name: c if isinstance(c, Compensation) else Compensation(c)
        for name, c in (compensations or {}).items()
    }


async def compensate(
    session_ledger: Ledger,
    attempt: Attempt,
    compensations: Mapping[str, Registered] | None,
    lookups: Mapping[str, Lookup] | None,
) -> None:
    """Does what a compensation Attempt is for; raises UnknownSideEffect (CompensationIncomplete) when
    a record cannot be settled or compensated, TransientError when a lookup cannot tell now."""
    undo, find = registry(compensations), dict(lookups or {})
    scope = rules.effects_of(attempt)
    open_: list[str] = []  # needs a person
    unsure: list[str] = []  # another Attempt may tell
    for record in rules.to_settle(await session_ledger.records(), scope):
        verdict = await _settle(session_ledger, record, find.get(record.spec.tool))
        if verdict is not None:
            (unsure if verdict == Answer.CANNOT_TELL else open_).append(f"{record.metadata.name}")
    for record in rules.to_compensate(await session_ledger.records(), scope):
        how = undo.get(record.spec.compensation)
        if how is None:
            open_.append(f"{record.metadata.name} (no compensation {record.spec.compensation!r} registered)")
            continue
        await _undo(session_ledger, record, how)
    if open_:
        raise UnknownSideEffect(f"cannot settle or compensate {', '.join(open_[:5])}", rules.INCOMPLETE)
    if unsure:
        raise TransientError(f"the lookups could not tell the outcome of {', '.join(unsure[:5])} yet")


async def _settle(ledger: Ledger, record: SideEffect, lookup: Lookup | None) -> Answer | None:
    """Settles an open record by lookup (never by sending): None when settled, else the answer that
    left it open (CANNOT_TELL: another Attempt may tell; anything else needs a person)."""
    if rules.settle_without_lookup(record):
        await ledger.note(record, SideEffectState.FAILED, "settled before compensating: it was never sent")
        return None
    if lookup is None:
        return Answer.NO_ANSWER  # nobody registered how to find out
    key = record.spec.idempotency_key
    try:
        result = await _call(lookup, key)
        answer = Answer.ABSENT if result is None else Answer.FOUND
    except ConflictingResult as exc:
        log.warning("settling lookup of %s found a conflicting result: %s", key, exc)
        return Answer.CONFLICT
    except Exception as exc:
        log.warning("settling lookup of %s failed: %s", key, exc)
        return Answer.CANNOT_TELL
    state = rules.settled_state(answer)
    assert state is not None
    sends = [s.to_api() for s in all_sends(record)]
    if sends and sends[-1].get("outcome") in (None, SendOutcome.UNKNOWN.value):
        sends[-1]["outcome"] = (SendOutcome.CONFIRMED if answer == Answer.FOUND else SendOutcome.ABSENT).value
    fields: dict[str, Any] = {"resolvedBy": f"lookup by {ledger.me.attempt}"}
    if sends:
        fields["sends"] = sends
    if answer == Answer.FOUND:
        reference = Ledger._reference(result, None)
        fields |= {"result": result, **({"externalReference": reference} if reference else {})}
        message = "found by lookup before compensating"
    else:
        message = "not found by lookup before compensating: it did not happen"
    await ledger.note(record, state, message, **fields)
    return None


async def _undo(ledger: Ledger, record: SideEffect, how: Compensation) -> None:
    """Runs one compensation through the ledger (key <key>:compensate), then marks the effect
    Compensated: only once the compensation's own record is Confirmed."""
    effect = await ledger._effect(record, None, executed_now=False)
    find = how.lookup

    def look_up(_key: str) -> Any:
        assert find is not None
        return find(effect)

    done = await ledger.perform(
        tool=record.spec.compensation,
        key=compensation_key(record.spec.idempotency_key),
        target=effect.reference or record.spec.target,
        execute=lambda _key: how.fn(effect),
        lookup=look_up if find is not None else None,
        compensation=None,
        # Undoing may be sent again after a lookup found it not done: it repeats nothing that stands.
        reversible=True,
        step=COMPENSATION_STEP,
        reference_of=None,
        unknown_on=how.unknown_on,
        request={"compensates": str(record.metadata.name), "reference": effect.reference},
        resend=Resend(how.resend),
        max_sends=how.max_sends,
        send_deadline_seconds=how.send_deadline_seconds,
    )
    if state_of(record) == SideEffectState.CONFIRMED and done.state == SideEffectState.CONFIRMED:
        await ledger.note(
            record,
            SideEffectState.COMPENSATED,
            f"compensated by {record.spec.compensation} (SideEffect {done.name})",
        )
