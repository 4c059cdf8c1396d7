"""Intended writes: what the state machine asks the I/O layer to do, in order."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

JsonDict = dict[str, Any]


@dataclass(frozen=True)
class PatchRunStatus:
    """A merge patch of Run.status, sent with the resourceVersion the decision was made on."""

    patch: JsonDict


@dataclass(frozen=True)
class WriteLease:
    """Create the Run's Lease (expected_resource_version None) or update it, preconditioned.

    epoch is written as leaseTransitions: every change of holder is a new epoch.
    """

    holder: str | None
    epoch: int
    duration_seconds: int
    expected_resource_version: str | None


@dataclass(frozen=True)
class CreateAttempt:
    body: JsonDict


@dataclass(frozen=True)
class PatchAttemptStatus:
    """A merge patch of Attempt.status; with the resourceVersion the decision saw, when it saw one, so that
    a decision made on a stale view of the Attempt never rewrites how it ended."""

    name: str
    patch: JsonDict
    expected_resource_version: str | None = None


@dataclass(frozen=True)
class PatchSideEffectStatus:
    """A merge patch of SideEffect.status by the operator (an approval it records, a cancelled Run's
    in-flight record it marks Unknown), preconditioned on resource_version when given."""

    name: str
    patch: JsonDict
    resource_version: str | None = None


@dataclass(frozen=True)
class CreatePod:
    body: JsonDict


@dataclass(frozen=True)
class DeletePod:
    name: str
    grace_seconds: int | None = None


@dataclass(frozen=True)
class DeleteCheckpoint:
    name: str


@dataclass(frozen=True)
class RecordEvent:
    type: Literal["Normal", "Warning"]
    reason: str
    message: str
    attempt: str | None = None  # the Attempt the event is about; the Run otherwise


Action = (
    PatchRunStatus
    | WriteLease
    | CreateAttempt
    | PatchAttemptStatus
    | PatchSideEffectStatus
    | CreatePod
    | DeletePod
    | DeleteCheckpoint
    | RecordEvent
)


@dataclass
class Plan:
    """Writes to make in order (stop at the first that fails), and when to look at the Run again."""

    actions: list[Action] = field(default_factory=list)
    requeue_after: float | None = None
    # When the current holder's Lease runs out unless renewed first. Unlike requeue_after, the I/O layer
    # looks at the Run again then only if the Lease was not renewed meanwhile (else it waits for the new
    # expiry): a healthy worker's renewals cost no reconcile and no read of the Run.
    lease_expires_in: float | None = None

    def add(self, *actions: Action) -> Plan:
        self.actions.extend(actions)
        return self

    def wake_in(self, seconds: float) -> Plan:
        seconds = max(seconds, 0.0)
        self.requeue_after = seconds if self.requeue_after is None else min(self.requeue_after, seconds)
        return self

    def wake_at_lease_expiry(self, seconds: float) -> Plan:
        self.lease_expires_in = max(seconds, 0.0)
        return self

    def of(self, kind: type[Action]) -> list[Action]:
        return [a for a in self.actions if isinstance(a, kind)]
