"""After an Attempt failed: back off and retry, stop for a person to reconcile, or fail the Run."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from agentrun.api import (
    AGENT_SDK_TOO_OLD,
    STATE_UNVERIFIABLE,
    AttemptFailure,
    AttemptPhase,
    FailureClass,
    RunPhase,
    attempt_name,
)
from agentrun.core import ledger
from agentrun.core.retry import RetryDecision, decide_retry
from agentrun.core.runs.grants import attempts_in_series
from agentrun.core.runs.transition import Transition, event, set_phase, wake_in
from agentrun.core.runs.world import World, rfc3339


def after_failure(
    w: World, number: int, failure: AttemptFailure, phase: AttemptPhase, **fields: Any
) -> Transition:
    """The current Attempt `number` failed (and ended in `phase`): what the Run does next."""
    run = w.run
    name = attempt_name(str(run.metadata.name), number)
    failed = event("Warning", "AttemptFailed", f"{failure.failure_class}: {failure.message}", name)
    if failure.failure_class == FailureClass.UNKNOWN_SIDE_EFFECT:
        return failed.then(_needs_reconciliation(w, failure, **fields))
    if failure.reason == STATE_UNVERIFIABLE:
        return failed.then(_state_unverifiable(failure, **fields))
    if failure.reason == AGENT_SDK_TOO_OLD:
        return failed.then(_sdk_too_old(failure, **fields))
    history = [*(w.failure_of(n) for n in range(1, number)), failure]
    decision = decide_retry(
        run.spec.retry, attempts_in_series(w, number), history, seed=str(run.metadata.uid)
    )
    if decision.retry:
        return failed.then(_back_off(w, number, failure, phase, decision, **fields))
    return failed.then(_fail(failure, decision, **fields))


def _failure(failure: AttemptFailure, reason: str) -> dict[str, Any]:
    return {
        "class": failure.failure_class.value,
        "reason": reason,
        "message": (failure.message or "")[:1024],
        "fingerprint": failure.fingerprint,
    }


def _needs_reconciliation(w: World, failure: AttemptFailure, **fields: Any) -> Transition:
    """Never retried automatically: a retry could repeat an action that may have happened. The reason is
    the SDK's (MaxSendsReached, ...), else read from the records (a crash)."""
    reason = failure.reason or ledger.unknown_reason(w.side_effects).value
    message = f"{failure.message}; resolve the SideEffect, then ask for a retry (spec.retryRequest)"
    return set_phase(
        RunPhase.NEEDS_RECONCILIATION, reason, message, failure=_failure(failure, reason), **fields
    ).then(event("Warning", "NeedsReconciliation", message))


def _state_unverifiable(failure: AttemptFailure, **fields: Any) -> Transition:
    """A saved state that cannot be read back and verified: the Run never continues from less than it
    saved, so no retry policy applies; the operator restores an overwritten blob when the store kept it
    (core.blobrestore), and a person retries, from this checkpoint or an earlier one."""
    message = (
        f"{failure.message}; the Run does not continue from a state it cannot verify: the operator restores "
        "an overwritten blob from the version the store kept (condition StateRestored says whether it "
        "could), then retry from this checkpoint; or retry from an earlier one "
        "(spec.retryRequest.fromCheckpoint)"
    )
    return set_phase(
        RunPhase.NEEDS_RECONCILIATION,
        STATE_UNVERIFIABLE,
        message,
        failure=_failure(failure, STATE_UNVERIFIABLE),
        **fields,
    ).then(event("Warning", "NeedsReconciliation", message))


def _sdk_too_old(failure: AttemptFailure, **fields: Any) -> Transition:
    """An image whose SDK predates the state store was given a Run whose state may be there: it stopped
    before it read anything; the same image would stop again, so no retry policy applies."""
    message = (
        f"{failure.message}; set spec.agent to an image whose SDK reads the state store (agentrun-k8s with "
        "the state store), then ask for a retry (spec.retryRequest)"
    )
    return set_phase(
        RunPhase.NEEDS_RECONCILIATION,
        AGENT_SDK_TOO_OLD,
        message,
        failure=_failure(failure, AGENT_SDK_TOO_OLD),
        **fields,
    ).then(event("Warning", "NeedsReconciliation", message))


def _back_off(
    w: World,
    number: int,
    failure: AttemptFailure,
    phase: AttemptPhase,
    decision: RetryDecision,
    **fields: Any,
) -> Transition:
    at = w.now + timedelta(seconds=decision.delay_seconds)
    if at.microsecond:  # status holds whole seconds: round up, so the retry never starts early
        at = at.replace(microsecond=0) + timedelta(seconds=1)
    return set_phase(
        RunPhase.RETRY_BACKOFF,
        "RetryScheduled",
        f"Attempt {number} ended {phase.value} ({failure.failure_class}: {failure.message}); "
        f"Attempt {number + 1} starts at {rfc3339(at)}",
        nextAttemptTime=rfc3339(at),
        **fields,
    ).then(event("Normal", "RetryScheduled", decision.message), wake_in((at - w.now).total_seconds()))


def _fail(failure: AttemptFailure, decision: RetryDecision, **fields: Any) -> Transition:
    stop_reason = failure.reason or decision.reason  # the SDK's (IdempotencyKeyReused) is more precise
    return set_phase(
        RunPhase.FAILED,
        stop_reason,
        f"{decision.message}; last failure: {failure.message}",
        failure=_failure(failure, stop_reason),
        **fields,
    ).then(event("Warning", decision.reason, decision.message))
