"""Which Checkpoints to prune: the oldest State checkpoints beyond the retention count, never one still
pointed at; and the Writes and Journal entries whose parent State checkpoint is pruned or gone."""

from __future__ import annotations

from collections.abc import Iterable

from agentrun.api import Attempt, Checkpoint, CheckpointKind, Run


def prunable(run: Run, checkpoints: Iterable[Checkpoint], attempts: Iterable[Attempt]) -> list[str]:
    keep = run.spec.checkpoint_retention
    every = list(checkpoints)
    states = [c for c in every if c.spec.kind == CheckpointKind.STATE]
    ordered = sorted(states, key=lambda c: c.spec.sequence, reverse=True)
    protected = {run.status.latest_checkpoint}
    if run.status.pending_request:
        protected.add(run.status.pending_request.checkpoint_id)
    protected |= {a.spec.resume_from for a in attempts if a.spec.resume_from}
    pruned = [c for c in ordered[keep:] if c.spec.id not in protected]
    kept = {c.spec.id for c in states} - {c.spec.id for c in pruned}
    # An entry lives as long as its parent: one whose parent is pruned (or gone) goes too.
    entries = [
        c
        for c in every
        if c.spec.kind != CheckpointKind.STATE and c.spec.parent is not None and c.spec.parent not in kept
    ]
    return [str(c.metadata.name) for c in (*pruned, *entries)]
