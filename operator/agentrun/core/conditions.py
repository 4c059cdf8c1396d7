"""Run conditions, derived from the phase so the two can never disagree."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from agentrun.api import WAITING_PHASES, Condition, RunPhase


def _succeeded(phase: RunPhase, reason: str) -> tuple[str, str]:
    if phase == RunPhase.SUCCEEDED:
        return "True", "Succeeded"
    if phase in (RunPhase.FAILED, RunPhase.CANCELLED, RunPhase.NEEDS_RECONCILIATION):
        return "False", reason
    return "Unknown", phase.value


def _lease_held(phase: RunPhase, between_attempts: bool) -> tuple[str, str]:
    """An Attempt holds the Run's lease while it runs, while it stops after a cancel (its Pod is still
    there), and while a compensation Attempt runs (not in the backoff between two of them)."""
    if phase == RunPhase.RUNNING:
        return "True", "AttemptRunning"
    if phase == RunPhase.CANCEL_REQUESTED:
        return "True", "AttemptStopping"
    if phase == RunPhase.COMPENSATING and not between_attempts:
        return "True", "CompensationRunning"
    return "False", "NoActiveAttempt"


def message_carrier(phase: RunPhase) -> str:
    """The one condition a phase change's message belongs to (the others say only their reason): the
    request a Run waits on (Waiting), the cancel being carried out (CancelRequested), the Attempt that
    runs (LeaseHeld); otherwise how the Run stands or ended (Succeeded: a failure's message is there).
    """
    if phase in WAITING_PHASES:
        return "Waiting"
    if phase == RunPhase.CANCEL_REQUESTED:
        return "CancelRequested"
    if phase == RunPhase.RUNNING:
        return "LeaseHeld"
    return "Succeeded"


def conditions_for(
    phase: RunPhase,
    reason: str,
    message: str,
    *,
    generation: int | None,
    previous: list[Condition] | None,
    now: datetime,
    between_attempts: bool = False,
) -> list[dict[str, Any]]:
    """Succeeded, Waiting, CancelRequested and LeaseHeld for `phase` (`between_attempts`: a next Attempt
    is due at status.nextAttemptTime); lastTransitionTime moves only when a condition's status changes.
    `message` is written on one condition only (message_carrier)."""
    facts = {
        "Succeeded": _succeeded(phase, reason),
        "Waiting": ("True", phase.value) if phase in WAITING_PHASES else ("False", "NotWaiting"),
        "CancelRequested": ("True", phase.value)
        if phase in (RunPhase.CANCEL_REQUESTED, RunPhase.CANCELLED)
        else ("False", "NotRequested"),
        "LeaseHeld": _lease_held(phase, between_attempts),
    }
    before = {c.type: c for c in previous or []}
    carrier = message_carrier(phase)
    out = []
    for kind, (status, why) in facts.items():
        old = before.get(kind)
        since = old.last_transition_time if old and old.status.value == status else now
        out.append(
            {
                "type": kind,
                "status": status,
                "reason": why,
                "message": message[:1024] if kind == carrier else "",
                "observedGeneration": generation,
                "lastTransitionTime": since.strftime("%Y-%m-%dT%H:%M:%SZ"),
            }
        )
    return out
