"""After an Attempt failed: back off and retry, stop for a person to reconcile, or fail the Run."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from agentrun.api import AttemptFailure, AttemptPhase, FailureClass, RunPhase, attempt_name
from agentrun.core import ledger
from agentrun.core.retry import RetryDecision, decide_retry
from agentrun.core.runs.builder import Builder
from agentrun.core.runs.world import rfc3339


def after_failure(
    b: Builder, number: int, failure: AttemptFailure, phase: AttemptPhase, **fields: Any
) -> None:
    """The current Attempt `number` failed (and ended in `phase`): what the Run does next."""
    name = attempt_name(str(b.run.metadata.name), number)
    b.event("Warning", "AttemptFailed", f"{failure.failure_class}: {failure.message}", name)
    if failure.failure_class == FailureClass.UNKNOWN_SIDE_EFFECT:
        _needs_reconciliation(b, failure, **fields)
        return
    history = [*(b.w.failure_of(n) for n in range(1, number)), failure]
    decision = decide_retry(
        b.run.spec.retry, b.attempts_in_series(number), history, seed=str(b.run.metadata.uid)
    )
    if decision.retry:
        _back_off(b, number, failure, phase, decision, **fields)
    else:
        _fail(b, failure, decision, **fields)


def _failure(failure: AttemptFailure, reason: str) -> dict[str, Any]:
    return {
        "class": failure.failure_class.value,
        "reason": reason,
        "message": (failure.message or "")[:1024],
        "fingerprint": failure.fingerprint,
    }


def _needs_reconciliation(b: Builder, failure: AttemptFailure, **fields: Any) -> None:
    """Never retried automatically: a retry could repeat an action that may have happened. The reason is
    the SDK's (MaxSendsReached, ...), else read from the records (a crash)."""
    reason = failure.reason or ledger.unknown_reason(b.w.side_effects).value
    message = f"{failure.message}; resolve the SideEffect, then ask for a retry (spec.retryRequest)"
    b.set_phase(RunPhase.NEEDS_RECONCILIATION, reason, message, failure=_failure(failure, reason), **fields)
    b.event("Warning", "NeedsReconciliation", message)


def _back_off(
    b: Builder,
    number: int,
    failure: AttemptFailure,
    phase: AttemptPhase,
    decision: RetryDecision,
    **fields: Any,
) -> None:
    at = b.w.now + timedelta(seconds=decision.delay_seconds)
    if at.microsecond:  # status holds whole seconds: round up, so the retry never starts early
        at = at.replace(microsecond=0) + timedelta(seconds=1)
    b.set_phase(
        RunPhase.RETRY_BACKOFF,
        "RetryScheduled",
        f"Attempt {number} ended {phase.value} ({failure.failure_class}: {failure.message}); "
        f"Attempt {number + 1} starts at {rfc3339(at)}",
        nextAttemptTime=rfc3339(at),
        **fields,
    )
    b.event("Normal", "RetryScheduled", decision.message)
    b.plan.wake_in((at - b.w.now).total_seconds())


def _fail(b: Builder, failure: AttemptFailure, decision: RetryDecision, **fields: Any) -> None:
    stop_reason = failure.reason or decision.reason  # the SDK's (IdempotencyKeyReused) is more precise
    b.set_phase(
        RunPhase.FAILED,
        stop_reason,
        f"{decision.message}; last failure: {failure.message}",
        failure=_failure(failure, stop_reason),
        **fields,
    )
    b.event("Warning", decision.reason, decision.message)
