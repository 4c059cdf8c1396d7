"""Compensation that runs: when a Run undoes its side effects, which ones, and what the end of a
compensation Attempt means.

A Run compensates after a cancel (spec.compensation.onCancel: CancelRequested -> Compensating ->
Cancelled), after a final failure (onFailure: -> Compensating -> Failed), or when a person asks on a
terminal Run (spec.compensateRequest: -> Compensating -> back). Compensation Attempts (reason compensate)
do not run the agent: the worker settles the records whose outcome is open with the registered lookups,
then runs the compensations of the confirmed reversible effects, newest first, each through the ledger.
They have a budget of their own (spec.compensation.maxAttempts); what cannot be settled or compensated
sends the Run to NeedsReconciliation (CompensationIncomplete). Pure decisions, no I/O; the
Compensating phase's rule of the Run's table is core.runs.compensation.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final

from agentrun.api import (
    TERMINAL_PHASES,
    Attempt,
    CompensationMode,
    CompensationPolicy,
    CompensationProgress,
    Run,
    RunPhase,
    SideEffect,
    SideEffectState,
    json_digest,
)
from agentrun.core import identity, ledger
from agentrun.core.controls import Verdict

if TYPE_CHECKING:  # core.runs (its CompensateFirst row) asks redirect(): the type only, no cycle
    from agentrun.core.runs.world import World

INCOMPLETE: Final = "CompensationIncomplete"
# Run failures after which no Pod may run for the Run: nothing could compensate, the Run ends as it is.
NO_PODS: Final = frozenset({identity.NOT_ALLOWED, identity.ROLE_NOT_BOUND, identity.NAME_SQUATTED})

# ---- which effects ------------------------------------------------------------------------------------


def _state(record: SideEffect) -> SideEffectState:
    return ledger.state_of(record)


def in_scope(record: SideEffect, effects: Sequence[str] | None) -> bool:
    """Whether a compensation of `effects` (idempotency keys; None or empty: all) covers the record. A
    fork's inherited records never are: their actions are the source's, and only the source (or a
    person) undoes them; the report says so."""
    return (
        not ledger.is_compensation_record(record)
        and not ledger.is_inherited(record)
        and (not effects or record.spec.idempotency_key in effects)
    )


def to_settle(records: Iterable[SideEffect], effects: Sequence[str] | None = None) -> list[SideEffect]:
    """Records whose outcome is still open (Pending or Unknown): settled by lookup before compensating."""
    open_ = (SideEffectState.PENDING, SideEffectState.UNKNOWN)
    return [r for r in records if in_scope(r, effects) and _state(r) in open_]


def confirmed_at(record: SideEffect) -> datetime:
    """When the record became Confirmed (its history), else when it was created."""
    history = record.status.history if record.status and record.status.history else []
    times = [h.time for h in history if h.state == SideEffectState.CONFIRMED]
    return times[-1] if times else (record.metadata.creation_timestamp or datetime.min.replace(tzinfo=UTC))


def compensable(record: SideEffect) -> bool:
    """Confirmed, reversible and with a named compensation: it can and must be undone."""
    return (
        _state(record) == SideEffectState.CONFIRMED
        and record.spec.reversible
        and bool(record.spec.compensation)
        and not ledger.is_compensation_record(record)
        and not ledger.is_inherited(record)
    )


def to_compensate(records: Iterable[SideEffect], effects: Sequence[str] | None = None) -> list[SideEffect]:
    """The effects to undo, in reverse order of confirmation (the newest first, as a saga unwinds)."""
    chosen = [r for r in records if in_scope(r, effects) and compensable(r)]
    return sorted(chosen, key=lambda r: (confirmed_at(r), str(r.metadata.name)), reverse=True)


def needs_compensation(records: Sequence[SideEffect], effects: Sequence[str] | None = None) -> bool:
    """Whether a compensation Attempt has anything to do: a record to settle or an effect to undo."""
    return bool(to_settle(records, effects) or to_compensate(records, effects))


def settle_without_lookup(record: SideEffect) -> bool:
    """A Pending record this SDK wrote with nothing in flight surely did not happen: Failed, no lookup."""
    return _state(record) == SideEffectState.PENDING and ledger.surely_unsent(record)


def settled_state(answer: ledger.Answer) -> SideEffectState | None:
    """What a settling lookup's answer makes of an open record: found -> Confirmed, absent -> Failed (it
    did not happen); None when it cannot tell or answers something else: the record stays open."""
    return {ledger.Answer.FOUND: SideEffectState.CONFIRMED, ledger.Answer.ABSENT: SideEffectState.FAILED}.get(
        answer
    )


# ---- when a Run compensates -----------------------------------------------------------------------------


def policy_of(run: Run) -> CompensationPolicy:
    return run.spec.compensation or CompensationPolicy()  # made here: at import it would build its model


def compensates_on(run: Run, phase: RunPhase) -> bool:
    """Whether the Run's policy compensates when it ends in `phase` (Cancelled or Failed)."""
    policy = policy_of(run)
    wanted = {RunPhase.CANCELLED: policy.on_cancel, RunPhase.FAILED: policy.on_failure}.get(phase)
    return wanted == CompensationMode.COMPENSATE


def redirect(
    world: World, phase: RunPhase, reason: str, fields: dict[str, Any]
) -> tuple[RunPhase, dict[str, Any]]:
    """The phase a transition to `phase` really writes: Compensating instead of Cancelled or Failed when
    the policy asks and something is to be undone (the Run returns to `phase` afterwards), else `phase`.
    Used by every status write that ends a Run, so no path to the end bypasses the compensation."""
    status = world.run.status
    if (
        status.phase == RunPhase.COMPENSATING
        or not compensates_on(world.run, phase)
        or reason in NO_PODS
        or not needs_compensation(world.side_effects)
    ):
        return phase, fields
    current = fields.get("currentAttempt", status.current_attempt) or 0
    progress = {"returnPhase": phase.value, "firstAttempt": current + 1}
    return RunPhase.COMPENSATING, {**fields, "compensating": progress, "nextAttemptTime": None}


# ---- a request from a person --------------------------------------------------------------------------


def request_digest(effects: Sequence[str] | None) -> str:
    keys: list[Any] = sorted(effects or [])
    return json_digest({"effects": keys})


def is_incomplete(run: Run) -> bool:
    """NeedsReconciliation with status.compensating kept: a compensation that could not finish."""
    return run.status.phase == RunPhase.NEEDS_RECONCILIATION and run.status.compensating is not None


def judge(run: Run, records: Sequence[SideEffect]) -> tuple[Verdict, dict[str, Any] | None]:
    """Whether spec.compensateRequest is accepted, and the compensation it starts (None: none starts)."""
    request, status = run.spec.compensate_request, run.status
    assert request is not None
    phase, progress = status.phase, status.compensating
    incomplete = is_incomplete(run)
    if phase not in TERMINAL_PHASES and not incomplete:
        return Verdict(
            False, "NotTerminal", f"the Run is {phase}: only a Succeeded, Failed or Cancelled Run compensates"
        ), None
    effects = list(request.effects or [])
    known = {r.spec.idempotency_key for r in records if not ledger.is_compensation_record(r)}
    if unknown := sorted(set(effects) - known):
        return Verdict(
            False, "UnknownEffect", f"no side effect of the Run has key {', '.join(unknown)}"
        ), None
    if not needs_compensation(records, effects):
        return Verdict(True, "NothingToCompensate", "nothing to settle or compensate"), None
    back = progress.return_phase if incomplete and progress else str(phase)
    started = {"returnPhase": back, "firstAttempt": (status.current_attempt or 0) + 1}
    if effects:
        started["effects"] = effects
    which = ", ".join(effects) if effects else "all side effects"
    return Verdict(True, "Accepted", f"compensating {which}; then {back}"), started


# ---- compensation Attempts ------------------------------------------------------------------------------


def attempt_input(progress: CompensationProgress) -> dict[str, Any] | None:
    """What a compensation Attempt is told (its spec.input): the effects to compensate, when not all."""
    return {"effects": list(progress.effects)} if progress.effects else None


def effects_of(attempt: Attempt) -> list[str] | None:
    """The effects a compensation Attempt compensates (None: all), from its spec.input."""
    value = attempt.spec.input
    effects = value.get("effects") if isinstance(value, dict) else None
    return [str(e) for e in effects] if isinstance(effects, list) and effects else None
