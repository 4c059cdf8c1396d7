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


def conditions_for(
    phase: RunPhase,
    reason: str,
    message: str,
    *,
    generation: int | None,
    previous: list[Condition] | None,
    now: datetime,
) -> list[dict[str, Any]]:
    """Succeeded, Waiting, CancelRequested and LeaseHeld for `phase`; lastTransitionTime moves only
    when a condition's status changes."""
    facts = {
        "Succeeded": _succeeded(phase, reason),
        "Waiting": ("True", phase.value) if phase in WAITING_PHASES else ("False", "NotWaiting"),
        "CancelRequested": ("True", phase.value)
        if phase in (RunPhase.CANCEL_REQUESTED, RunPhase.CANCELLED)
        else ("False", "NotRequested"),
        "LeaseHeld": ("True", "AttemptRunning")
        if phase == RunPhase.RUNNING
        else ("False", "NoActiveAttempt"),
    }
    before = {c.type: c for c in previous or []}
    out = []
    for kind, (status, why) in facts.items():
        old = before.get(kind)
        since = old.last_transition_time if old and old.status.value == status else now
        out.append(
            {
                "type": kind,
                "status": status,
                "reason": why,
                "message": message[:1024],
                "observedGeneration": generation,
                "lastTransitionTime": since.strftime("%Y-%m-%dT%H:%M:%SZ"),
            }
        )
    return out
