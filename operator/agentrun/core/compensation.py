"""Compensation that runs: when a Run undoes its side effects, which ones, and what the end of a
compensation Attempt means.

A Run compensates after a cancel (spec.compensation.onCancel: CancelRequested -> Compensating ->
Cancelled), after a final failure (onFailure: -> Compensating -> Failed), or when a person asks on a
terminal Run (spec.compensateRequest: -> Compensating -> back). Compensation Attempts (reason compensate)
do not run the agent: the worker settles the records whose outcome is open with the registered lookups,
then runs the compensations of the confirmed reversible effects, newest first, each through the ledger.
They have a budget of their own (spec.compensation.maxAttempts); what cannot be settled or compensated
sends the Run to NeedsReconciliation (CompensationIncomplete). Pure decisions, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Final

from agentrun.api import (
    FINISHED_ATTEMPT_PHASES,
    Attempt,
    AttemptFailure,
    AttemptPhase,
    AttemptReason,
    CompensationMode,
    CompensationPolicy,
    CompensationProgress,
    ControlOp,
    FailureClass,
    Run,
    RunPhase,
    SideEffect,
    SideEffectState,
    json_digest,
)
from agentrun.core import controls, failures, identity, ledger
from agentrun.core.conditions import TERMINAL_PHASES
from agentrun.core.controls import KeyUse, Verdict
from agentrun.core.plan import CreateAttempt, DeletePod, PatchAttemptStatus, WriteLease
from agentrun.core.retry import decide_retry

if TYPE_CHECKING:  # decision imports this module: the type only, to avoid a cycle
    from agentrun.core.decision import Decision, World
    from agentrun.core.pods import PodView

INCOMPLETE: Final = "CompensationIncomplete"
RECHECK_SECONDS: Final = 5.0
# Run failures after which no Pod may run for the Run: nothing could compensate, the Run ends as it is.
NO_PODS: Final = frozenset({identity.NOT_ALLOWED, identity.NAME_SQUATTED})
DEFAULT_POLICY: Final = CompensationPolicy()

# ---- which effects ------------------------------------------------------------------------------------


def _state(record: SideEffect) -> SideEffectState:
    return ledger.state_of(record)


def in_scope(record: SideEffect, effects: Sequence[str] | None) -> bool:
    """Whether a compensation of `effects` (idempotency keys; None or empty: all) covers the record."""
    return not ledger.is_compensation_record(record) and (
        not effects or record.spec.idempotency_key in effects
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
    return run.spec.compensation or DEFAULT_POLICY


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


def judge(run: Run, records: Sequence[SideEffect]) -> tuple[Verdict, dict[str, Any] | None]:
    """Whether spec.compensateRequest is accepted, and the compensation it starts (None: none starts)."""
    request, status = run.spec.compensate_request, run.status
    assert request is not None
    phase, progress = status.phase, status.compensating
    incomplete = phase == RunPhase.NEEDS_RECONCILIATION and progress is not None
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


def judge_request(d: Decision) -> bool:
    """Judges spec.compensateRequest once per key (like the other control requests); True when it was,
    so the Run waits for that write."""
    run = d.run
    request = run.spec.compensate_request
    if request is None:
        return False
    key, digest = request.idempotency_key, request_digest(request.effects)
    use = controls.key_use(run, key, ControlOp.COMPENSATE, digest)
    if use == KeyUse.REPEAT:
        return False
    verdict, started = (
        judge(run, d.w.side_effects) if use == KeyUse.NEW else (controls.key_refusal(use, key), None)
    )
    record = controls.control_record(ControlOp.COMPENSATE, key, digest, verdict, d.w.now)
    spent = controls.with_spent(run, key, ControlOp.COMPENSATE, digest) if use == KeyUse.NEW else None
    if started is None:
        d.record_control(record, spent=spent)
        if not verdict.accepted:
            d.event("Warning", "CompensateRejected", f"{verdict.reason}: {verdict.message}")
        return True
    d.set_phase(
        RunPhase.COMPENSATING,
        "CompensateRequested",
        verdict.message,
        controls=controls.with_record(run, record),
        spentKeys=spent,
        compensating=started,
        nextAttemptTime=None,
    )
    d.event("Normal", "CompensateRequested", verdict.message)
    return True


# ---- compensation Attempts ------------------------------------------------------------------------------


def attempt_input(progress: CompensationProgress) -> dict[str, Any] | None:
    """What a compensation Attempt is told (its spec.input): the effects to compensate, when not all."""
    return {"effects": list(progress.effects)} if progress.effects else None


def effects_of(attempt: Attempt) -> list[str] | None:
    """The effects a compensation Attempt compensates (None: all), from its spec.input."""
    value = attempt.spec.input
    effects = value.get("effects") if isinstance(value, dict) else None
    return [str(e) for e in effects] if isinstance(effects, list) and effects else None


def supervise(d: Decision, attempt: Attempt | None, pod: PodView | None) -> None:
    """Phase Compensating: start, watch and conclude compensation Attempts within their own budget."""
    progress = d.status.compensating
    if progress is None:  # written by hand or by an older operator: nothing says where to return
        _incomplete(d, "the Run is Compensating without status.compensating: nothing says what to undo")
        return
    current, first = d.status.current_attempt or 0, progress.first_attempt
    if _earlier_still_running(d, first):
        return  # an Attempt still sending could race the compensation: it goes first
    if current < first:
        _grant(d, first, progress)
    elif attempt is None:  # a grant interrupted after the Run's write: create what it promised
        promised = d.attempt_object(
            current, d.status.lease_epoch or 0, AttemptReason.COMPENSATE, attempt_input(progress)
        )
        d.plan.add(CreateAttempt(promised.to_api()))
        d.ensure_pod(promised)
    elif attempt.status.phase in FINISHED_ATTEMPT_PHASES:
        ok = attempt.status.phase == AttemptPhase.SUCCEEDED
        _after(d, attempt, None if ok else attempt.status.failure or failures.pod_lost(), progress, seen=True)
    elif pod is None:
        if attempt.status.start_time is None:
            d.ensure_pod(attempt)  # not created yet, or not in the cache yet: creating is idempotent
        else:
            _end(d, attempt, AttemptPhase.FAILED, failures.pod_lost(), progress)
    elif pod.finished:
        end = pod.exit or failures.ContainerExit(exit_code=0 if pod.phase == "Succeeded" else 1)
        failure = failures.classify_exit(end)
        _end(d, attempt, AttemptPhase.FAILED if failure else AttemptPhase.SUCCEEDED, failure, progress)
    else:
        _watch(d, attempt, pod, progress)


def _earlier_still_running(d: Decision, first: int) -> bool:
    """Ends the Attempts before the compensation that have not ended (aborted, their Pods stopped); True
    while one of their Pods is still there."""
    waiting = False
    for number, attempt in d.w.attempts.items():
        if number >= first:
            continue
        if attempt.status.phase not in FINISHED_ATTEMPT_PHASES:
            d.finish_attempt(
                attempt, AttemptPhase.ABORTED, failures.failure(FailureClass.CANCELLED, "the Run compensates")
            )
        pod = d.w.pods.get(str(attempt.metadata.name))
        if pod is not None and not pod.finished:
            if not pod.deleting:
                d.plan.add(DeletePod(pod.name))
            waiting = True
    if waiting:
        d.plan.wake_in(RECHECK_SECONDS)  # the Pod's end wakes us sooner
    return waiting


def _grant(d: Decision, number: int, progress: CompensationProgress) -> None:
    d.grant(number, AttemptReason.COMPENSATE, attempt_input(progress), phase=RunPhase.COMPENSATING)


def _watch(d: Decision, attempt: Attempt, pod: PodView, progress: CompensationProgress) -> None:
    """A compensation Attempt at work: record that it runs, and take its lease over when it expires."""
    name, w = str(attempt.metadata.name), d.w
    if pod.running_since and attempt.status.phase != AttemptPhase.RUNNING:
        patch = {
            "phase": "Running",
            "startTime": pod.running_since,
            "podName": pod.name,
            "traceId": d.trace_id,
        }
        d.plan.add(PatchAttemptStatus(name, patch, attempt.metadata.resource_version))
    lease = w.lease
    holds = lease is not None and lease.holder == name and lease.epoch == attempt.spec.lease_epoch
    if not holds or w.lease_expires_in is None or not pod.running_since:
        d.plan.wake_in(RECHECK_SECONDS)
    elif w.lease_expires_in > 0:
        d.plan.wake_at_lease_expiry(w.lease_expires_in + 0.05)
    else:
        assert lease is not None
        epoch = lease.epoch + 1  # revoked: a late write of the frozen worker is refused
        d.plan.add(WriteLease(None, epoch, d.run.spec.lease.duration_seconds, lease.resource_version))
        d.plan.add(DeletePod(pod.name, grace_seconds=0))
        lost = failures.lease_lost(d.run.spec.lease.duration_seconds)
        _end(d, attempt, AttemptPhase.LEASE_LOST, lost, progress, leaseEpoch=epoch)


def _end(
    d: Decision,
    attempt: Attempt,
    phase: AttemptPhase,
    failure: AttemptFailure | None,
    progress: CompensationProgress,
    **fields: Any,
) -> None:
    d.finish_attempt(attempt, phase, failure)
    ok = phase == AttemptPhase.SUCCEEDED
    _after(d, attempt, None if ok else failure or failures.pod_lost(), progress, seen=False, **fields)


def _after(
    d: Decision,
    attempt: Attempt,
    failure: AttemptFailure | None,
    progress: CompensationProgress,
    *,
    seen: bool,
    **fields: Any,
) -> None:
    """The compensation Attempt ended (failure None: it did all it had to), recorded now or `seen`
    recorded before: back to the Run's phase, another compensation Attempt after a backoff, or
    NeedsReconciliation. The worker ends a compensation Attempt well only when everything in its scope
    is settled and compensated; anything left open makes it fail with unknown_side_effect."""
    if failure is None:
        _return(d, progress, **fields)
        return
    due = d.status.next_attempt_time
    if seen and due is not None:
        if d.w.now >= due:
            _grant(d, attempt.spec.number + 1, progress)
        else:
            d.plan.wake_in((due - d.w.now).total_seconds())
        return
    retry, message = retry_after_failure(d, attempt.spec.number, failure, progress)
    if retry is None:
        _incomplete(d, message, **fields)
        return
    at = d.w.now + timedelta(seconds=retry)
    if at.microsecond:  # status holds whole seconds: round up, so the retry never starts early
        at = at.replace(microsecond=0) + timedelta(seconds=1)
    text = f"compensation Attempt {attempt.spec.number} failed ({failure.failure_class}: {failure.message}); "
    d.set_phase(
        RunPhase.COMPENSATING,
        "CompensationRetry",
        text + f"the next starts at {at.strftime('%Y-%m-%dT%H:%M:%SZ')}",
        nextAttemptTime=at.strftime("%Y-%m-%dT%H:%M:%SZ"),
        **fields,
    )
    d.event("Normal", "CompensationRetry", message)
    d.plan.wake_in((at - d.w.now).total_seconds())


def retry_after_failure(
    d: Decision, number: int, failure: AttemptFailure, progress: CompensationProgress
) -> tuple[float | None, str]:
    """(seconds until the next compensation Attempt, or None: give up; why). The Run's retry policy
    decides with spec.compensation.maxAttempts as the budget; an open or conflicting record
    (unknown_side_effect) needs a person, never another try."""
    if failure.failure_class == FailureClass.UNKNOWN_SIDE_EFFECT:
        return None, failure.message or "a side effect could not be settled or compensated"
    budget = policy_of(d.run).max_attempts
    policy = d.run.spec.retry.model_copy(update={"max_attempts": budget})
    history = [d.w.failure_of(n) for n in range(progress.first_attempt, number)] + [failure]
    decision = decide_retry(
        policy, number - progress.first_attempt + 1, history, seed=str(d.run.metadata.uid)
    )
    if not decision.retry:
        return None, f"{decision.message}; last failure: {failure.message}"
    return max(decision.delay_seconds, float(failure.retry_after_seconds or 0)), decision.message


def _return(d: Decision, progress: CompensationProgress, **fields: Any) -> None:
    phase = RunPhase(progress.return_phase)
    message = f"side effects compensated; the Run is {phase.value} again"
    failure = d.status.failure
    if failure is not None and failure.reason == INCOMPLETE and phase != RunPhase.FAILED:
        fields["failure"] = None  # the incomplete compensation was completed: nothing failed
    d.set_phase(phase, "Compensated", message, compensating=None, nextAttemptTime=None, **fields)
    d.event("Normal", "Compensated", message)


def _incomplete(d: Decision, message: str, **fields: Any) -> None:
    text = f"{INCOMPLETE}: {message}; resolve the SideEffects, then ask again (spec.compensateRequest)"
    d.set_phase(
        RunPhase.NEEDS_RECONCILIATION,
        INCOMPLETE,
        text,
        failure={
            "class": FailureClass.UNKNOWN_SIDE_EFFECT.value,
            "reason": INCOMPLETE,
            "message": message[:1024],
            "fingerprint": failures.fingerprint(FailureClass.UNKNOWN_SIDE_EFFECT, message),
        },
        nextAttemptTime=None,
        **fields,
    )
    d.event("Warning", INCOMPLETE, text)
