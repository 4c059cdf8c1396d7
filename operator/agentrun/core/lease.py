"""Lease rules: the epoch a grant writes, and expiry judged on the operator's own clock.

Expiry never compares timestamps written on another machine: the operator notes when it first saw the
Lease at its current resourceVersion (a renewal changes it) and counts durationSeconds from there, as
client-go leader election does. After an operator restart the count starts again, which only errs on
the side of waiting longer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class LeaseView:
    holder: str | None
    epoch: int  # spec.leaseTransitions
    resource_version: str
    # No leaseDurationSeconds: the holder may write the Lease, so how long it lasts is taken from the
    # Run's spec.lease, which only its user writes.


def lease_view(lease: dict[str, Any]) -> LeaseView:
    spec = lease.get("spec") or {}
    return LeaseView(
        holder=spec.get("holderIdentity") or None,
        epoch=int(spec.get("leaseTransitions") or 0),
        resource_version=str(lease["metadata"]["resourceVersion"]),
    )


@dataclass(frozen=True)
class Sighting:
    """When (on a monotonic clock) this operator first saw the Lease at this resourceVersion."""

    resource_version: str
    seen_at: float


def sight(previous: Sighting | None, resource_version: str, now: float) -> Sighting:
    if previous is not None and previous.resource_version == resource_version:
        return previous
    return Sighting(resource_version, now)


def seconds_until_expiry(
    sighting: Sighting | None, duration_seconds: int, now: float, agent_started_at: float | None = None
) -> float | None:
    """Seconds left before the holder loses the Lease (<= 0: expired); None if never seen.

    The count starts again when the operator first saw the agent running (`agent_started_at`, same
    clock): a slow image pull or schedule must not use up the lease before the worker could renew it.
    """
    if sighting is None:
        return None
    since = max(sighting.seen_at, agent_started_at or sighting.seen_at)
    return since + duration_seconds - now


def epoch_for_grant(lease: LeaseView | None, holder: str, recorded: int = 0) -> tuple[int, bool]:
    """(epoch, write needed) for giving the Lease to `holder`; `recorded` is the Run's status.leaseEpoch.

    With no Lease the epoch after the recorded one is taken: a Run's first grant takes 1, and a grant
    after the Lease was deleted (a finished Run's compaction, then a manual retry) never goes back.

    A Lease already held by `holder` is the trace of an earlier grant interrupted before it finished
    (an operator restart): its epoch is adopted, never bumped again, so no epoch is skipped or reused.
    A revoked Lease (no holder) already carries a fresh epoch that no Attempt has used: it is given out.
    """
    if lease is None:
        return recorded + 1, True
    if lease.holder == holder:
        return lease.epoch, False
    if lease.holder is None:
        # Revoked (lease lost, deadline): the new epoch was taken then and nobody holds it yet.
        return lease.epoch, True
    return lease.epoch + 1, True
