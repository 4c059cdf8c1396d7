"""Writes a reconcile makes whatever the transition: records the Run's own bookkeeping keeps in step."""

from __future__ import annotations

from agentrun.api import AttemptPhase
from agentrun.api.usage import Usage, usage_sum
from agentrun.core import ledger, retention
from agentrun.core.plan import (
    Action,
    DeleteCheckpoint,
    PatchAttemptStatus,
    PatchRunStatus,
    PatchSideEffectStatus,
)
from agentrun.core.runs.world import World, rfc3339


def upkeep(world: World) -> tuple[Action, ...]:
    """Approvals to record on their SideEffects, Checkpoints past retention, the Run's usage sum."""
    writes: list[Action] = []
    for effect, approval in ledger.approvals_to_record(
        world.side_effects, world.attempts.values(), rfc3339(world.now), world.run.status.inputs
    ):
        writes.append(PatchSideEffectStatus(effect, {"approval": approval}))
    for name in retention.prunable(world.run, world.checkpoints, world.attempts.values()):
        writes.append(DeleteCheckpoint(name))
    # Run.status.usage is the sum of its Attempts' (failed ones included), written when it changed: an
    # Attempt's Pod writes its usage every few seconds at most, so this is no write per model call.
    total = usage_sum([a.status.usage for a in world.attempts.values()])
    if total != (world.run.status.usage or Usage()):
        writes.append(PatchRunStatus({"usage": total.to_status()}))
    return tuple(writes)


def rejections(world: World) -> tuple[Action, ...]:
    """Attempts whose worker recorded a refused commit (rejectedCommit, the one thing it may write on its
    Attempt besides usage), marked Rejected by the operator."""
    writes: list[Action] = []
    for attempt in world.attempts.values():
        if attempt.status.rejected_commit is None or attempt.status.phase in (
            AttemptPhase.REJECTED,
            AttemptPhase.SUCCEEDED,
        ):
            continue
        patch: dict[str, str] = {"phase": AttemptPhase.REJECTED.value}
        if attempt.status.completion_time is None:
            patch["completionTime"] = rfc3339(world.now)
        name = str(attempt.metadata.name)
        writes.append(PatchAttemptStatus(name, patch, attempt.metadata.resource_version))
    return tuple(writes)
