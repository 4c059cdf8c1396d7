"""A finished Run's time to live (spec.ttlSecondsAfterFinished; docs/state-store.md, "Archives of
finished Runs"): when it expires, what keeps it, and the archive-then-delete it ends with.

The clock starts at the lastTransitionTime of the Succeeded condition the operator wrote when the Run
ended, so an operator restart never resets it. A NeedsReconciliation Run, or one with an open effect (a
SideEffect Pending or Unknown, a compensation under way or left incomplete) never expires. Without a
state store the Run is kept, and says so (Archived=False, NoStateStore).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, Final

from agentrun.api import TERMINAL_PHASES, ConditionStatus, RunConditionType
from agentrun.core import archive, compensation
from agentrun.core.plan import ArchiveRun, DeleteRun, PatchRunStatus
from agentrun.core.runs.stopping import abort_leftovers, refresh_report, settle_after_cancel
from agentrun.core.runs.transition import NOTHING, Transition, event, writes
from agentrun.core.runs.upkeep import upkeep
from agentrun.core.runs.world import World, rfc3339

NO_STATE_STORE: Final = "NoStateStore"
NO_STORE_MESSAGE: Final = (
    "the Run's time to live has passed, but the operator has no state store to archive it to: it is kept"
)


def ttl_seconds(world: World) -> int | None:
    """The Run's time to live after it finished: its own, else the operator's default; None: kept."""
    own = world.run.spec.ttl_seconds_after_finished
    if own is None:
        own = world.default_ttl_seconds
    return None if own is None or own < 0 else own


def finished_at(world: World) -> datetime | None:
    """When the Run ended: the lastTransitionTime of its Succeeded condition, once True or False."""
    for condition in world.run.status.conditions or []:
        if condition.type == RunConditionType.SUCCEEDED and condition.status != ConditionStatus.UNKNOWN:
            return condition.last_transition_time
    return None


def kept_open(world: World) -> bool:
    """Whether an effect of the Run is still open: a record Pending or Unknown, or a compensation under
    way or left incomplete. Such a Run waits for a person, and its records must stay."""
    return bool(compensation.to_settle(world.side_effects)) or world.run.status.compensating is not None


def lifetime_end(world: World) -> datetime | None:
    """When the finished Run's time to live runs out; None while it is kept (no time to live, not ended,
    or an effect still open)."""
    ttl, finished = ttl_seconds(world), finished_at(world)
    if world.run.status.phase not in TERMINAL_PHASES or ttl is None or finished is None:
        return None
    return None if kept_open(world) else finished + timedelta(seconds=ttl)


def expires_at(world: World) -> datetime | None:
    """When the finished Run is to be archived and deleted (status.expiresTime); None while it is kept,
    as it is without a state store."""
    return lifetime_end(world) if world.has_store else None


def expiry(world: World) -> Transition | None:
    """Succeeded, Failed or Cancelled with a time to live -> status.expiresTime kept current; at that
    time, once nothing else is left to write, the archive written and verified, then the Run deleted.
    Without a state store: kept, Archived=False (NoStateStore)."""
    status = world.run.status
    if world.run.metadata.deletion_timestamp is not None:
        return None
    at_rest = abort_leftovers(world).then(settle_after_cancel(world), refresh_report(world))
    if at_rest.steps or upkeep(world):
        return None  # the Stopped rule and the upkeep first: the archive is of a Run at rest
    end, due = lifetime_end(world), expires_at(world)
    patch: dict[str, Any] = {}
    if status.expires_time != due:
        patch["expiresTime"] = rfc3339(due) if due else None
    if end is not None and due is None and world.now >= end and not _said_no_store(world):
        patch["conditions"] = [*(c.to_api() for c in status.conditions or []), _no_store_condition(world)]
    if patch:
        return writes(PatchRunStatus(patch)).then(at_rest)
    if end is None or (due is None and world.now >= end):
        return None
    if world.now < end:
        return NOTHING.wake_in((end - world.now).total_seconds()).then(at_rest)
    return _archive_then_delete(world, end)


def _archive_then_delete(world: World, due: datetime) -> Transition:
    run = world.run
    summary = archive.run_summary(world, finished_at(world))
    message = f"archived to the state store (time to live passed at {rfc3339(due)}): deleting the Run"
    return writes(ArchiveRun(archive.archive_document(world), summary)).then(
        event("Normal", "Archived", message),
        writes(DeleteRun(str(run.metadata.uid), str(run.metadata.resource_version))),
    )


def _said_no_store(world: World) -> bool:
    return any(
        c.type == RunConditionType.ARCHIVED and c.reason == NO_STATE_STORE
        for c in world.run.status.conditions or []
    )


def _no_store_condition(world: World) -> dict[str, Any]:
    return {
        "type": RunConditionType.ARCHIVED.value,
        "status": ConditionStatus.FALSE.value,
        "reason": NO_STATE_STORE,
        "message": NO_STORE_MESSAGE,
        "observedGeneration": world.run.metadata.generation,
        "lastTransitionTime": rfc3339(world.now),
    }
